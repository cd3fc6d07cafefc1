"""Sharding plans from what the data does: presets, a statistics-driven planner, feedback.

Presets (``PRESETS``) fix the sharding types TorchRec's planner may choose per table:
``table_wise``, ``row_wise``, ``column_wise``, ``table_row_wise``, ``grid`` (one type
each), ``hybrid`` (all of them, from TorchRec's static guesses: pooling factor 1, ids
uniform) and ``balanced`` (all of them, planned from measured ``FeatureStatistics``).

The planner is TorchRec's own ``EmbeddingShardingPlanner`` (enumerator, storage
estimator, greedy proposer, greedy partitioner placing the costliest options first) with
one change: the shards' perf comes from ``StatisticsPerfEstimator``, which prices each
shard with ``tbe_plugin.torchrec.cost.CostModel`` -- measured pooling factors and hot
rows, the kernel's measured speed -- instead of TorchRec's estimator (uniform ids, a
bandwidth constant per kernel). The constraints carry the measured pooling factors too
(``ParameterConstraints``), so TorchRec's storage estimate of the buffers follows the data.

``feedback_plan`` closes the loop on paper: per table, the cheapest split (whole,
columns, rows in a host, rows x columns, rows over every rank) whose costliest shard
fits a fraction of a rank's mean load; the planner places them, choosing the host of
each group of row shards by the hottest rank it makes (``RankMaxHostPartitioner``); the
report prices every rank; the tables that make ranks hot are split finer and it plans
again (its docstring).
``python -m tbe_plugin.torchrec.partition`` plans and reports.

Imports TorchRec and ``tbe_plugin.torchrec`` only; ``pipelines`` and the benchmarks import it.
"""

import argparse
import dataclasses
import functools
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tbe_plugin.torchrec.cost import (
    CostModel,
    ImbalanceReport,
    KernelSpeed,
    PlacedShard,
    default_kernel_benchmark,
    imbalance_report,
    load_shards,
    save_shards,
    shards_of_options,
    shards_of_plan,
)
from tbe_plugin.torchrec.stats import ROW_BUCKETS, FeatureStatistics, TableStatistics

SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "grid_shard")
PRESETS: Dict[str, Tuple[str, ...]] = {
    "table_wise": ("table_wise",),
    "row_wise": ("row_wise",),
    "column_wise": ("column_wise",),
    "table_row_wise": ("table_row_wise",),
    "grid": ("grid_shard",),
    "hybrid": SHARDING_TYPES,
    "balanced": SHARDING_TYPES,
}
"""Sharding types per preset; ``hybrid`` plans from static guesses, ``balanced`` from statistics."""
STATIC_POOLING_FACTOR = 1.0
"""TorchRec's guess when no pooling factor is given (``planner.constants.POOLING_FACTOR``)."""
BALANCED_MIN_PARTITION = 32
"""Narrowest column-wise shard the balanced preset starts from (TorchRec's default is 128)."""
FINEST_MIN_PARTITION = 4
"""Narrowest column-wise shard feedback may ask for (FBGEMM needs multiples of 4)."""


def static_statistics(statistics: FeatureStatistics) -> FeatureStatistics:
    """What TorchRec's planner assumes of the same tables: pooling factor 1 per bag, ids
    uniform over the rows, every lookup a distinct row."""
    tables = []
    for t in statistics.tables:
        per_bucket = t.bags_per_batch * STATIC_POOLING_FACTOR / ROW_BUCKETS
        tables.append(dataclasses.replace(
            t, lookups_per_batch=t.bags_per_batch * STATIC_POOLING_FACTOR, mean_pooling=STATIC_POOLING_FACTOR,
            p99_pooling=STATIC_POOLING_FACTOR, distinct_fraction=1.0, hot_0p1pct_share=0.001, hot_1pct_share=0.01,
            heavy_rows=[], row_buckets=[per_bucket] * ROW_BUCKETS,
        ))  # fmt: skip
    return dataclasses.replace(statistics, tables=tables, provenance={"static_guesses_of": statistics.provenance})


