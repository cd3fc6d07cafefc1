"""Batches for the training app: synthetic click logs (the embedded default) and Criteo files.

``SyntheticClickLog`` (tables alike) yields TorchRec ``Batch`` objects (dense features, a
``KeyedJaggedTensor`` of sparse features, labels) that TorchRec's pipelines accept. Ids
per feature follow a Zipf law (shuffled over the rows), bag lengths vary around the
pooling factor, and labels come from a fixed hidden logistic model of the dense features
and of per-row scores, so a model can learn them. Everything is deterministic per seed
and rank, so the job runs anywhere and runs compare. ``WorkloadClickLog`` does the same
for tables that differ (``tables.workload`` or ``tables.per_table``), drawing on the
device with ``tbe_plugin.workloads``' generator.
"""

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from pipelines.config import ConfigError, DataConfig, TablesConfig
from pipelines.resumable import DataNotReady
from tbe_plugin.workloads import TableWorkload, Workload, ctr_tables_dlrm, generate_batch


def _cycled(
    make_batch: Callable[[int], object], num_batches: int, distinct: int, start: int = 0,
    position_of: Callable[[int], Dict[str, Any]] = lambda produced: {"batches": produced},
) -> Iterator[Tuple[object, Dict[str, Any]]]:  # fmt: skip
    """``(batch, position_of(batches made so far))`` for batches ``start`` .. ``num_batches``
    - 1 (-1: endless), ``make_batch(i)`` for the i-th new one; with ``distinct`` > 0 only
    that many are made, then cycled. Starting past 0 remakes the cycle's first batches
    (a cache of the stream's start, not a position in it)."""
    cycle = [make_batch(i) for i in range(min(start, distinct))]
    produced = start
    while num_batches < 0 or produced < num_batches:
        if distinct and len(cycle) == distinct:
            batch = cycle[produced % distinct]
        else:
            batch = make_batch(produced)
            if distinct:
                cycle.append(batch)
        produced += 1
        yield batch, position_of(produced)


class SyntheticClickLog:
    """An endless (or ``num_batches``-long) stream of batches for one rank: ``stream``
    selects independent samples (training 0, evaluation 1) of the same hidden model."""

    def __init__(
        self, tables: TablesConfig, data: DataConfig, dense_in_features: int, rank: int = 0, num_batches: int = -1,
        stream: int = 0,
    ) -> None:  # fmt: skip
        self.tables, self.data, self.dense_in = tables, data, dense_in_features
        self.num_batches = num_batches
        hidden = np.random.default_rng(data.seed)  # the same hidden model on every rank
        self._dense_weights = hidden.normal(0.0, 1.0, dense_in_features) / np.sqrt(dense_in_features)
        self._row_scores = hidden.normal(0.0, 1.0, (tables.num_tables, tables.rows)).astype(np.float32)
        self._row_order = np.stack([hidden.permutation(tables.rows) for _ in range(tables.num_tables)])
        self._rng = np.random.default_rng([data.seed, rank, stream])  # stream 1: held-out data

    def __iter__(self) -> Iterator[object]:
        return (batch for batch, _ in self.batches_from())

    def batches_from(self, position: Optional[Dict[str, Any]] = None) -> Iterator[Tuple[object, Dict[str, Any]]]:
        """``(batch, position after it)`` from ``position`` (None: the start), on a new
        instance: the position is the batch count and the generator's state, restored as
        saved (with ``distinct_batches`` the cycle is remade)."""
        distinct = getattr(self.data, "distinct_batches", 0)
        start = position["batches"] if position else 0
        if position and not distinct:
            self._rng.bit_generator.state = position["rng"]
        return _cycled(lambda _: self.batch(), self.num_batches, distinct, start,
                       lambda produced: {"batches": produced, "rng": self._rng.bit_generator.state})  # fmt: skip

    def _ids(self, table: int, count: int) -> np.ndarray:
        rows = self.tables.rows
        if self.tables.zipf_alpha == 0:
            return self._rng.integers(0, rows, count)
        ranks = self._rng.zipf(self.tables.zipf_alpha, count)
        while (too_big := ranks > rows).any():
            ranks[too_big] = self._rng.zipf(self.tables.zipf_alpha, int(too_big.sum()))
        return self._row_order[table][ranks - 1]

    def batch(self):
        from torchrec import KeyedJaggedTensor
        from torchrec.datasets.utils import Batch

        B, T = self.data.batch_size, self.tables.num_tables
        dense = self._rng.normal(0.0, 1.0, (B, self.dense_in)).astype(np.float32)
        lengths = self._rng.integers(1, 2 * self.tables.pooling_factor, (T, B))
        ids = [self._ids(t, int(lengths[t].sum())) for t in range(T)]
        score = dense @ self._dense_weights
        for t in range(T):
            bag_of = np.repeat(np.arange(B), lengths[t])
            score += np.bincount(bag_of, weights=self._row_scores[t][ids[t]], minlength=B) / lengths[t] / np.sqrt(T)
        labels = (self._rng.random(B) < 1.0 / (1.0 + np.exp(-2.0 * score))).astype(np.float32)
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{t}" for t in range(T)],
            values=torch.from_numpy(np.concatenate(ids)).long(),
            lengths=torch.from_numpy(lengths.reshape(-1)).long(),
        )
        return Batch(dense_features=torch.from_numpy(dense), sparse_features=features, labels=torch.from_numpy(labels))


