"""The training app's ``data=sig`` source: TorchRec batches read through SIG.

``SigBatches`` gives ``(batch, position after it)`` pairs, as the app's other sources do
(``pipelines.resumable``). Rank ``r`` of ``W`` reads partitions ``r``, ``r + W``, ... of its
range, cycled (training: the first ``train_partitions``; evaluation: the ``eval_partitions``
after them), each through ``ctr_graph`` (dense ``log1p`` features, hashed ids, a cross, the
user's activity) and cut into batches of ``batch_size`` (a last partial one is dropped).
Training reads through an autoscaled ``ReaderPool`` of reader processes; evaluation in this
process. A position is the index of the partition in the rank's sequence and the batches
already taken from it. This module alone in ``pipelines.inputs`` imports torch.
"""

import itertools
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa
import torch

from pipelines.inputs.graph import TransformGraph, ctr_graph
from pipelines.inputs.pool import ReaderPool, reader_from_spec
from pipelines.inputs.raw import SyntheticRawLog, TsvRawLog
from pipelines.inputs.transforms import Column


def table_batches(table: pa.Table, graph: TransformGraph, batch_size: int, skip: int = 0) -> Iterator[Any]:
    """TorchRec ``Batch``es of ``batch_size`` rows of ``table`` (the graph's outputs), after
    the first ``skip``: dense features float32 (a null is 0), one id or none per sparse
    feature and row, labels float32."""
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch

    dense_columns = [Column.from_arrow(table[n]) for n in graph.dense]
    dense = np.stack([np.where(c.valid, c.values, 0).astype(np.float32) for c in dense_columns], axis=1)
    labels = Column.from_arrow(table[graph.label]).values.astype(np.float32)
    sparse = [Column.from_arrow(table[n]) for n in graph.sparse]
    keys = [f"f{t}" for t in range(len(sparse))]
    for first in range(skip * batch_size, table.num_rows - batch_size + 1, batch_size):
        rows = slice(first, first + batch_size)
        lengths = np.concatenate([c.valid[rows] for c in sparse]).astype(np.int64)
        values = np.concatenate([c.values[rows][c.valid[rows]] for c in sparse]).astype(np.int64)
        features = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values),
                                                       lengths=torch.from_numpy(lengths))  # fmt: skip
        yield Batch(dense_features=torch.from_numpy(dense[rows].copy()), sparse_features=features,
                    labels=torch.from_numpy(labels[rows].copy()))  # fmt: skip


def app_raw_log(sig: Any):
    if sig.raw == "tsv":
        return TsvRawLog(sig.raw_paths)
    return SyntheticRawLog(sig.raw_dir, rows=sig.rows_per_partition, seed=sig.raw_seed)


class SigBatches:
    """Batches for one rank from SIG; ``sig`` is the app's ``data.sig`` config (see
    ``pipelines.app.config.SigDataConfig``), ``stream`` 0 training, 1 evaluation."""

    def __init__(
        self, sig: Any, graph: TransformGraph, batch_size: int, rank: int = 0, world_size: int = 1, stream: int = 0,
    ) -> None:  # fmt: skip
        self.sig, self.graph, self.batch_size = sig, graph, batch_size
        self.rank, self.world_size, self.stream = rank, world_size, stream
        self.raw_log = app_raw_log(sig)
        client = {"kind": "service", "url": sig.service} if sig.service else {"kind": "store", "url": sig.store}
        self.spec = {"graph": graph.to_json(), "raw": self.raw_log.spec(), "sig": client, "publish": sig.publish}
        self.pool: Optional[ReaderPool] = None

    def partition(self, index: int) -> int:
        """The raw partition at ``index`` of this rank's (endless) sequence."""
        step = index * self.world_size + self.rank
        if self.stream == 0:
            return step % self.sig.train_partitions
        return self.sig.train_partitions + step % self.sig.eval_partitions

    def _partitions(self, first: int) -> Iterator[int]:
        return (self.partition(index) for index in itertools.count(first))

    def _tables(self, first: int) -> Iterator[pa.Table]:
        if self.stream != 0:
            reader = reader_from_spec(self.spec)
            yield from (reader.read(p) for p in self._partitions(first))
            return
        policy = self.sig.readers  # a ScalingPolicy, validated with the config
        decisions = self.sig.decisions_file.format(rank=self.rank) if self.sig.decisions_file else None
        self.pool = ReaderPool(self.spec, self._partitions(first), policy, decisions_file=decisions)
        try:
            while (item := self.pool.get()) is not None:
                yield item[1]
        finally:
            self.pool.close()

    def batches_from(self, position: Optional[Dict[str, int]] = None) -> Iterator[Tuple[Any, Dict[str, int]]]:
        """``(batch, position after it)`` from ``position`` (None: the start)."""
        start = position or {"partition": 0, "batch": 0}
        per_partition = self.sig.rows_per_partition // self.batch_size
        index, skip = start["partition"], start["batch"]
        for table in self._tables(index):
            for taken, batch in enumerate(table_batches(table, self.graph, self.batch_size, skip), start=skip + 1):
                after = {"partition": index + 1, "batch": 0} if taken == per_partition else {"partition": index, "batch": taken}
                yield batch, after
            index, skip = index + 1, 0

    def __iter__(self) -> Iterator[Any]:
        return (batch for batch, _ in self.batches_from())


def app_graph(cfg: Any) -> TransformGraph:
    """The transform graph of the app's job (``cfg`` a validated ``TrainConfig``): as many
    dense features as the model takes, one sparse feature per table, hashed into its rows."""
    return ctr_graph(num_dense=cfg.model.dense_in_features, num_sparse=cfg.tables.num_tables, rows=cfg.tables.rows,
                     window=cfg.data.sig.window)  # fmt: skip


def sig_batches(cfg: Any, rank: int, world_size: int, stream: int) -> SigBatches:
    """The app's source for ``data.source=sig`` (``cfg`` a validated ``TrainConfig``)."""
    return SigBatches(cfg.data.sig, app_graph(cfg), cfg.data.batch_size, rank, world_size, stream)