def preset_constraints(statistics: FeatureStatistics, preset: str, compute_kernel: str,
                       min_partition: Optional[Dict[str, int]] = None,
                       sharding_types: Optional[Dict[str, Sequence[str]]] = None) -> Dict[str, Any]:
    """``ParameterConstraints`` per table for ``preset``; ``balanced`` passes the measured
    pooling factors and allows column-wise shards down to ``BALANCED_MIN_PARTITION``
    columns; ``min_partition`` and ``sharding_types`` override per table (feedback)."""
    from torchrec.distributed.planner import ParameterConstraints

    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not one of {', '.join(PRESETS)}")
    constraints = {}
    for t in statistics.tables:
        kwargs: Dict[str, Any] = {"sharding_types": list((sharding_types or {}).get(t.name, PRESETS[preset])),
                                  "compute_kernels": [compute_kernel]}  # fmt: skip
        if preset == "balanced":
            kwargs["pooling_factors"] = [max(t.mean_pooling, 1e-3)]
            kwargs["min_partition"] = (min_partition or {}).get(t.name, min(t.dim, BALANCED_MIN_PARTITION))
        constraints[t.name] = ParameterConstraints(**kwargs)
    return constraints


class StatisticsPerfEstimator:
    """A TorchRec ``ShardEstimator``: each shard's ``Perf`` from ``CostModel`` and the
    statistics (forward and fused backward at the kernel's measured speeds, all-to-alls
    over the topology's bandwidths). Takes TorchRec's estimator's place in the enumerator."""

    def __init__(self, topology: Any, constraints: Optional[Dict[str, Any]], statistics: FeatureStatistics,
                 model: CostModel) -> None:  # fmt: skip
        self._topology, self._constraints = topology, constraints
        self._tables = {t.name: t for t in statistics.tables}
        self._model = model

    def estimate(self, sharding_options: List[Any], sharder_data_map: Any = None) -> None:
        """Sets ``shard.perf`` of every option in place (TorchRec's ``ShardEstimator``
        interface; the sharders are not needed: one kernel per backend)."""
        from torchrec.distributed.planner.types import Perf

        for option in sharding_options:
            table = self._tables.get(option.name)
            if table is None:
                raise ValueError(f"table {option.name}: no statistics (have {sorted(self._tables)[:5]}...)")
            for shard in option.shards:
                cost = self._model.shard_cost(table, option.sharding_type, shard.offset[0], shard.size[0],
                                              shard.size[1])  # fmt: skip
                shard.perf = Perf(fwd_compute=cost.forward_s, fwd_comms=cost.comm_s / 2,
                                  bwd_compute=cost.backward_s, bwd_comms=cost.comm_s / 2)  # fmt: skip


HOST_PLACEMENTS = ("host_total", "rank_max")
"""How the partitioner picks a host for a group of row shards (table-row-wise, grid):
``host_total``: TorchRec's rule, the host with the least total load; ``rank_max``:
``RankMaxHostPartitioner``'s, the host whose hottest rank is least hot with the group on it."""


