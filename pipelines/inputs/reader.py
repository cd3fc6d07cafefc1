"""Readers that ask SIG first: a partition's features from materialized parts where they
exist, computed locally (and published) where they do not.

``SigReader.read(p)`` looks up the materialized nodes that its graph's outputs need (one
lookup per node and partition: a hit or a miss), fetches the hits file by file, looks up
the inputs of each miss in turn, computes the misses and the unmaterialized nodes from
what it has (parsing the raw partition only if some node needs a raw column), publishes the
nodes it computed that SIG stores, and returns the outputs as an Arrow table. A fetched file
that is corrupt is discarded and its nodes recomputed: counted, never served.
``ReaderStats`` counts lookups, hits, misses, corrupt files, raw parses and the reader's CPU
time (``time.process_time``, every thread of the process).

SIG clients: ``StoreClient`` (the library on a ``PartStore``), ``NoSig`` (nothing stored,
nothing published: the compute-locally baseline) and ``pipelines.inputs.service.HttpClient``.
"""

import dataclasses
import logging
import time
from typing import Any, Dict, List, Optional

import pyarrow as pa

from pipelines.inputs.graph import RAW_COLUMNS, TransformGraph, partition_key
from pipelines.inputs.store import CorruptPart, PartStore
from pipelines.inputs.transforms import OPS, Column

log = logging.getLogger(__name__)


class StoreClient:
    """SIG as a library: lookups, fetches and publishes straight on a ``PartStore``."""

    def __init__(self, store: PartStore) -> None:
        self.store = store

    def lookup(self, partition: str, nodes: List[str]) -> Dict[str, str]:
        return self.store.lookup(partition, nodes)

    def fetch(self, partition: str, file: str, nodes: List[str]) -> pa.Table:
        return self.store.read(partition, file, nodes)

    def publish(self, partition: str, table: pa.Table) -> None:
        self.store.write(partition, table)

    def discard(self, partition: str, file: str) -> None:
        self.store.discard(partition, file)


class NoSig:
    """No SIG: every lookup misses and nothing is published (each job computes alone)."""

    def lookup(self, partition: str, nodes: List[str]) -> Dict[str, str]:
        return {}

    def fetch(self, partition: str, file: str, nodes: List[str]) -> pa.Table:
        raise KeyError(f"NoSig holds no file ({file})")

    def publish(self, partition: str, table: pa.Table) -> None:
        pass

    def discard(self, partition: str, file: str) -> None:
        pass


@dataclasses.dataclass
class ReaderStats:
    """What a reader did: every count is per (node, partition) lookup unless it says otherwise."""

    partitions: int = 0
    """Partitions read."""
    lookups: int = 0
    """Materialized nodes asked of SIG."""
    hits: int = 0
    """Lookups served from SIG."""
    misses: int = 0
    """Lookups computed locally (SIG lacked them, or held them corrupt)."""
    corrupt: int = 0
    """Files SIG held that failed their checks (discarded, their nodes recomputed)."""
    raw_parses: int = 0
    """Raw partitions parsed."""
    published: int = 0
    """Nodes computed here and published to SIG."""
    cpu_s: float = 0.0
    """Process CPU time spent reading (all threads)."""
    wall_s: float = 0.0
    """Wall time spent reading."""

    @property
    def hit_rate(self) -> Optional[float]:
        return self.hits / self.lookups if self.lookups else None

    def add(self, other: "ReaderStats") -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def to_json(self) -> Dict[str, Any]:
        return {**dataclasses.asdict(self), "hit_rate": self.hit_rate}

    @classmethod
    def from_json(cls, value: Dict[str, Any]) -> "ReaderStats":
        return cls(**{f.name: value[f.name] for f in dataclasses.fields(cls)})


