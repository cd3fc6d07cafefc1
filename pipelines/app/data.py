"""Batches for the training app: the planted click log (the embedded default) and Criteo files.

``PlantedClickLog`` yields TorchRec ``Batch`` objects (dense features, a ``KeyedJaggedTensor``
of sparse features, labels) that TorchRec's pipelines accept, drawn fresh every step from a
planted model whose Bayes-optimal predictions are known (``planted_logits``), so an
evaluation reports how far a model is from the best possible; ids follow each table's Zipf
law (``tbe_plugin.workloads.ZipfSampler``). Deterministic per seed, rank and stream on one
device type, so the job runs anywhere and runs compare. ``CriteoTSV`` reads Criteo-format
files. Every source gives ``(batch, position after it)`` from a saved position
(``batches_from``, see ``pipelines.resumable``).
"""

import itertools
import math
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from pipelines.app.config import DataConfig, TablesConfig
from pipelines.resumable import DataNotReady
from tbe_plugin.workloads import TableWorkload, ctr_tables_dlrm, zipf_tables

CPU = torch.device("cpu")


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


def table_workloads(tables: TablesConfig) -> Tuple[TableWorkload, ...]:
    """Each table's rows, bag-length law and Zipf exponent: ``rows``, ``pooling_factor``
    (Poisson lengths) and ``zipf_alpha`` for tables alike, else the named workload's or
    ``per_table``'s."""
    if tables.alike:
        return tuple(TableWorkload(rows=tables.rows, dim=tables.dim, mean_pooling=float(tables.pooling_factor),
                                   pooling="poisson", alpha=float(tables.zipf_alpha))
                     for _ in range(tables.num_tables))  # fmt: skip
    if tables.workload == "ctr_dlrm":
        return ctr_tables_dlrm(num_tables=tables.num_tables, dim=tables.dim, seed=tables.workload_seed)
    return tuple(TableWorkload(rows=s.rows, dim=tables.dim, mean_pooling=float(s.pooling_factor),
                               pooling=s.bag_lengths, alpha=float(s.zipf_alpha)) for s in tables.per_table)  # fmt: skip


def rows_per_table(tables: TablesConfig) -> List[int]:
    return [t.rows for t in table_workloads(tables)]


_MASK32 = 0xFFFFFFFF