@functools.lru_cache(maxsize=None)
def rank_max_partitioner_class() -> Any:
    """``RankMaxHostPartitioner``, a TorchRec partitioner class, defined on first use
    (TorchRec is imported lazily in this module)."""
    from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
    from torchrec.distributed.planner.types import PlannerError, PlannerErrorType

    def block_loads(shard_lists: Sequence[Sequence[Any]], local: int) -> List[float]:
        """The perf each local rank gets from row blocks ``0 .. local - 1`` of each list."""
        return [sum(shards[i].perf.total for shards in shard_lists if shards[i].perf is not None)
                for i in range(local)]  # fmt: skip

    def rank_max_with(devices: List[Any], loads: Sequence[float]) -> Tuple[float, float]:
        """The hottest rank of a host (and the host's total) with ``loads[i]`` added to
        local rank ``i``: where TorchRec's row-split shardings put row block ``i``."""
        after = [d.perf.total + load for d, load in zip(devices, loads)]
        return max(after), sum(after)

    class RankMaxHostPartitioner(GreedyPerfPartitioner):
        """TorchRec's ``GreedyPerfPartitioner`` that picks the host of a table-row-wise group
        or of each grid column block by the hottest rank it makes, not the host's total.

        TorchRec's table-row-wise and grid shardings always give row block ``i`` of a host
        to local rank ``i`` (``TwRwEmbeddingSharding._shard`` takes ``shards[rank_idx]``
        and the input dist bucketizes ids into ``local_size`` blocks), so the host is the
        only free choice; by the host total, a hot block can land on a local rank already
        holding other hot blocks. The placement inside a host is TorchRec's own (the parent's
        method called with one host, or with the chosen hosts); a group that does not fit
        where this rule points falls back to TorchRec's order."""

        @classmethod
        def _cohost_partition(cls, sharding_option_group: Any, _host_level_devices: List[List[Any]]) -> None:
            blocks = [o.shards for o in sharding_option_group.sharding_options
                      if o.sharding_type == "table_row_wise"]  # fmt: skip
            if len(blocks) != len(sharding_option_group.sharding_options):  # table-column-wise: TorchRec's rule
                return super()._cohost_partition(sharding_option_group, _host_level_devices)
            local = len(_host_level_devices[0])
            loads = block_loads(blocks, local)
            for devices in sorted(_host_level_devices, key=lambda d: rank_max_with(d, loads)):
                try:
                    return super()._cohost_partition(sharding_option_group, [devices])
                except PlannerError:  # does not fit this host's memory: the next
                    continue
            raise PlannerError(error_type=PlannerErrorType.PARTITION,
                               message=f"can't find a host for sharding option group {sharding_option_group}")

        def _multi_hosts_partition(self, sharding_option_group: Any, _host_level_devices: List[List[Any]]) -> None:
            option = sharding_option_group.sharding_options[0]
            local = len(_host_level_devices[0])
            hosts_needed = len(option.shards) // local
            if len(sharding_option_group.sharding_options) != 1 or hosts_needed > len(_host_level_devices):
                return super()._multi_hosts_partition(sharding_option_group, _host_level_devices)
            # Column blocks have the same row blocks, so one block's shards rank every host;
            # the parent, given exactly hosts_needed hosts, puts one column block on each.
            loads = block_loads([option.shards], local)
            ranked = sorted(_host_level_devices, key=lambda d: rank_max_with(d, loads))
            try:
                return super()._multi_hosts_partition(sharding_option_group, ranked[:hosts_needed])
            except PlannerError:  # the chosen hosts lack memory: TorchRec's search over all
                return super()._multi_hosts_partition(sharding_option_group, _host_level_devices)

    return RankMaxHostPartitioner


def make_statistics_planner(topology: Any, statistics: FeatureStatistics, model: CostModel,
                            constraints: Dict[str, Any], proposal_patience: int = 8,
                            host_placement: str = "host_total") -> Any:
    """TorchRec's ``EmbeddingShardingPlanner`` whose shard perf is ``StatisticsPerfEstimator``'s.
    One greedy proposer that stops after ``proposal_patience`` proposals no better than
    its best (TorchRec's four default proposers take minutes at a few hundred tables).
    ``host_placement`` (``HOST_PLACEMENTS``) picks TorchRec's partitioner or
    ``RankMaxHostPartitioner``; both place the costliest options first."""
    if host_placement not in HOST_PLACEMENTS:
        raise ValueError(f"host_placement {host_placement!r} is not one of {HOST_PLACEMENTS}")
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner, SortBy
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.planner.stats import NoopEmbeddingStats

    partitioner_class = rank_max_partitioner_class() if host_placement == "rank_max" else GreedyPerfPartitioner
    estimators = [StatisticsPerfEstimator(topology, constraints, statistics, model),
                  EmbeddingStorageEstimator(topology=topology, constraints=constraints)]  # fmt: skip
    enumerator = EmbeddingEnumerator(topology, model.rank_batch_size, constraints, estimator=estimators)
    return EmbeddingShardingPlanner(
        topology=topology, batch_size=model.rank_batch_size, constraints=constraints, enumerator=enumerator,
        proposer=[GreedyProposer(threshold=proposal_patience)], stats=[NoopEmbeddingStats()], debug=False,
        partitioner=partitioner_class(sort_by=SortBy.PERF),  # costliest first (the default: largest first)
    )  # fmt: skip


