"""Runtime feature statistics per table, cheap enough to leave on in training.

``FeatureStatisticsCollector.observe(features)`` looks at the ``KeyedJaggedTensor`` of
every step and, on sampled steps, adds to accumulators that stay on the device: bag
lengths (a histogram, for the mean and p99 pooling factor), lookups, distinct rows per
batch, the lookups that fall in the batch's hottest 0.1% and 1% of each table's rows,
lookups per range of rows and the heaviest rows. Every shape is fixed by the table set and
the batch's own sizes, so a sampled step launches kernels and never waits for the device
(no ``.item()``, no data-dependent output size). ``statistics()`` is the one host sync:
it sums the accumulators over the ranks and gives a ``FeatureStatistics``, saved as JSON
(``save`` / ``load``) and through ``state_dict`` with the checkpoints.

What the statistics mean (all per sampled step):

- per-sample quantities (pooling factors, shares) hold at any batch size; sums
  (``lookups_per_batch``, ``bags_per_batch``) are of the global batch, every rank's;
- ``distinct_per_rank_batch``: distinct rows of the table in one rank's batch, averaged
  over ranks and steps (a global batch's distinct rows are at most world size times it);
- ``hot_0p1pct_share`` / ``hot_1pct_share``: share of a rank batch's lookups in its
  ceil(0.001 E) / ceil(0.01 E) most frequent rows (``tbe_plugin.workloads.skew_stats``'
  definition), averaged with the lookups as weights;
- ``heavy_rows``: the ``HEAVY_ROWS`` rows with the most lookups, kept Misra-Gries style
  (a row is counted on the steps it is among a batch's heaviest, so rows that are hot on
  every step are counted exactly), and ``row_buckets``: the other lookups per
  ``ROW_BUCKETS`` equal ranges of rows. Together they give the lookups of any row range
  (``lookup_share``), which is what a row-wise shard serves.

Needs torch and TorchRec's ``KeyedJaggedTensor`` only; ``tbe_plugin.torchrec.partition``
and ``pipelines`` import it.
"""