def _mix32(keys: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer on int64 tensors holding 32-bit values: every output
    bit depends on every input bit, so neighbouring rows get unrelated effects. Products
    may wrap in int64; the mask keeps their exact low 32 bits."""
    h = keys & _MASK32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


class PlantedClickLog:
    """Click-log batches from a planted model, so the best any model can do is known.

    Per example: dense features x ~ N(0, I); per table t a bag of ids, its length fixed or
    Poisson(mean pooling), the ids from the table's Zipf law (``tbe_plugin.workloads``'
    ``ZipfSampler``, hot rows fixed per table); the logit

        bias + dense_scale * x.w + id_scale * sum_t (sum of e(t, id) over the bag) / sqrt(T * L_t)

    with w ~ N(0, I / dense_in) fixed by the seed and e(t, row) a hashed effect, uniform
    with variance 1, fixed by (seed, t, row) (no table-sized array); the click
    probability p = flip + (1 - 2 flip) * sigmoid(logit) and the label ~ Bernoulli(p)
    (``data.planted_*``). p is the Bayes-optimal prediction: ``planted_logits(batch)``
    gives logit(p) for any batch of this log, from its features alone, so an evaluation
    can put the model's AUC and log loss beside the optimum's on the same examples.

    Every batch is new (``data.distinct_batches`` > 0 cycles that many, for benchmarks that
    time the model alone) and batch i is a function of (seed, rank, stream, i) and the
    device type: training is stream 0, evaluation stream 1, never the same examples. Drawn
    on ``device`` (the GPU when training on one) without waiting for the device: a
    Poisson table's id count is drawn on the host and spread over the bags uniformly
    (iid Poisson lengths are exactly that, given their total), so the host knows every
    size before a kernel runs. On a GPU all tables are drawn together (``ZipfTables``): a
    batch costs some thirty kernels whatever the number of tables (on a CPU table by
    table, the same ids: faster there). On a GPU the next batch is
    drawn while this one trains (one ahead, on a stream of its own), so the host does not
    wait for the drawing behind the training's queued kernels."""

    def __init__(
        self, tables: TablesConfig, data: DataConfig, dense_in_features: int, device: torch.device = CPU,
        rank: int = 0, num_batches: int = -1, stream: int = 0,
    ) -> None:  # fmt: skip
        self.tables = table_workloads(tables)
        capped = [t for t, table in enumerate(self.tables) if table.max_pooling is not None]
        if capped:
            raise ValueError(f"tables {capped}: max_pooling is not supported by the planted click log")
        self.data, self.dense_in, self.device = data, dense_in_features, torch.device(device)
        self.rank, self.num_batches, self.stream = rank, num_batches, stream
        hidden = torch.Generator().manual_seed(data.seed)  # the same planted model on every rank
        self._dense_weights = (torch.randn(dense_in_features, generator=hidden) / dense_in_features**0.5).to(device)
        T = len(self.tables)
        scales = [data.planted_id_scale / math.sqrt(T * t.mean_pooling) if t.mean_pooling > 0 else 0.0
                  for t in self.tables]  # fmt: skip
        self._id_scales = torch.tensor(scales, dtype=torch.float64, device=device)
        self._sampler = zipf_tables(tuple((t.rows, t.alpha) for t in self.tables))
        self._poisson = [t for t, table in enumerate(self.tables) if table.pooling != "fixed"]
        self._poisson_tables = torch.tensor(self._poisson, dtype=torch.int64, device=device)
        fixed = [round(table.mean_pooling) if table.pooling == "fixed" else -1 for table in self.tables]
        self._fixed_lengths = torch.tensor(fixed, dtype=torch.int64, device=device)[:, None]  # -1: Poisson
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._ahead: Optional[Tuple[int, Any, Any]] = None  # (index, batch, its stream's event) drawn one ahead

    def __iter__(self) -> Iterator[object]:
        return (batch for batch, _ in self.batches_from())

    def batches_from(self, position: Optional[Dict[str, Any]] = None) -> Iterator[Tuple[object, Dict[str, Any]]]:
        """``(batch, position after it)`` from ``position`` (None: the start): batch i is a
        function of i, so the position is the batch count."""
        return _cycled(self.batch, self.num_batches, self.data.distinct_batches, position["batches"] if position else 0)

    def _row_effects(self, tables: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """e(t, row): uniform on [-sqrt 3, sqrt 3] (variance 1), float64."""
        keys = rows * 0x9E3779B1 + (tables + 1) * 0x7FEB352D + (self.data.seed + 1) * 0x846CA68B
        return (_mix32(keys).double() / 2**32 * 2 - 1) * 3**0.5

    def _bag_lengths(self, counts: List[int], g: torch.Generator) -> torch.Tensor:
        """Every table's bag lengths, table after table (int64, T * B): fixed tables their
        length, a Poisson table's ``counts[t]`` ids each put in a uniform bag."""
        B, T = self.data.batch_size, len(self.tables)
        spread = [counts[t] for t in self._poisson]
        total = sum(spread)
        lengths = torch.zeros(T * B, dtype=torch.int64, device=self.device)
        if total:
            table_of = torch.repeat_interleave(self._poisson_tables, torch.tensor(spread, device=self.device),
                                               output_size=total)  # fmt: skip
            bags = torch.randint(0, B, (total,), generator=g, device=self.device) + table_of * B
            lengths.index_add_(0, bags, torch.ones_like(bags))
        fixed = self._fixed_lengths
        return torch.where(fixed >= 0, fixed, lengths.view(T, B)).reshape(-1)

    def batch(self, index: int):
        """Batch ``index``. On CUDA it is drawn on a stream of its own, concurrent with the
        training's kernels, and is whole when returned (the host waits for that stream's
        event, recorded when it was drawn, normally a step earlier: batch ``index + 1`` is
        drawn before this one is returned), so any stream may read it; its memory is kept
        for the current stream's pending work (``record_stream``) when it is freed."""
        if self._stream is None:
            return self._draw(index)
        ahead, self._ahead = self._ahead, None
        batch, ready = ahead[1:] if ahead is not None and ahead[0] == index else self._draw_on_stream(index)
        distinct = self.data.distinct_batches  # a cycled log draws only that many
        if (self.num_batches < 0 or index + 1 < self.num_batches) and (not distinct or index + 1 < distinct):
            self._ahead = (index + 1, *self._draw_on_stream(index + 1))
        ready.synchronize()
        batch.record_stream(torch.cuda.current_stream(self.device))
        return batch

    def _draw_on_stream(self, index: int):
        with torch.cuda.stream(self._stream):
            batch = self._draw(index)
            ready = self._stream.record_event()
        return batch, ready

    def _draw(self, index: int):
        from torchrec import KeyedJaggedTensor
        from torchrec.datasets.utils import Batch

        B, T = self.data.batch_size, len(self.tables)
        seeds = np.random.SeedSequence([self.data.seed, self.rank, self.stream, index])
        counts_rng = np.random.default_rng(seeds.spawn(1)[0])
        counts = [round(t.mean_pooling) * B if t.pooling == "fixed" else int(counts_rng.poisson(t.mean_pooling * B))
                  for t in self.tables]  # fmt: skip
        g = torch.Generator(device=self.device).manual_seed(int(seeds.generate_state(1)[0]))
        lengths = self._bag_lengths(counts, g)
        ids = self._sampler.sample(counts, g, self.device)
        dense = torch.randn(B, self.dense_in, generator=g, device=self.device)
        features = KeyedJaggedTensor(
            keys=[f"f{t}" for t in range(T)], values=ids, lengths=lengths, stride=B,
            length_per_key=counts, offset_per_key=[0, *itertools.accumulate(counts)],
        )  # fmt: skip
        probability = self._probability(self._logits(dense, features))
        labels = (torch.rand(B, generator=g, device=self.device) < probability).float()
        return Batch(dense_features=dense, sparse_features=features, labels=labels)

    def _logits(self, dense: torch.Tensor, features: Any) -> torch.Tensor:
        """The planted logit of every example (float64)."""
        B, T = dense.size(0), len(self.tables)
        counts = features.length_per_key()
        values = features.values()
        table_of_id = torch.repeat_interleave(torch.arange(T, device=values.device),
                                              torch.tensor(counts, device=values.device), output_size=len(values))
        # Bag sums as differences of one running sum (float64): no atomics, the same labels every run.
        running = torch.zeros(values.numel() + 1, dtype=torch.float64, device=values.device)
        torch.cumsum(self._row_effects(table_of_id, values), 0, out=running[1:])
        ends = torch.cumsum(features.lengths(), 0)
        bag_sums = running[ends] - running[ends - features.lengths()]
        id_part = (bag_sums.view(T, B) * self._id_scales[:, None]).sum(0)
        dense_part = dense.double() @ self._dense_weights.double()
        return self.data.planted_bias + self.data.planted_dense_scale * dense_part + id_part

    def _probability(self, logits: torch.Tensor) -> torch.Tensor:
        flip = self.data.planted_label_flip
        return flip + (1 - 2 * flip) * torch.sigmoid(logits)

    def planted_logits(self, batch: Any) -> torch.Tensor:
        """logit(p) of every example of ``batch`` (a batch of this log): the Bayes-optimal
        prediction, float32 on the batch's device."""
        p = self._probability(self._logits(batch.dense_features, batch.sparse_features))
        return (torch.log(p) - torch.log1p(-p)).float()


class SyntheticClickLog(PlantedClickLog):
    """``PlantedClickLog`` drawn on the host, in the argument order its callers without a
    device use (``pipelines.bench.pipeline`` pins its batches and copies them itself)."""

    def __init__(
        self, tables: TablesConfig, data: DataConfig, dense_in_features: int, rank: int = 0, num_batches: int = -1,
        stream: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(tables, data, dense_in_features, CPU, rank, num_batches, stream)


# The name the end-to-end benchmark imports: tables that differ are no special case now.
WorkloadClickLog = PlantedClickLog


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