@dataclasses.dataclass
class PlanResult:
    """A plan, what it costs, and how long planning took."""

    name: str
    plan: Any
    """TorchRec's ``ShardingPlan``."""
    shards: List[PlacedShard]
    report: ImbalanceReport
    """Priced with the measured statistics, whatever the plan was planned from."""
    planning_s: float
    rounds: int = 1


def plan_preset(module: Any, sharders: List[Any], topology: Any, statistics: FeatureStatistics, model: CostModel,
                preset: str, compute_kernel: str, **constraint_overrides: Any) -> PlanResult:
    """Plans ``module`` with ``preset`` (``hybrid`` and the one-type presets plan from
    ``static_statistics``, ``balanced`` from ``statistics``) and reports it against
    ``statistics``."""
    planned_from = statistics if preset == "balanced" else static_statistics(statistics)
    constraints = preset_constraints(planned_from, preset, compute_kernel, **constraint_overrides)
    began = time.process_time()
    planner = make_statistics_planner(topology, planned_from, model, constraints)
    plan = planner.plan(module, sharders)
    planning_s = time.process_time() - began
    shards = shards_of_plan(plan)
    return PlanResult(preset, plan, shards, imbalance_report(shards, statistics, model), planning_s)


@dataclasses.dataclass(frozen=True)
class TableSplit:
    """How feedback splits one table: a sharding type and, for column splits, the shard width."""

    sharding_type: str
    cols: int
    """Columns per shard (the table's dim when columns are not split)."""
    max_shard_s: float
    """The costliest shard's time per step."""
    total_s: float
    """All shards' time per step together (what the split costs the job)."""


def shard_shapes(rows: int, dim: int, sharding_type: str, world_size: int, local_world_size: int,
                 cols: int) -> List[Tuple[int, int, int]]:
    """``(first_row, rows, cols)`` of each shard, as TorchRec's enumerator cuts them."""
    import torch
    from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets

    sizes, offsets = calculate_shard_sizes_and_offsets(torch.empty(rows, dim, device="meta"), world_size,
                                                       local_world_size, sharding_type, col_wise_shard_dim=cols)  # fmt: skip
    return [(offset[0], size[0], size[1]) for size, offset in zip(sizes, offsets)]


def split_candidates(table: TableStatistics, model: CostModel) -> List[TableSplit]:
    """Every way feedback may shard ``table``: whole, column blocks of dim/2 .. 4 columns
    (powers of two that divide dim), rows over a host, rows over a host x column blocks,
    rows over every rank; each priced shard by shard with ``model``."""
    candidates = []
    blocks = [b for b in (2**k for k in range(2, 16)) if b < table.dim and table.dim % b == 0]
    options = ([("table_wise", table.dim)] + [("column_wise", b) for b in sorted(blocks, reverse=True)]
               + [("table_row_wise", table.dim)] + [("grid_shard", b) for b in sorted(blocks, reverse=True)]
               + [("row_wise", table.dim)])  # fmt: skip
    for sharding_type, cols in options:
        shards = shard_shapes(table.rows, table.dim, sharding_type, model.world_size, model.local_world_size, cols)
        costs = [model.shard_cost(table, sharding_type, r0, n, m).seconds for r0, n, m in shards if n > 0]
        candidates.append(TableSplit(sharding_type, cols, max(costs), sum(costs)))
    return candidates


def choose_splits(candidates: Dict[str, List[TableSplit]], world_size: int,
                  piece_fraction: Dict[str, float]) -> Dict[str, TableSplit]:
    """Per table, the cheapest split (least total time) whose costliest shard is at most
    ``piece_fraction[table]`` of a rank's mean load (the tables' whole costs over the
    ranks); the split with the smallest shards where none is that small."""
    mean_rank_s = sum(c[0].total_s for c in candidates.values()) / world_size
    chosen = {}
    for name, options in candidates.items():
        fitting = [o for o in options if o.max_shard_s <= piece_fraction[name] * mean_rank_s]
        chosen[name] = min(fitting, key=lambda o: o.total_s) if fitting else min(options, key=lambda o: o.max_shard_s)
    return chosen