import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ROW_BUCKETS = 1024
"""Equal ranges of rows whose lookups are counted; a row-wise shard's load interpolates them."""
HEAVY_ROWS = 32
"""Heaviest rows remembered per table, with their lookups (the hot rows a shard may hold)."""
MAX_TRACKED_LENGTH = 1024
"""Bag lengths at or above this are counted as this (the p99 of a longer-tailed feature is a bound)."""
HOT_FRACTIONS = (0.001, 0.01)
"""Fractions of each table's rows whose share of lookups is recorded (the hottest first)."""


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A table the collector watches: the one feature that reads it and its shape."""

    name: str
    """The table's name (TorchRec's ``EmbeddingBagConfig.name``)."""
    feature: str
    """Its feature (the key in the batch's ``KeyedJaggedTensor``); one feature per table."""
    rows: int
    """Rows of the table."""
    dim: int
    """Embedding dimension."""
    weight_bytes: int = 4
    """Bytes per weight element (4: fp32, 2: fp16/bf16)."""

    def __post_init__(self) -> None:
        if self.rows < 1 or self.dim < 1:
            raise ValueError(f"table {self.name}: rows and dim must be >= 1, got {self.rows}, {self.dim}")
        if self.weight_bytes not in (1, 2, 4, 8):
            raise ValueError(f"table {self.name}: weight_bytes must be 1, 2, 4 or 8, got {self.weight_bytes}")


def tables_of_ebc(ebc: Any, weight_bytes: int = 4) -> List[TableInfo]:
    """The ``TableInfo`` of each table of an ``EmbeddingBagCollection`` (or anything with
    ``embedding_bag_configs()``); a table read by several features raises, naming it."""
    infos = []
    for config in ebc.embedding_bag_configs():
        if len(config.feature_names) != 1:
            raise ValueError(f"table {config.name} is read by features {config.feature_names}: "
                             "statistics are per table and need one feature per table")
        infos.append(TableInfo(config.name, config.feature_names[0], config.num_embeddings, config.embedding_dim,
                               weight_bytes))
    return infos


@dataclasses.dataclass
class TableStatistics:
    """What one table's ids did over the sampled steps (module docstring)."""

    name: str
    feature: str
    rows: int
    dim: int
    weight_bytes: int
    batches: int
    """Sampled steps these numbers average over."""
    bags_per_batch: float
    """Bags of the feature per sampled step, all ranks (the global batch)."""
    lookups_per_batch: float
    """Ids per sampled step, all ranks."""
    mean_pooling: float
    """Mean ids per bag."""
    p99_pooling: float
    """99th percentile of ids per bag (at most ``MAX_TRACKED_LENGTH``)."""
    distinct_per_rank_batch: float
    """Distinct rows in one rank's batch, averaged over ranks and steps."""
    distinct_fraction: float
    """Distinct rows per lookup in a rank's batch (the two summed over ranks and steps)."""
    hot_0p1pct_share: float
    """Share of a batch's lookups in its hottest 0.1% of the table's rows."""
    hot_1pct_share: float
    """Share of a batch's lookups in its hottest 1% of the table's rows."""
    heavy_rows: List[Tuple[int, float]]
    """The heaviest rows and their lookups per sampled step, heaviest first."""
    row_buckets: List[float]
    """Lookups per sampled step in each of ``len(row_buckets)`` equal row ranges, heavy rows excluded."""

    @property
    def bytes_per_lookup(self) -> int:
        """Bytes of weights one lookup reads."""
        return self.dim * self.weight_bytes


    def lookup_share(self, first_row: int, stop_row: int) -> float:
        """Share of this table's lookups that hit rows ``[first_row, stop_row)``: the heavy
        rows in the range plus the buckets' lookups, spread evenly within each bucket."""
        first_row, stop_row = max(0, first_row), min(self.rows, stop_row)
        total = self.lookups_per_batch
        if stop_row <= first_row or total <= 0:
            return 0.0
        heavy = sum(count for row, count in self.heavy_rows if first_row <= row < stop_row)
        return (heavy + self._bucket_lookups(stop_row) - self._bucket_lookups(first_row)) / total

    def _bucket_lookups(self, row: int) -> float:
        """Bucket lookups of rows below ``row`` (the piecewise-linear cumulative count)."""
        if not self.row_buckets:
            return 0.0
        cumulative = self.__dict__.get("_cumulative")
        if cumulative is None:
            cumulative = np.concatenate([[0.0], np.cumsum(self.row_buckets)])
            self.__dict__["_cumulative"] = cumulative
        buckets = len(self.row_buckets)
        position = row * buckets / self.rows
        whole = min(int(position), buckets)
        fraction = position - whole if whole < buckets else 0.0
        partial = self.row_buckets[whole] * fraction if whole < buckets else 0.0
        return float(cumulative[whole]) + partial

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["heavy_rows"] = [[int(r), float(c)] for r, c in self.heavy_rows]
        out["bytes_per_lookup"] = self.bytes_per_lookup
        return out

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TableStatistics":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - values.keys()
        if missing:
            raise ValueError(f"table statistics {values.get('name', '?')}: missing {sorted(missing)}")
        kwargs = {k: values[k] for k in names}
        kwargs["heavy_rows"] = [(int(r), float(c)) for r, c in values["heavy_rows"]]
        return cls(**kwargs)


@dataclasses.dataclass
class FeatureStatistics:
    """Every table's statistics and how they were taken."""

    tables: List[TableStatistics]
    """One entry per table, in the collector's order."""
    world_size: int
    """Ranks whose batches were summed."""
    rank_batch_size: int
    """Bags per feature in one rank's batch (the last sampled step's)."""
    sample_every: int
    """One step in this many was sampled."""
    steps_observed: int
    """Steps the collector saw (sampled or not), per rank."""
    provenance: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """Where the numbers come from (a run's config, a commit, or a scaling)."""

    def table(self, name: str) -> TableStatistics:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"no statistics for table {name!r} (have {[t.name for t in self.tables][:8]}...)")

    def to_dict(self) -> Dict[str, Any]:
        return {"world_size": self.world_size, "rank_batch_size": self.rank_batch_size,
                "sample_every": self.sample_every, "steps_observed": self.steps_observed,
                "provenance": self.provenance, "tables": [t.to_dict() for t in self.tables]}  # fmt: skip

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "FeatureStatistics":
        return cls(tables=[TableStatistics.from_dict(t) for t in values["tables"]], world_size=values["world_size"],
                   rank_batch_size=values["rank_batch_size"], sample_every=values["sample_every"],
                   steps_observed=values["steps_observed"], provenance=values.get("provenance", {}))  # fmt: skip

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "FeatureStatistics":
        with open(path) as f:
            return cls.from_dict(json.load(f))