def table_workloads(tables: TablesConfig) -> Tuple[TableWorkload, ...]:
    """Each table's rows, bag-length law and Zipf exponent, for tables that differ: the
    named workload's, or ``per_table``'s."""
    if tables.workload == "ctr_dlrm":
        return ctr_tables_dlrm(num_tables=tables.num_tables, dim=tables.dim, seed=tables.workload_seed)
    if not tables.per_table:
        raise ConfigError("tables.per_table: empty and no tables.workload: the tables are alike")
    return tuple(TableWorkload(rows=s.rows, dim=tables.dim, mean_pooling=float(s.pooling_factor),
                               pooling=s.bag_lengths, alpha=float(s.zipf_alpha)) for s in tables.per_table)  # fmt: skip


def rows_per_table(tables: TablesConfig) -> List[int]:
    return [tables.rows] * tables.num_tables if tables.alike else [t.rows for t in table_workloads(tables)]


# Multiplier of the per-row label score hash (Knuth's multiplicative hash, 2^32 / golden ratio).
_ROW_HASH = 2654435761


class WorkloadClickLog:
    """Batches on ``device`` over tables that differ (``table_workloads``), ``num_batches``
    of them (-1: endless): the ids and bag lengths of each batch from
    ``tbe_plugin.workloads.generate_batch`` (its one Zipf generator, every table's hot rows
    fixed), dense features N(0, 1), labels from a hidden logistic model of the dense
    features and of a score per (table, row) hashed from the two, so no table-sized array
    is kept and a model can learn them. Deterministic per (seed, rank, stream, batch) on
    one device type; ``data.distinct_batches`` cycles as in ``SyntheticClickLog``."""

    def __init__(
        self, tables: TablesConfig, data: DataConfig, dense_in_features: int, device: torch.device, rank: int = 0,
        num_batches: int = -1, stream: int = 0,
    ) -> None:  # fmt: skip
        self.workload = Workload("click-log", table_workloads(tables), data.batch_size)
        self.data, self.dense_in, self.device = data, dense_in_features, device
        self.rank, self.num_batches, self.stream = rank, num_batches, stream
        hidden = torch.Generator().manual_seed(data.seed)  # the same hidden model on every rank
        self._dense_weights = (torch.randn(dense_in_features, generator=hidden) / dense_in_features**0.5).to(device)

    def __iter__(self) -> Iterator[object]:
        return (batch for batch, _ in self.batches_from())

    def batches_from(self, position: Optional[Dict[str, Any]] = None) -> Iterator[Tuple[object, Dict[str, Any]]]:
        """``(batch, position after it)`` from ``position`` (None: the start): batch i is a
        function of i, so the position is the batch count."""
        return _cycled(self.batch, self.num_batches, self.data.distinct_batches, position["batches"] if position else 0)

    def _row_scores(self, tables: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """A fixed pseudo-random score per (table, row), uniform with variance 1."""
        hashed = (rows * _ROW_HASH + (tables + 1) * 40503 + self.data.seed * 97).remainder_(2**32)
        return (hashed.double() / 2**32 * 2 - 1) * 3**0.5

    def batch(self, index: int):
        from torchrec import KeyedJaggedTensor
        from torchrec.datasets.utils import Batch

        ids_seed, dense_seed = np.random.SeedSequence([self.data.seed, self.rank, self.stream, index]).generate_state(2)
        ids, offsets, _ = generate_batch(self.workload, int(ids_seed), self.device)
        B, T = self.workload.batch_size, self.workload.num_tables
        lengths = offsets.diff()
        g = torch.Generator(device=self.device).manual_seed(int(dense_seed))
        dense = torch.randn(B, self.dense_in, generator=g, device=self.device)
        table_of_id = torch.arange(T, device=self.device).repeat_interleave(lengths.view(T, B).sum(1))
        # Bag sums as differences of one running sum (float64): no atomics, the same labels every run.
        running = torch.zeros(ids.numel() + 1, dtype=torch.float64, device=self.device)
        torch.cumsum(self._row_scores(table_of_id, ids), 0, out=running[1:])
        bag_means = (running[offsets[1:]] - running[offsets[:-1]]) / lengths.clamp(min=1)
        score = dense @ self._dense_weights + (bag_means.view(T, B).sum(0) / T**0.5).float()
        labels = (torch.rand(B, generator=g, device=self.device) < torch.sigmoid(2.0 * score)).float()
        features = KeyedJaggedTensor.from_offsets_sync(keys=[f"f{t}" for t in range(T)], values=ids, offsets=offsets)
        return Batch(dense_features=dense, sparse_features=features, labels=labels)


CRITEO_DENSE, CRITEO_SPARSE = 13, 26


class CriteoTSV:
    """Batches from Criteo-format TSV files, as TorchRec's ``torchrec.datasets.criteo`` reads
    them: per line a 0/1 label, 13 integer features and 26 categorical features in
    hexadecimal, any of them possibly empty. Dense features become ``log(1 + max(x, 0))``
    (0 when empty); categorical ``c`` of feature ``t`` becomes id ``int(c, 16) % rows``, an
    empty one no id. Rank ``r`` of ``world_size`` reads every ``world_size``-th batch, so the
    ranks share the files without overlap; a last partial batch is dropped.

    A file is ready once it exists and, with ``ready_suffix`` (e.g. ``._SUCCESS``), once
    ``<file><ready_suffix>`` exists too (the writer's marker that the file is whole);
    reaching one that is not raises ``DataNotReady`` naming what is missing. The position
    after a batch is the file, the byte offset after the batch's last line and the index
    of the next batch of all ranks."""

    def __init__(
        self, paths, batch_size: int, rows: int, rank: int = 0, world_size: int = 1, ready_suffix: Optional[str] = None,
    ) -> None:  # fmt: skip
        self.paths, self.batch_size, self.rows = [str(p) for p in paths], batch_size, rows
        self.rank, self.world_size, self.ready_suffix = rank, world_size, ready_suffix

    def missing(self, file: int) -> List[str]:
        """What file ``file`` of ``paths`` waits for (empty: it is ready)."""
        wanted = [self.paths[file]] + ([self.paths[file] + self.ready_suffix] if self.ready_suffix else [])
        return [path for path in wanted if not os.path.exists(path)]

    def __iter__(self) -> Iterator[object]:
        return (batch for batch, _ in self.batches_from())

    def batches_from(self, position: Optional[Dict[str, int]] = None) -> Iterator[Tuple[object, Dict[str, int]]]:
        """``(batch, position after it)`` from ``position`` (None: the first file's start)."""
        start = position or {"file": 0, "offset": 0, "batch": 0}
        chunk, index = [], start["batch"]
        for file in range(start["file"], len(self.paths)):
            waiting_for = self.missing(file)
            if waiting_for:
                raise DataNotReady(waiting_for)
            with open(self.paths[file], "rb") as f:
                offset = start["offset"] if file == start["file"] else 0
                f.seek(offset)
                for raw in f:
                    offset += len(raw)
                    line = raw.decode()
                    if not line.strip():
                        continue
                    fields = line.rstrip("\r\n").split("\t")
                    if len(fields) != 1 + CRITEO_DENSE + CRITEO_SPARSE:
                        raise ValueError(f"Criteo line with {len(fields)} columns, expected "
                                         f"{1 + CRITEO_DENSE + CRITEO_SPARSE}")  # fmt: skip
                    chunk.append(fields)
                    if len(chunk) == self.batch_size:
                        if index % self.world_size == self.rank:
                            yield self._batch(chunk), {"file": file, "offset": offset, "batch": index + 1}
                        chunk, index = [], index + 1

    def _batch(self, lines):
        from torchrec import KeyedJaggedTensor
        from torchrec.datasets.utils import Batch

        labels = torch.tensor([float(line[0]) for line in lines])
        dense = torch.tensor(
            [[float(v) if v else 0.0 for v in line[1:1 + CRITEO_DENSE]] for line in lines]
        ).clamp(min=0).log1p()
        lengths, values = [], []
        for t in range(CRITEO_SPARSE):
            column = [line[1 + CRITEO_DENSE + t] for line in lines]
            lengths += [1 if c else 0 for c in column]
            values += [int(c, 16) % self.rows for c in column if c]
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{t}" for t in range(CRITEO_SPARSE)],
            values=torch.tensor(values, dtype=torch.long),
            lengths=torch.tensor(lengths, dtype=torch.long),
        )
        return Batch(dense_features=dense, sparse_features=features, labels=labels)