def plan_splits(module: Any, sharders: List[Any], topology: Any, statistics: FeatureStatistics, model: CostModel,
                compute_kernel: str, splits: Dict[str, TableSplit], name: str,
                host_placement: str = "rank_max") -> PlanResult:
    """TorchRec's planner with one sharding type (and column width) per table, as
    ``splits`` say; placement by the greedy partitioner over the statistics' costs, with
    row-shard groups' hosts chosen by ``host_placement`` (``make_statistics_planner``)."""
    from torchrec.distributed.planner import ParameterConstraints

    constraints = {
        t: ParameterConstraints(sharding_types=[s.sharding_type], compute_kernels=[compute_kernel],
                                min_partition=s.cols, pooling_factors=[max(statistics.table(t).mean_pooling, 1e-3)])
        for t, s in splits.items()
    }  # fmt: skip
    began = time.process_time()
    planner = make_statistics_planner(topology, statistics, model, constraints, host_placement=host_placement)
    plan = planner.plan(module, sharders)
    planning_s = time.process_time() - began
    shards = shards_of_plan(plan)
    return PlanResult(name, plan, shards, imbalance_report(shards, statistics, model), planning_s)


def tables_to_refine(report: ImbalanceReport, target: float) -> List[str]:
    """The tables whose shards make ranks exceed ``target`` x the mean: on each such rank,
    every shard at least as costly as the excess (shrinking one of them could cure it),
    else the rank's costliest shard."""
    mean_s = sum(r.seconds for r in report.ranks) / len(report.ranks)
    tables = set()
    for rank in report.ranks:
        excess = rank.seconds - target * mean_s
        if excess <= 0 or not rank.shards:
            continue
        big = [s["table"] for s in rank.shards if s["seconds"] >= excess]
        tables.update(big or [max(rank.shards, key=lambda s: s["seconds"])["table"]])
    return sorted(tables)


def feedback_plan(module: Any, sharders: List[Any], topology: Any, statistics: FeatureStatistics, model: CostModel,
                  compute_kernel: str, target: float = 1.15, coarse_fractions: Sequence[float] = (1.0, 0.5, 0.25),
                  refine_rounds: int = 3, host_placement: str = "rank_max") -> PlanResult:
    """Feedback-directed partitioning. Each table gets the cheapest split whose shards
    are at most a fraction of a rank's mean load (``choose_splits``); the planner places
    the shards and the report prices every rank. First one fraction for all tables, from
    each of ``coarse_fractions`` (finer splits balance better but move more bytes: outputs
    of row splits, ids of column splits); then, from the fastest of those, up to
    ``refine_rounds`` rounds in which the tables that make ranks exceed ``target`` x the
    mean (``tables_to_refine``) get half their fraction (TorchRec fixes which rank of a
    host holds which rows, so a hot range can be moved to another host or made cheaper,
    not moved within its host). The refinement starts from the fastest coarse plan even
    when a finer coarse plan is within ``target``, and stops as soon as a plan is.
    ``host_placement`` is ``make_statistics_planner``'s (``rank_max``: the host of a
    row-shard group by the hottest rank it makes). The result is the fastest plan (least
    predicted step) within ``target``, else the fastest; ``planning_s`` is the process
    time of all rounds."""
    if target < 1.0:
        raise ValueError(f"target must be >= 1.0 (max/mean), got {target}")
    if not coarse_fractions or min(coarse_fractions) <= 0:
        raise ValueError(f"coarse_fractions must be > 0, got {tuple(coarse_fractions)}")
    began = time.process_time()
    candidates = {t.name: split_candidates(t, model) for t in statistics.tables}
    results: List[Tuple[PlanResult, Dict[str, float]]] = []

    def attempt(fraction: Dict[str, float]) -> bool:
        splits = choose_splits(candidates, model.world_size, fraction)
        result = plan_splits(module, sharders, topology, statistics, model, compute_kernel, splits, "fdp",
                             host_placement)
        results.append((result, fraction))
        return result.report.max_over_mean <= target

    def fastest(pool: List[Tuple[PlanResult, Dict[str, float]]]) -> Tuple[PlanResult, Dict[str, float]]:
        within = [r for r in pool if r[0].report.max_over_mean <= target]
        return min(within or pool, key=lambda r: r[0].report.predicted_step_ms)

    any(attempt({name: f for name in candidates}) for f in coarse_fractions)  # stops at the first within target
    # Refine from the fastest plan even when a finer one is within target: balancing the
    # fastest plan's few hot tables is cheaper than cutting every table finer.
    current = min(results, key=lambda r: r[0].report.predicted_step_ms)
    done = current[0].report.max_over_mean <= target
    for _ in range(0 if done else refine_rounds):  # each round refines the last one's hot tables further
        refined = dict(current[1])
        for name in tables_to_refine(current[0].report, target):
            refined[name] /= 2
        if attempt(refined):
            break
        current = results[-1]
    best, _ = fastest(results)
    return dataclasses.replace(best, planning_s=time.process_time() - began, rounds=len(results))