def merge_heavy_rows(rows: torch.Tensor, counts: torch.Tensor, keep: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per table (dim 0), the ``keep`` rows with the most lookups among candidates ``rows``
    (-1: none) with ``counts``, a row's counts summed where it appears more than once.
    Fixed shapes throughout: no host sync. Returns ``(rows, counts)`` of shape [T, keep],
    heaviest first, -1 and 0 where there are fewer rows."""
    order = rows.argsort(dim=1)
    rows, counts = rows.gather(1, order), counts.gather(1, order)
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1]
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    running = counts.cumsum(1)
    before_run = torch.where(starts, running - counts, torch.zeros_like(running)).cummax(1).values
    totals = torch.where(ends & (rows >= 0), running - before_run, torch.zeros_like(running))
    top_counts, top = totals.topk(min(keep, totals.size(1)), dim=1)
    top_rows = torch.where(top_counts > 0, rows.gather(1, top), torch.full_like(top_counts, -1))
    if top_counts.size(1) < keep:  # fewer candidates than kept rows: pad
        pad = keep - top_counts.size(1)
        top_rows = torch.cat([top_rows, top_rows.new_full((rows.size(0), pad), -1)], 1)
        top_counts = torch.cat([top_counts, top_counts.new_zeros((rows.size(0), pad))], 1)
    return top_rows, top_counts


class FeatureStatisticsCollector:
    """Accumulates ``TableStatistics`` from the batches it is shown (module docstring).

    ``observe`` is called once per step on every rank (it counts the steps and samples
    one in ``sample_every``); ``statistics`` and ``state_dict`` are collectives when a
    process group is initialized (every rank calls them, in the same order).
    """

    def __init__(self, tables: Sequence[TableInfo], device: torch.device, sample_every: int = 10) -> None:
        if not tables:
            raise ValueError("tables: the collector needs at least one table")
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        features = [t.feature for t in tables]
        if len(set(features)) != len(features):
            raise ValueError(f"tables: a feature may read one table only, got {features}")
        self.tables, self.device, self.sample_every = list(tables), torch.device(device), sample_every
        self._table_of_feature = {t.feature: i for i, t in enumerate(tables)}
        self._rows = torch.tensor([t.rows for t in tables], dtype=torch.int64, device=self.device)
        self._row_stride = max(t.rows for t in tables)
        self._hot_ranks = torch.tensor([[max(1, math.ceil(f * t.rows)) for t in tables] for f in HOT_FRACTIONS],
                                       dtype=torch.int64, device=self.device)  # fmt: skip
        self._key_tables: Dict[Tuple[str, ...], torch.Tensor] = {}
        self.steps_observed, self.rank_batch_size = 0, 0
        self._reset()

    def _reset(self) -> None:
        T, zeros = len(self.tables), lambda *shape: torch.zeros(*shape, dtype=torch.int64, device=self.device)
        self._acc: Dict[str, torch.Tensor] = {
            "batches": zeros(1), "bags": zeros(T), "lookups": zeros(T), "distinct": zeros(T),
            "hot": zeros(len(HOT_FRACTIONS), T), "lengths": zeros(T, MAX_TRACKED_LENGTH),
            "row_buckets": zeros(T, ROW_BUCKETS), "heavy_rows": torch.full((T, HEAVY_ROWS), -1, dtype=torch.int64,
                                                                             device=self.device),
            "heavy_counts": zeros(T, HEAVY_ROWS),
        }  # fmt: skip

    def observe(self, features: Any) -> None:
        """Counts a step; on sampled steps adds the batch ``features`` (a
        ``KeyedJaggedTensor`` holding every watched feature, one bag per sample) on the
        device. Features not watched are ignored."""
        step, self.steps_observed = self.steps_observed, self.steps_observed + 1
        if step % self.sample_every:
            return
        keys = features.keys()
        missing = [t.feature for t in self.tables if t.feature not in keys]
        if missing:
            raise ValueError(f"batch has no feature {missing[0]!r} (keys {keys[:8]})")
        if features.variable_stride_per_key():
            raise NotImplementedError("statistics of variable batch sizes per feature (VBE) are not supported")
        with torch.no_grad():
            self._add_batch(keys, features.stride(), features.lengths(), features.values())

    def _add_batch(self, keys: List[str], batch: int, lengths: torch.Tensor, values: torch.Tensor) -> None:
        device, acc = self.device, self._acc
        lengths = lengths.to(device, torch.int64, non_blocking=True)
        values = values.to(device, torch.int64, non_blocking=True)
        self.rank_batch_size = batch
        # The watched table of each key (-1: not watched), per bag and per id; kept per key
        # order, so a step copies nothing from the host once the order has been seen.
        table_of_key = self._key_tables.get(tuple(keys))
        if table_of_key is None:
            table_of_key = torch.tensor([self._table_of_feature.get(k, -1) for k in keys], device=device)
            self._key_tables[tuple(keys)] = table_of_key
        bag_table = table_of_key.repeat_interleave(batch)
        id_table = bag_table.repeat_interleave(lengths, output_size=values.numel())
        watched_bags, watched_ids = bag_table >= 0, id_table >= 0
        acc["batches"] += 1
        acc["bags"] += self._per_table(bag_table, watched_bags)
        flat_length = bag_table.clamp(min=0) * MAX_TRACKED_LENGTH + lengths.clamp(max=MAX_TRACKED_LENGTH - 1)
        acc["lengths"].view(-1).index_add_(0, flat_length, watched_bags.to(torch.int64))
        if values.numel() == 0:
            return
        table, rows = id_table.clamp(min=0), self._rows[id_table.clamp(min=0)]
        in_range = watched_ids & (values >= 0) & (values < rows)
        acc["lookups"].index_add_(0, table, in_range.to(torch.int64))
        bucket = (values.clamp(min=0) * ROW_BUCKETS // rows).clamp(max=ROW_BUCKETS - 1)
        acc["row_buckets"].view(-1).index_add_(0, table * ROW_BUCKETS + bucket, in_range.to(torch.int64))
        self._add_runs(torch.where(in_range, table * self._row_stride + values, torch.full_like(values, -1)))

    def _per_table(self, table: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(self.tables), dtype=torch.int64, device=self.device).index_add_(
            0, table.clamp(min=0), mask.to(torch.int64))

    def _add_runs(self, keys: torch.Tensor) -> None:
        """Distinct rows, hot shares and heavy rows from the runs of equal (table, row)
        keys (-1: an id not counted), sorted; then the runs sorted by table and count."""
        acc, n = self._acc, keys.numel()
        keys = keys.sort().values
        counted = keys >= 0
        starts = counted.clone()
        starts[1:] &= keys[1:] != keys[:-1]
        table = (keys // self._row_stride).clamp(min=0)
        distinct = self._per_table(table, starts)
        acc["distinct"] += distinct
        run = starts.cumsum(0) - 1  # run of each id (-1 before the first counted id)
        run_count = torch.zeros(n, dtype=torch.int64, device=self.device).index_add_(
            0, run.clamp(min=0), counted.to(torch.int64))
        run_key = torch.zeros(n, dtype=torch.int64, device=self.device).scatter_(0, run.clamp(min=0), keys.clamp(min=0))
        # Runs of each table together, heaviest first; the unused slots (count 0) last.
        sort_table = torch.where(run_count > 0, run_key // self._row_stride, len(self.tables))
        order = (sort_table * (n + 1) + (n - run_count)).argsort()
        run_count, run_row = run_count[order], (run_key % self._row_stride)[order]
        run_table = sort_table[order].clamp(max=len(self.tables) - 1)  # unused slots add count 0 anywhere
        block_start = distinct.cumsum(0) - distinct
        rank_in_table = torch.arange(n, device=self.device) - block_start[run_table]
        for f in range(len(HOT_FRACTIONS)):
            hot = (rank_in_table < self._hot_ranks[f][run_table]).to(torch.int64) * run_count
            acc["hot"][f].index_add_(0, run_table, hot)
        slots = torch.arange(HEAVY_ROWS, device=self.device)
        position = (block_start[:, None] + slots).clamp(max=n - 1)
        valid = slots < distinct[:, None]
        batch_rows = torch.where(valid, run_row[position], torch.full_like(position, -1))
        batch_counts = torch.where(valid, run_count[position], torch.zeros_like(position))
        acc["heavy_rows"], acc["heavy_counts"] = merge_heavy_rows(
            torch.cat([acc["heavy_rows"], batch_rows], 1), torch.cat([acc["heavy_counts"], batch_counts], 1),
            HEAVY_ROWS)

    def _global(self) -> Dict[str, torch.Tensor]:
        """The accumulators summed over the ranks (a collective when a group is up)."""
        import torch.distributed as dist

        merged = {k: v.clone() for k, v in self._acc.items()}
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return merged
        world = dist.get_world_size()
        for key in ("bags", "lookups", "distinct", "hot", "lengths", "row_buckets"):
            dist.all_reduce(merged[key])
        dist.all_reduce(merged["batches"], op=dist.ReduceOp.MAX)  # every rank samples the same steps
        gathered_rows = [torch.empty_like(merged["heavy_rows"]) for _ in range(world)]
        gathered_counts = [torch.empty_like(merged["heavy_counts"]) for _ in range(world)]
        dist.all_gather(gathered_rows, merged["heavy_rows"])
        dist.all_gather(gathered_counts, merged["heavy_counts"])
        merged["heavy_rows"], merged["heavy_counts"] = merge_heavy_rows(
            torch.cat(gathered_rows, 1), torch.cat(gathered_counts, 1), HEAVY_ROWS)
        return merged

    def statistics(self, provenance: Optional[Dict[str, Any]] = None) -> FeatureStatistics:
        """Every table's statistics over all ranks' sampled steps so far (one host sync)."""
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        acc = {k: v.cpu() for k, v in self._global().items()}
        batches = int(acc["batches"][0])
        per_batch = max(batches, 1)
        tables = []
        for t, info in enumerate(self.tables):
            bags, lookups = int(acc["bags"][t]), int(acc["lookups"][t])
            heavy = [(int(r), int(c)) for r, c in zip(acc["heavy_rows"][t].tolist(), acc["heavy_counts"][t].tolist())
                     if r >= 0]  # fmt: skip
            buckets = acc["row_buckets"][t].double()
            for row, count in heavy:  # the buckets keep the lookups the heavy rows do not account for
                bucket = min(row * ROW_BUCKETS // info.rows, ROW_BUCKETS - 1)
                buckets[bucket] = max(0.0, float(buckets[bucket]) - count)
            hist = acc["lengths"][t]
            tables.append(TableStatistics(
                name=info.name, feature=info.feature, rows=info.rows, dim=info.dim, weight_bytes=info.weight_bytes, batches=batches,
                bags_per_batch=bags / per_batch, lookups_per_batch=lookups / per_batch,
                mean_pooling=lookups / bags if bags else 0.0, p99_pooling=_quantile(hist, 0.99),
                distinct_per_rank_batch=int(acc["distinct"][t]) / per_batch / world,
                distinct_fraction=int(acc["distinct"][t]) / lookups if lookups else 0.0,
                hot_0p1pct_share=int(acc["hot"][0][t]) / lookups if lookups else 0.0,
                hot_1pct_share=int(acc["hot"][1][t]) / lookups if lookups else 0.0,
                heavy_rows=[(r, c / per_batch) for r, c in heavy],
                row_buckets=(buckets / per_batch).tolist(),
            ))  # fmt: skip
        return FeatureStatistics(tables, world_size=world, rank_batch_size=self.rank_batch_size,
                                 sample_every=self.sample_every, steps_observed=self.steps_observed,
                                 provenance=dict(provenance or {}))  # fmt: skip

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The accumulators summed over the ranks (the same on every rank, so a
        checkpoint may keep one copy), the steps seen and the rank batch size."""
        state = self._global()
        state["steps_observed"] = torch.tensor([self.steps_observed, self.rank_batch_size], dtype=torch.int64)
        return state

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Restores ``state_dict``'s totals: rank 0 holds them and the other ranks start
        from zero, so the next sum over ranks counts each lookup once."""
        import torch.distributed as dist

        expected = set(self._acc) | {"steps_observed"}
        if set(state) != expected:
            raise ValueError(f"feature statistics state has keys {sorted(state)}, expected {sorted(expected)}")
        for key, value in self._acc.items():
            if tuple(state[key].shape) != tuple(value.shape):
                raise ValueError(f"feature statistics state {key}: shape {tuple(state[key].shape)}, expected "
                                 f"{tuple(value.shape)} (another table set?)")  # fmt: skip
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self._reset()
        if rank == 0:
            for key in self._acc:
                self._acc[key].copy_(state[key])
        else:
            self._acc["batches"].copy_(state["batches"])
        self.steps_observed, self.rank_batch_size = (int(v) for v in state["steps_observed"].tolist())


def _quantile(histogram: torch.Tensor, q: float) -> float:
    """The smallest length whose cumulative share of bags reaches ``q`` (0 with no bags)."""
    total = int(histogram.sum())
    if total == 0:
        return 0.0
    cumulative = histogram.cumsum(0)
    return float(int(torch.searchsorted(cumulative, torch.tensor(math.ceil(q * total)))))
