"""Partitioning in the training app: the ``sharding.preset`` constraints, the feature
statistics of the batches the job trains on, and the imbalance report of its plan.

``preset_constraints`` turns a preset (``tbe_plugin.torchrec.partition.PRESETS``) into
TorchRec ``ParameterConstraints`` for the app's planner; ``balanced`` takes the pooling
factors and column widths from a statistics file (``sharding.statistics_file``, a
``FeatureStatistics`` JSON such as a previous run wrote). ``ObservedBatches`` shows every
batch's sparse features to a ``FeatureStatisticsCollector`` as the pipeline draws it (one
step in ``sharding.statistics_every`` is sampled, on the device, without a host sync);
``report_imbalance`` sums them over the ranks and prices the running plan with them.

``Repartitioner`` is the closed loop (``sharding.repartition_every``): at a check it prices
the running plan under the statistics so far; above ``sharding.repartition_imbalance`` it
re-plans from them (``tbe_plugin.torchrec.partition``'s statistics planner, within the
sharding types the job allows) and returns a ``Decision``: re-shard when the new plan's
predicted step is ``sharding.repartition_min_gain`` faster. The re-shard itself (a
checkpoint under the old plan loaded into a model built under the new one) is the app's
(``pipelines.app.train``), since it owns the checkpoints and the pipeline.

Imports ``tbe_plugin.torchrec``; ``pipelines.app.train`` imports it.
"""

import dataclasses
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

from tbe_plugin.torchrec.cost import (
    CostModel,
    ImbalanceReport,
    KernelSpeed,
    default_kernel_benchmark,
    imbalance_report,
    shards_of_plan,
)
from tbe_plugin.torchrec.partition import PRESETS, SHARDING_TYPES, make_statistics_planner, meta_collection
from tbe_plugin.torchrec.partition import preset_constraints as statistics_constraints
from tbe_plugin.torchrec.stats import FeatureStatistics, FeatureStatisticsCollector, TableInfo


def preset_constraints(preset: str, tables: List[str], statistics_file: str = "",
                       compute_kernel: Optional[str] = None) -> Dict[str, Any]:
    """``ParameterConstraints`` per table for ``preset``: its sharding types; for
    ``balanced`` also the measured pooling factors and column widths of ``statistics_file``
    (which must hold every table)."""
    from torchrec.distributed.planner import ParameterConstraints

    if preset not in PRESETS:
        raise ValueError(f"sharding.preset={preset!r}: expected one of {', '.join(PRESETS)}")
    if preset != "balanced":
        return {t: ParameterConstraints(sharding_types=list(PRESETS[preset])) for t in tables}
    if not statistics_file:
        raise ValueError("sharding.preset=balanced plans from measured statistics: set sharding.statistics_file")
    statistics = FeatureStatistics.load(statistics_file)
    missing = sorted(set(tables) - {t.name for t in statistics.tables})
    if missing:
        raise ValueError(f"sharding.statistics_file={statistics_file} has no statistics for tables {missing[:5]}")
    constraints = statistics_constraints(statistics, "balanced", compute_kernel or "")
    for c in constraints.values():  # the sharder offers one kernel per backend: let it choose
        c.compute_kernels = None
    return {t: constraints[t] for t in tables}


def make_collector(rows: List[int], dim: int, device: torch.device, every: int) -> FeatureStatisticsCollector:
    """A collector of the app's tables (``t{i}`` read by feature ``f{i}``, as
    ``pipelines.app.model.build_model`` names them) sampling one step in ``every``."""
    tables = [TableInfo(f"t{i}", f"f{i}", n, dim) for i, n in enumerate(rows)]
    return FeatureStatisticsCollector(tables, device, sample_every=every)


class ObservedBatches:
    """``batches`` as they were (positions, readiness and all), every batch drawn shown
    to ``collector`` first."""

    def __init__(self, batches: Any, collector: FeatureStatisticsCollector) -> None:
        self._batches, self.collector = batches, collector

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        self.collector.observe(batch.sparse_features)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batches, name)


