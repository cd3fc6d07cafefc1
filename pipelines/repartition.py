"""Partitioning in the training app: the ``sharding.preset`` constraints, the feature
statistics of the batches the job trains on, and the imbalance report of its plan.

``preset_constraints`` turns a preset (``tbe_plugin.torchrec.partition.PRESETS``) into
TorchRec ``ParameterConstraints`` for the app's planner; ``balanced`` takes the pooling
factors and column widths from a statistics file (``sharding.statistics_file``, a
``FeatureStatistics`` JSON such as a previous run wrote). ``ObservedBatches`` shows every
batch's sparse features to a ``FeatureStatisticsCollector`` as the pipeline draws it (one
step in ``sharding.statistics_every`` is sampled, on the device, without a host sync);
``report_imbalance`` sums them over the ranks and prices the running plan with them.

Imports ``tbe_plugin.torchrec``; ``pipelines.train`` imports it.
"""

from typing import Any, Dict, Iterator, List, Optional

import torch

from tbe_plugin.torchrec.cost import (
    CostModel,
    ImbalanceReport,
    KernelSpeed,
    default_kernel_benchmark,
    imbalance_report,
    shards_of_plan,
)
from tbe_plugin.torchrec.partition import PRESETS
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
    ``pipelines.train.build_model`` names them) sampling one step in ``every``."""
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

    statistics = collector.statistics({"source": "pipelines.train"})
    topology = Topology(world_size=world_size, local_world_size=local_world_size, compute_device=device_type)
    kernel = KernelSpeed.from_benchmark(kernel_benchmark or default_kernel_benchmark())
    model = CostModel.from_topology(topology, kernel, rank_batch_size)
    return statistics, imbalance_report(shards_of_plan(dmp.plan), statistics, model)
