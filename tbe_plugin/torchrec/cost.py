"""What a sharding plan costs each rank, from measured feature statistics: the imbalance report.

A plan is reduced to ``PlacedShard`` s (table, sharding type, rank, rows and columns), from
TorchRec's ``ShardingPlan`` or the planner's ``ShardingOption`` s, and saved as JSON. For
each shard, ``CostModel.shard_cost`` counts, per global batch (every rank's bags):

- lookups: the table's pooling factor times the global bags times the share of its
  lookups in the shard's rows (``TableStatistics.lookup_share``: hot rows included);
- lookup bytes (forward): the rows read, the ids, and the pooled output of every bag;
- update bytes (fused backward): the output gradient, each distinct row and its
  optimizer state read and written, the ids and their sort -- the byte counts of
  ``tbe_plugin.benchmarks.backward``, so that the kernel speeds it measures apply;
- all-to-all bytes: the ids coming in, the pooled outputs going out and their gradients
  coming back (row-split shards reduce their partial sums within the host).

Time is bytes over the kernel's measured forward and backward speeds (``KernelSpeed``,
read from a benchmark's JSON) plus all-to-all bytes over the topology's bandwidths. A
rank's cost is the sum of its shards'; ``imbalance_report`` gives every rank's cost, the
max/mean ratio, the tables that make the hottest rank and the predicted step time (the
hottest rank's embedding time: dense work and overlap are not counted).

Needs TorchRec's plan types only (no process group); ``tbe_plugin.torchrec.partition``
and ``pipelines`` import it.
"""

import dataclasses
import json
import os
import statistics as pystatistics
from typing import Any, Dict, Iterable, List, Sequence

from tbe_plugin.torchrec.stats import FeatureStatistics, TableStatistics

ROW_SPLIT_TYPES = ("row_wise", "table_row_wise", "grid_shard")
"""Sharding types whose shards hold a range of rows (and serve only those rows' lookups)."""
HOST_REDUCED_TYPES = ("table_row_wise", "grid_shard")
"""Row-split types whose partial sums are reduced within one host."""
INDEX_BYTES = 8
"""Bytes per id (int64), in the kernels and the input all-to-all."""
GRADIENT_BYTES = 4
"""Bytes per element of the output gradient (fp32)."""
SORT_BYTES_PER_LOOKUP = 16
"""The backward's sort: a 32-bit key and position written and read per lookup (the benchmark's count)."""
ROWWISE_STATE_BYTES = 4
"""Optimizer state per row of rowwise Adagrad (one fp32)."""
RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")


@dataclasses.dataclass(frozen=True)
class PlacedShard:
    """One shard of a plan: where it lives and which part of its table it holds."""

    table: str
    sharding_type: str
    rank: int
    first_row: int
    rows: int
    first_col: int
    cols: int


def shards_of_plan(plan: Any) -> List[PlacedShard]:
    """The shards of a TorchRec ``ShardingPlan`` (every module's) or of one module's
    ``{table: ParameterSharding}``."""
    modules = plan.plan.values() if hasattr(plan, "plan") else [plan]
    shards = []
    for module_plan in modules:
        for table, sharding in module_plan.items():
            spec = sharding.sharding_spec
            if spec is None or not hasattr(spec, "shards"):
                raise ValueError(f"table {table}: {sharding.sharding_type} plan has no shard metadata "
                                 "(data-parallel tables are not sharded)")  # fmt: skip
            for meta in spec.shards:
                (r0, c0), (n, m) = meta.shard_offsets, meta.shard_sizes
                shards.append(PlacedShard(table, sharding.sharding_type, meta.placement.rank(), r0, n, c0, m))
    return shards


def shards_of_options(options: Iterable[Any]) -> List[PlacedShard]:
    """The shards of the planner's chosen ``ShardingOption`` s (ranks assigned)."""
    return [PlacedShard(o.name, o.sharding_type, int(s.rank), s.offset[0], s.size[0], s.offset[1], s.size[1])
            for o in options for s in o.shards]  # fmt: skip


def save_shards(shards: Sequence[PlacedShard], path: str, **metadata: Any) -> None:
    with open(path, "w") as f:
        json.dump({"metadata": metadata, "shards": [dataclasses.asdict(s) for s in shards]}, f, indent=1)