def report_imbalance(dmp: Any, collector: FeatureStatisticsCollector, world_size: int, local_world_size: int,
                     rank_batch_size: int, device_type: str,
                     kernel_benchmark: Optional[str] = None) -> "tuple[FeatureStatistics, ImbalanceReport]":
    """The statistics so far (a collective: every rank calls it) and the running plan's
    per-rank costs under them, at the kernel speeds of ``kernel_benchmark`` (default: the
    current H200 measurement) and the topology's default bandwidths."""
    from torchrec.distributed.planner import Topology

    statistics = collector.statistics({"source": "pipelines.app.train"})
    topology = Topology(world_size=world_size, local_world_size=local_world_size, compute_device=device_type)
    kernel = KernelSpeed.from_benchmark(kernel_benchmark or default_kernel_benchmark())
    model = CostModel.from_topology(topology, kernel, rank_batch_size)
    return statistics, imbalance_report(shards_of_plan(dmp.plan), statistics, model)


def plan_summary(plan: Any) -> Dict[str, str]:
    """Each table's sharding type and ranks, e.g. ``{"t0": "table_wise@[1]"}``."""
    return {table: f"{sharding.sharding_type}@{list(sharding.ranks or [])}"
            for module_plan in plan.plan.values() for table, sharding in sorted(module_plan.items())}  # fmt: skip


@dataclasses.dataclass
class Decision:
    """What one check of the loop found, and whether the job re-shards."""

    step: int
    outcome: str
    """``resharded``, ``balanced_enough`` (below the imbalance trigger), ``same_plan`` or
    ``gain_below_threshold``."""
    old: ImbalanceReport
    new: Optional[ImbalanceReport] = None
    plan: Any = None
    """The new ``ShardingPlan`` (None when nothing was re-planned)."""
    old_plan: Any = None
    planning_s: float = 0.0

    @property
    def reshard(self) -> bool:
        return self.outcome == "resharded"

    @property
    def predicted_gain(self) -> Optional[float]:
        """The fraction of the predicted embedding step the new plan saves."""
        if self.new is None or not self.old.predicted_step_ms:
            return None
        return 1.0 - self.new.predicted_step_ms / self.old.predicted_step_ms

    def record(self) -> Dict[str, Any]:
        """The fields of the ``repartition`` log record."""
        out: Dict[str, Any] = {"outcome": self.outcome, "old_max_over_mean": self.old.max_over_mean,
                               "old_predicted_step_ms": self.old.predicted_step_ms,
                               "old_plan": plan_summary(self.old_plan) if self.old_plan is not None else None}  # fmt: skip
        if self.new is not None:
            out.update(new_max_over_mean=self.new.max_over_mean, new_predicted_step_ms=self.new.predicted_step_ms,
                       predicted_gain=self.predicted_gain, planning_s=self.planning_s,
                       new_plan=plan_summary(self.plan))  # fmt: skip
        return out

    def line(self) -> str:
        text = f"repartition at step {self.step}: {self.outcome}; max/mean {self.old.max_over_mean:.2f}"
        if self.new is not None:
            text += (f" -> {self.new.max_over_mean:.2f}, predicted embedding step {self.old.predicted_step_ms:.4g}"
                     f" -> {self.new.predicted_step_ms:.4g} ms (gain {self.predicted_gain:+.1%})")
        return text