class SigReader:
    """Reads partitions of ``raw_log`` through ``graph``, asking ``sig`` first; ``publish``:
    write the materialized nodes it had to compute back to SIG; ``outputs``: the nodes it
    returns (None: the graph's label, dense and sparse outputs)."""

    def __init__(
        self, graph: TransformGraph, raw_log: Any, sig: Any, publish: bool = True, outputs: Optional[List[str]] = None,
    ) -> None:  # fmt: skip
        self.graph, self.raw_log, self.sig, self.publish = graph, raw_log, sig, publish
        self.outputs = list(graph.outputs if outputs is None else outputs)
        unknown = [n for n in self.outputs if n not in graph.by_name]
        if unknown:
            raise ValueError(f"outputs: {', '.join(unknown)} not nodes of the graph")
        self.keys = graph.keys()
        self.stats = ReaderStats()

    def _frontier(self, names: List[str], values: Dict[str, Column], looked: Dict[str, Optional[str]]) -> List[str]:
        """The materialized nodes not yet looked up that ``names`` need, walking through the
        unmaterialized ones (a materialized node's inputs are needed only if it misses)."""
        frontier: List[str] = []
        stack = list(names)
        while stack:
            name = stack.pop()
            if name in RAW_COLUMNS or name in values or name in looked or name in frontier:
                continue
            node = self.graph.by_name[name]
            if node.materialized:
                frontier.append(name)
            else:
                stack.extend(node.inputs)
        return frontier

    def _fetch(self, partition: str, hits: Dict[str, str], values: Dict[str, Column], stats: ReaderStats) -> List[str]:
        """Fetches the hits into ``values`` one file at a time; returns the nodes whose file
        was corrupt (discarded: they are misses now)."""
        by_file: Dict[str, List[str]] = {}
        for name, file in hits.items():
            by_file.setdefault(file, []).append(name)
        lost: List[str] = []
        for file, names in by_file.items():
            try:
                table = self.sig.fetch(partition, file, [self.keys[n] for n in names])
            except CorruptPart as error:
                log.warning("%s; discarding it and recomputing %d nodes", error, len(names))
                self.sig.discard(partition, file)
                stats.corrupt += 1
                lost += names
                continue
            for name in names:
                values[name] = Column.from_arrow(table[self.keys[name]])
        return lost

    def read(self, partition: int) -> pa.Table:
        """The outputs over raw partition ``partition`` (columns named by the nodes)."""
        began_cpu, began_wall = time.process_time(), time.perf_counter()
        stats = ReaderStats(partitions=1)
        key = partition_key(self.raw_log.fingerprint(partition))
        values: Dict[str, Column] = {}
        looked: Dict[str, Optional[str]] = {}  # node -> its file, None on a miss
        frontier = self._frontier(self.outputs, values, looked)
        while frontier:
            found = self.sig.lookup(key, [self.keys[n] for n in frontier])
            hits = {n: found[self.keys[n]] for n in frontier if self.keys[n] in found}
            lost = self._fetch(key, hits, values, stats)
            misses = [n for n in frontier if n not in hits or n in lost]
            looked.update({n: hits.get(n) for n in frontier})
            looked.update({n: None for n in lost})
            stats.lookups += len(frontier)
            stats.misses += len(misses)
            stats.hits += len(frontier) - len(misses)
            frontier = self._frontier([i for n in misses for i in self.graph.by_name[n].inputs], values, looked)
        raw: Dict[str, Column] = {}

        def value(name: str) -> Column:
            if name in RAW_COLUMNS:
                if not raw:
                    table = self.raw_log.read(partition)
                    raw.update({c: Column.from_arrow(table[c]) for c in table.column_names})
                    stats.raw_parses += 1
                return raw[name]
            if name not in values:
                node = self.graph.by_name[name]
                values[name] = OPS[node.op].apply([value(i) for i in node.inputs], node.params)
            return values[name]

        outputs = {name: value(name).to_arrow() for name in self.outputs}
        computed = [n for n, file in looked.items() if file is None]
        if self.publish and computed:
            self.sig.publish(key, pa.table({self.keys[n]: values[n].to_arrow() for n in computed}))
            stats.published += len(computed)
        stats.cpu_s = time.process_time() - began_cpu
        stats.wall_s = time.perf_counter() - began_wall
        self.stats.add(stats)
        self.last_stats = stats
        return pa.table(outputs)