def load_shards(path: str) -> List[PlacedShard]:
    with open(path) as f:
        values = json.load(f)
    if "shards" not in values:
        raise ValueError(f"{path}: not a plan file (no 'shards'; write one with save_shards)")
    return [PlacedShard(**s) for s in values["shards"]]


@dataclasses.dataclass(frozen=True)
class KernelSpeed:
    """The embedding kernel's measured speed, in bytes per second of the benchmark's count."""

    forward_bytes_per_s: float
    """Forward (lookup) bytes per second."""
    backward_bytes_per_s: float
    """Fused backward (update) bytes per second."""
    source: str
    """Where the numbers were measured (file, provider, commit, device)."""

    def __post_init__(self) -> None:
        if not (self.forward_bytes_per_s > 0 and self.backward_bytes_per_s > 0):
            raise ValueError(f"kernel speeds must be > 0, got {self.forward_bytes_per_s}, {self.backward_bytes_per_s}")

    @classmethod
    def from_benchmark(cls, path: str, provider: str = "ours") -> "KernelSpeed":
        """The median forward and backward TB/s over the configs of a
        ``tbe_plugin.benchmarks.backward`` JSON (``provider``: ``ours`` or ``fbgemm``)."""
        with open(path) as f:
            report = json.load(f)
        speeds: Dict[str, List[float]] = {"fwd": [], "bwd": []}
        for entry in report.get("entries", []):
            result = entry.get("providers", {}).get(provider, {})
            if result.get("status") != "ok":
                continue
            for mode in speeds:
                tbps = result.get("modes", {}).get(mode, {}).get("tbps")
                if tbps:
                    speeds[mode].append(tbps * 1e12)
        environment = report.get("environment", {})
        if not speeds["fwd"] or not speeds["bwd"]:
            raise ValueError(f"{path}: no {provider!r} forward and backward speeds (a tbe_plugin.benchmarks.backward "
                             "JSON is needed)")  # fmt: skip
        commit = environment.get("git_commit") or report.get("git_commit", "unknown commit")
        source = (f"{os.path.relpath(path, os.path.dirname(RESULTS_DIR))} ({provider}, median of "
                  f"{len(speeds['bwd'])} configs, {environment.get('device_name', '?')}, {commit})")  # fmt: skip
        return cls(pystatistics.median(speeds["fwd"]), pystatistics.median(speeds["bwd"]), source)


KERNEL_BENCHMARK = "backward_h200_cd7e699.json"
"""The backward suite measured on an H200 at cd7e699 (the default kernels of 692138f and 0af9a91: the pieces
backward with runs of up to 16 ids in a launch of their own, for every optimizer, tiles up to 256 columns; graphs in
place with their inputs filled in the graph up to 2**20 ids; the lean warp-a-bag forward, FLAT 4, for bags of 13 ids
and more, per-sample weights and bf16 rows included; 22 configs, ctr-dlrm among them; results/NOTES_2026-12-05.md)."""


def default_kernel_benchmark() -> str:
    """The path of ``KERNEL_BENCHMARK`` (the kernel speeds plans are priced with by default)."""
    path = os.path.join(RESULTS_DIR, KERNEL_BENCHMARK)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: give a tbe_plugin.benchmarks.backward JSON explicitly")
    return path