class Repartitioner:
    """Every ``every`` steps: the statistics so far (a collective), the running plan priced
    with them and, when its max/mean reaches ``imbalance``, a new plan from them; the job
    re-shards when the new plan differs and its predicted step is at least ``min_gain``
    (a fraction) faster. Every rank calls ``check`` at the same steps and gets the same
    decision (the statistics are summed over the ranks, rank 0's plan is broadcast)."""

    def __init__(self, every: int, imbalance: float, min_gain: float, sharders: List[Any],
                 sharding_types: Dict[str, Sequence[str]], world_size: int, local_world_size: int,
                 rank_batch_size: int, device_type: str, kernel_benchmark: Optional[str] = None) -> None:
        if every < 1:
            raise ValueError(f"sharding.repartition_every={every}: must be >= 1 to make a Repartitioner")
        self.every, self.imbalance, self.min_gain = every, imbalance, min_gain
        self.sharders, self.sharding_types = sharders, {t: list(v) for t, v in sharding_types.items()}
        self.world_size, self.local_world_size = world_size, local_world_size
        self.rank_batch_size, self.device_type, self.kernel_benchmark = rank_batch_size, device_type, kernel_benchmark

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def _topology(self) -> Any:
        from torchrec.distributed.planner import Topology

        return Topology(world_size=self.world_size, local_world_size=self.local_world_size,
                        compute_device=self.device_type)  # fmt: skip

    def check(self, dmp: Any, collector: FeatureStatisticsCollector, step: int) -> Decision:
        statistics, old = report_imbalance(dmp, collector, self.world_size, self.local_world_size,
                                           self.rank_batch_size, self.device_type, self.kernel_benchmark)  # fmt: skip
        if old.max_over_mean < self.imbalance:
            return Decision(step, "balanced_enough", old, old_plan=dmp.plan)
        began = time.process_time()
        plan = self.replan(dmp.plan, statistics)
        planning_s = time.process_time() - began
        model = self._cost_model()
        new = imbalance_report(shards_of_plan(plan), statistics, model)
        if sorted(shards_of_plan(plan), key=repr) == sorted(shards_of_plan(dmp.plan), key=repr):
            outcome = "same_plan"
        elif old.predicted_step_ms and 1.0 - new.predicted_step_ms / old.predicted_step_ms >= self.min_gain:
            outcome = "resharded"
        else:
            outcome = "gain_below_threshold"
        return Decision(step, outcome, old, new, plan, dmp.plan, planning_s)

    def _cost_model(self) -> CostModel:
        kernel = KernelSpeed.from_benchmark(self.kernel_benchmark or default_kernel_benchmark())
        return CostModel.from_topology(self._topology(), kernel, self.rank_batch_size)

    def replan(self, running: Any, statistics: FeatureStatistics) -> Any:
        """A plan of the running plan's one embedding module from ``statistics``: measured
        pooling factors, shards priced by the cost model, each table within its allowed
        sharding types. Planned on rank 0 and broadcast (``collective_plan``)."""
        import torch.distributed as dist
        from torchrec.distributed.types import ShardingPlan

        from tbe_plugin.torchrec.partition import preset_constraints as statistics_constraints

        if len(running.plan) != 1:
            raise ValueError(f"sharding.repartition_every: the plan shards {len(running.plan)} modules; "
                             "re-planning knows one embedding collection")  # fmt: skip
        path = next(iter(running.plan))
        types = {t.name: self.sharding_types.get(t.name, SHARDING_TYPES) for t in statistics.tables}
        constraints = statistics_constraints(statistics, "balanced", "", sharding_types=types)
        for c in constraints.values():  # the sharder offers one kernel per backend: let it choose
            c.compute_kernels = None
        planner = make_statistics_planner(self._topology(), statistics, self._cost_model(), constraints)
        plan = planner.collective_plan(meta_collection(statistics), self.sharders, dist.group.WORLD)
        return ShardingPlan({path: next(iter(plan.plan.values()))})


def allowed_sharding_types(sharding: Any, num_tables: int) -> Dict[str, List[str]]:
    """The sharding types each table ``t{i}`` may take under ``sharding`` (a
    ``ShardingConfig``): the preset's, else ``per_table`` over ``sharding_types``, else all."""
    if sharding.preset:
        return {f"t{i}": list(PRESETS[sharding.preset]) for i in range(num_tables)}
    allowed = {f"t{i}": list(sharding.sharding_types or SHARDING_TYPES) for i in range(num_tables)}
    allowed.update({t: list(v) for t, v in sharding.per_table.items() if v})
    return allowed


def make_repartitioner(cfg: Any, sharders: List[Any], world_size: int, device_type: str) -> Repartitioner:
    """The loop of a ``TrainConfig``: its ``sharding.repartition_*`` keys, its tables' allowed
    sharding types, the topology of torchrun's environment."""
    import os

    return Repartitioner(cfg.sharding.repartition_every, cfg.sharding.repartition_imbalance,
                         cfg.sharding.repartition_min_gain, sharders,
                         allowed_sharding_types(cfg.sharding, cfg.tables.num_tables), world_size,
                         int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), cfg.data.batch_size, device_type)  # fmt: skip


def plan_file_beside(statistics_out: str) -> str:
    """Where the plan goes beside a statistics JSON: ``stats.json`` -> ``stats.plan.json``."""
    stem = statistics_out[:-len(".json")] if statistics_out.endswith(".json") else statistics_out
    return stem + ".plan.json"


def save_plan(plan: Any, path: str, **metadata: Any) -> None:
    """The plan's shards as ``tbe_plugin.torchrec.cost.save_shards`` writes them, which
    ``python -m tbe_plugin.torchrec.partition report`` reprices."""
    from tbe_plugin.torchrec.cost import save_shards

    save_shards(shards_of_plan(plan), path, source="pipelines.app.train", **metadata)