def meta_collection(statistics: FeatureStatistics) -> Any:
    """An ``EmbeddingBagCollection`` on the meta device with the statistics' tables (to plan)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(name=t.name, num_embeddings=t.rows, embedding_dim=t.dim, feature_names=[t.feature])
               for t in statistics.tables]  # fmt: skip
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def _cost_model(args: argparse.Namespace, topology: Any, statistics: FeatureStatistics) -> CostModel:
    kernel = KernelSpeed.from_benchmark(args.kernel_benchmark or default_kernel_benchmark(), args.kernel_provider)
    return CostModel.from_topology(topology, kernel, args.rank_batch_size or statistics.rank_batch_size)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tbe_plugin.torchrec.partition", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["report", "plan"], help="report: a saved plan; plan: plan, save, report")
    parser.add_argument("--statistics", required=True, help="FeatureStatistics JSON (the training app writes one)")
    parser.add_argument("--plan", help="report: the plan JSON to report (tbe_plugin.torchrec.cost.save_shards)")
    parser.add_argument("--preset", default="balanced", choices=sorted(PRESETS) + ["fdp"], help="plan: the preset")
    parser.add_argument("--out", help="plan: where the plan JSON goes")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--local-world-size", type=int, default=8)
    parser.add_argument("--rank-batch-size", type=int, default=0, help="bags per rank (0: the statistics')")
    parser.add_argument("--compute-device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--hbm-gb", type=float, default=140.0, help="memory per device the planner may fill")
    parser.add_argument("--backend", default="triton", choices=["triton", "fbgemm"])
    parser.add_argument("--kernel-benchmark", help="backward benchmark JSON with the kernel's speeds")
    parser.add_argument("--kernel-provider", default="ours", choices=["ours", "fbgemm"])
    args = parser.parse_args(argv)

    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec._compat import triton_kernel

    statistics = FeatureStatistics.load(args.statistics)
    topology = Topology(world_size=args.world_size, local_world_size=min(args.local_world_size, args.world_size),
                        compute_device=args.compute_device, hbm_cap=int(args.hbm_gb * 2**30))  # fmt: skip
    model = _cost_model(args, topology, statistics)
    if args.command == "report":
        if not args.plan:
            parser.error("report needs --plan")
        print(imbalance_report(load_shards(args.plan), statistics, model).to_markdown(args.plan))
        return
    kernel = triton_kernel() if args.backend == "triton" else "fused"
    module, sharders = meta_collection(statistics), get_sharders(args.backend)
    if args.preset == "fdp":
        result = feedback_plan(module, sharders, topology, statistics, model, kernel)
    else:
        result = plan_preset(module, sharders, topology, statistics, model, args.preset, kernel)
    if args.out:
        save_shards(result.shards, args.out, preset=args.preset, world_size=args.world_size,
                    statistics=args.statistics)  # fmt: skip
    print(result.report.to_markdown(f"{result.name} (planned in {result.planning_s:.1f} s)"))


if __name__ == "__main__":
    main()


__all__ = ["HOST_PLACEMENTS", "PRESETS", "PlanResult", "StatisticsPerfEstimator", "TableStatistics", "feedback_plan",
           "make_statistics_planner", "meta_collection", "plan_preset", "preset_constraints",
           "rank_max_partitioner_class", "shards_of_options", "static_statistics"]  # fmt: skip