@dataclasses.dataclass(frozen=True)
class ShardCost:
    """One shard's work per global batch."""

    lookups: float
    lookup_bytes: float
    update_bytes: float
    comm_bytes: float
    forward_s: float
    """Forward kernel time (lookup bytes at the measured forward speed)."""
    backward_s: float
    """Fused backward time (update bytes at the measured backward speed)."""
    comm_s: float
    """All-to-all time (forward and backward together)."""

    @property
    def seconds(self) -> float:
        return self.forward_s + self.backward_s + self.comm_s


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Prices shards from statistics on a topology (module docstring)."""

    kernel: KernelSpeed
    """The kernel's measured speeds."""
    world_size: int
    """Ranks of the plan."""
    local_world_size: int
    """Ranks per host."""
    rank_batch_size: int
    """Bags per feature in one rank's batch; the global batch is world_size times it."""
    intra_host_bytes_per_s: float
    """All-to-all bandwidth within a host."""
    inter_host_bytes_per_s: float
    """All-to-all bandwidth across hosts."""
    output_bytes: int = 4
    """Bytes per pooled output element (fp32)."""
    state_bytes_per_row: int = ROWWISE_STATE_BYTES
    """Optimizer state bytes per row (rowwise Adagrad: 4; SGD: 0; elementwise: 4 x dim)."""

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.local_world_size < 1 or self.rank_batch_size < 1:
            raise ValueError(f"world_size, local_world_size and rank_batch_size must be >= 1, got "
                             f"{self.world_size}, {self.local_world_size}, {self.rank_batch_size}")  # fmt: skip
        if not (self.intra_host_bytes_per_s > 0 and self.inter_host_bytes_per_s > 0):
            raise ValueError("all-to-all bandwidths must be > 0")

    @classmethod
    def from_topology(cls, topology: Any, kernel: KernelSpeed, rank_batch_size: int, **kwargs: Any) -> "CostModel":
        """Bandwidths from a TorchRec ``Topology`` (which gives them in bytes per ms)."""
        return cls(kernel, topology.world_size, topology.local_world_size, rank_batch_size,
                   topology.intra_host_bw * 1e3, topology.inter_host_bw * 1e3, **kwargs)  # fmt: skip

    @property
    def global_batch(self) -> int:
        return self.rank_batch_size * self.world_size

    def shard_cost(self, table: TableStatistics, sharding_type: str, first_row: int, rows: int, cols: int) -> ShardCost:
        """The work of a shard holding rows ``[first_row, first_row + rows)`` and ``cols``
        columns of ``table`` (module docstring)."""
        bags = float(self.global_batch)
        share = 1.0 if sharding_type not in ROW_SPLIT_TYPES else table.lookup_share(first_row, first_row + rows)
        lookups = table.mean_pooling * bags * share
        distinct = table.distinct_fraction * lookups  # at most world size x a rank batch's distinct fraction
        weight = table.weight_bytes
        lookup_bytes = lookups * (cols * weight + INDEX_BYTES) + bags * cols * self.output_bytes
        update_bytes = (bags * cols * GRADIENT_BYTES + distinct * 2 * (cols * weight + self.state_bytes_per_row)
                        + lookups * (INDEX_BYTES + SORT_BYTES_PER_LOOKUP))  # fmt: skip
        ids_bytes, output_bytes = lookups * INDEX_BYTES, 2 * bags * cols * self.output_bytes
        multi_host = self.world_size > self.local_world_size
        across = self.inter_host_bytes_per_s if multi_host else self.intra_host_bytes_per_s
        if sharding_type in HOST_REDUCED_TYPES:
            # Partial sums are reduce-scattered within the host; each rank then sends its
            # 1/local_world_size of the outputs (and takes their gradients) across hosts.
            cross = output_bytes / self.local_world_size if multi_host else 0.0
            comm_s = ids_bytes / across + output_bytes / self.intra_host_bytes_per_s + cross / across
            output_bytes += cross
        else:
            comm_s = (ids_bytes + output_bytes) / across
        return ShardCost(lookups, lookup_bytes, update_bytes, ids_bytes + output_bytes,
                         lookup_bytes / self.kernel.forward_bytes_per_s, update_bytes / self.kernel.backward_bytes_per_s,
                         comm_s)  # fmt: skip


@dataclasses.dataclass
class RankCost:
    """Everything one rank does per global batch."""

    rank: int
    lookups: float = 0.0
    lookup_bytes: float = 0.0
    update_bytes: float = 0.0
    comm_bytes: float = 0.0
    seconds: float = 0.0
    shards: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    """Its shards: table, sharding type, rows, seconds, lookups."""