def load_resharded(path: str, state: Dict[str, Any]) -> None:
    """``torch.distributed.checkpoint.load`` of an app checkpoint, under its own plan or another.

    TorchRec's fused optimizer state holds only the tables a rank holds, so whenever a
    table lives on some ranks only, each rank lacks some of the checkpoint's keys. DCP's default planner takes any
    such key for the sign of a pre-2.4 checkpoint and re-keys the whole state the old way
    (optimizer param groups as one value), which the checkpoint then lacks. This planner
    keys the state the current way only; every key of ``state`` must still be found."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan

    class CurrentKeysLoadPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    dcp.load(state, checkpoint_id=path, planner=CurrentKeysLoadPlanner())


def carry_batches(old: Any, new: Any) -> None:
    """Hands the batches ``old`` (a detached ``StalenessTrainPipeline``) drew but did not
    train to ``new``, which draws them first: a re-shard skips no batch and repeats none.
    Reads the pipeline's given-back queue, which has no public accessor yet."""
    if old._in_flight or old._started:
        raise RuntimeError("carry_batches: detach the old pipeline first (batches are still in flight)")
    new._pending.extend(old._pending)
    old._pending.clear()


PLANS_DIR = "plans"
"""Under ``checkpoint.dir``: ``step_<N>.json``, the plan the job re-sharded to after step N."""


def plan_to_json(plan: Any) -> Dict[str, Any]:
    """A ``ShardingPlan`` of table shardings as JSON values: per module and table, the
    sharding type, compute kernel, ranks and each shard's offsets, sizes and placement."""
    out: Dict[str, Any] = {}
    for path, module_plan in plan.plan.items():
        out[path] = {}
        for table, sharding in module_plan.items():
            shards = [{"offsets": list(m.shard_offsets), "sizes": list(m.shard_sizes), "placement": str(m.placement)}
                      for m in sharding.sharding_spec.shards]  # fmt: skip
            out[path][table] = {"sharding_type": sharding.sharding_type, "compute_kernel": sharding.compute_kernel,
                                "ranks": list(sharding.ranks or []), "shards": shards}  # fmt: skip
    return out


def plan_from_json(values: Dict[str, Any]) -> Any:
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    plan = {}
    for path, tables in values.items():
        module_plan = EmbeddingModuleShardingPlan()
        for table, p in tables.items():
            spec = EnumerableShardingSpec([ShardMetadata(shard_offsets=s["offsets"], shard_sizes=s["sizes"],
                                                         placement=s["placement"]) for s in p["shards"]])  # fmt: skip
            module_plan[table] = ParameterSharding(sharding_type=p["sharding_type"], compute_kernel=p["compute_kernel"],
                                                   ranks=p["ranks"], sharding_spec=spec)  # fmt: skip
        plan[path] = module_plan
    return ShardingPlan(plan)


def record_plan(checkpoint_dir: str, step: int, plan: Any) -> str:
    """Writes the plan re-sharded to after ``step`` (rank 0 calls it), for resumes."""
    import json
    import os

    directory = os.path.join(checkpoint_dir, PLANS_DIR)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(plan_to_json(plan), f, indent=1)
    os.replace(path + ".tmp", path)  # a whole file or none
    return path


def plan_of_checkpoint(checkpoint_dir: Optional[str], checkpoint_step: int) -> "tuple[Optional[str], Any]":
    """The plan a checkpoint of ``checkpoint_step`` was written under: that of the last
    re-shard before it (a re-shard's own checkpoint is written under the old plan), or
    None (the configured planner's). Returns its file too."""
    import json
    import os
    import re

    directory = os.path.join(checkpoint_dir or "", PLANS_DIR)
    if not checkpoint_dir or not os.path.isdir(directory):
        return None, None
    steps = [int(m.group(1)) for m in map(re.compile(r"step_(\d+)\.json").fullmatch, os.listdir(directory)) if m]
    earlier = [s for s in steps if s < checkpoint_step]
    if not earlier:
        return None, None
    path = os.path.join(directory, f"step_{max(earlier)}.json")
    with open(path) as f:
        return path, plan_from_json(json.load(f))


def restore_statistics(collector: FeatureStatisticsCollector, path: str) -> bool:
    """The collector's totals from the checkpoint at ``path`` (a collective); False, and
    nothing loaded, when it was written without statistics (they then start from zero)."""
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    if not any(k.startswith("statistics.") for k in keys):
        return False
    state = {"statistics": collector.state_dict()}
    load_resharded(path, state)
    collector.load_state_dict(state["statistics"])
    return True