@dataclasses.dataclass
class ImbalanceReport:
    """Per-rank costs of a plan and what they add up to."""

    ranks: List[RankCost]
    max_over_mean: float
    """The hottest rank's cost over the mean rank's (1.0: balanced)."""
    hottest_rank: int
    predicted_step_ms: float
    """The hottest rank's embedding time per step (lookups, updates, all-to-alls)."""
    kernel_source: str

    def hottest_tables(self, count: int = 3) -> List[Dict[str, Any]]:
        """The shards that make the hottest rank, costliest first, with their share of it."""
        rank = self.ranks[self.hottest_rank]
        shards = sorted(rank.shards, key=lambda s: -s["seconds"])[:count]
        return [dict(s, share_of_rank=s["seconds"] / rank.seconds if rank.seconds else 0.0) for s in shards]

    def line(self, plan_name: str = "plan") -> str:
        """One log line: the ratio, the hottest rank and its tables, the predicted step."""
        tables = ", ".join(f"{s['table']} {_SHORT.get(s['sharding_type'], s['sharding_type'])} "
                           f"{s['share_of_rank']:.0%}" for s in self.hottest_tables())  # fmt: skip
        return (f"imbalance {plan_name}: max/mean {self.max_over_mean:.2f}, hottest rank {self.hottest_rank} of "
                f"{len(self.ranks)} ({tables}), predicted embedding step {self.predicted_step_ms:.4g} ms")

    def to_dict(self) -> Dict[str, Any]:
        return {"max_over_mean": self.max_over_mean, "hottest_rank": self.hottest_rank,
                "predicted_step_ms": self.predicted_step_ms, "kernel_source": self.kernel_source,
                "hottest_tables": self.hottest_tables(),
                "ranks": [dataclasses.asdict(r) for r in self.ranks]}  # fmt: skip

    def to_markdown(self, plan_name: str = "plan") -> str:
        lines = [f"## {plan_name}", "", self.line(plan_name), "", f"Kernel speeds: {self.kernel_source}.", "",
                 "| rank | lookups/step | lookup MB | update MB | all-to-all MB | ms | shards |",
                 "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in self.ranks:
            lines.append(f"| {r.rank} | {r.lookups:.0f} | {r.lookup_bytes / 1e6:.2f} | {r.update_bytes / 1e6:.2f} | "
                         f"{r.comm_bytes / 1e6:.2f} | {r.seconds * 1e3:.3f} | {len(r.shards)} |")  # fmt: skip
        return "\n".join(lines) + "\n"


_SHORT = {"table_wise": "tw", "row_wise": "rw", "column_wise": "cw", "table_row_wise": "twrw",
          "table_column_wise": "twcw", "grid_shard": "grid", "data_parallel": "dp"}  # fmt: skip


def imbalance_report(shards: Sequence[PlacedShard], statistics: FeatureStatistics, model: CostModel) -> ImbalanceReport:
    """Each rank's cost under ``model`` for the plan ``shards`` and the measured ``statistics``."""
    by_name = {t.name: t for t in statistics.tables}
    missing = sorted({s.table for s in shards} - by_name.keys())
    if missing:
        raise ValueError(f"the plan has tables without statistics: {missing[:5]}")
    ranks = [RankCost(r) for r in range(model.world_size)]
    for shard in shards:
        if not 0 <= shard.rank < model.world_size:
            raise ValueError(f"table {shard.table}: shard on rank {shard.rank}, world size {model.world_size}")
        cost = model.shard_cost(by_name[shard.table], shard.sharding_type, shard.first_row, shard.rows, shard.cols)
        rank = ranks[shard.rank]
        rank.lookups += cost.lookups
        rank.lookup_bytes += cost.lookup_bytes
        rank.update_bytes += cost.update_bytes
        rank.comm_bytes += cost.comm_bytes
        rank.seconds += cost.seconds
        rank.shards.append({"table": shard.table, "sharding_type": shard.sharding_type,
                            "rows": [shard.first_row, shard.first_row + shard.rows],
                            "cols": [shard.first_col, shard.first_col + shard.cols],
                            "lookups": cost.lookups, "seconds": cost.seconds})  # fmt: skip
    seconds = [r.seconds for r in ranks]
    mean = sum(seconds) / len(seconds)
    hottest = max(range(len(ranks)), key=lambda r: seconds[r])
    return ImbalanceReport(ranks, seconds[hottest] / mean if mean > 0 else 1.0, hottest, seconds[hottest] * 1e3,
                           model.kernel.source)  # fmt: skip


def rank_lookups(report: ImbalanceReport) -> List[float]:
    """Predicted lookups per global batch on each rank (what a rank's kernels receive)."""
    return [r.lookups for r in report.ranks]
