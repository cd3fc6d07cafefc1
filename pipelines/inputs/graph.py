"""Feature transforms as a declared graph whose nodes hash to stable keys.

A ``TransformGraph`` is named, versioned ``Transform`` nodes over raw columns (``label``,
``i0`` .. ``i12``, ``c0`` .. ``c25`` of ``pipelines.inputs.raw``) and over each other, plus
the outputs a job trains on: one label, dense features, sparse features. A node's key is a
SHA-256 over its op (and the op's implementation version), its own version, its resolved
parameters and its inputs' keys, never its name: two jobs that declare the same transform
under different names share it. A materialized part is addressed by (partition key, node
key), the partition key hashing the raw partition's fingerprint: definition + inputs + data
range. Graphs travel between processes as JSON (``to_json`` / ``from_json``).
"""

import dataclasses
import hashlib
import json
import re
from typing import Any, Dict, List, Optional, Sequence

from pipelines.inputs.raw import RAW_FORMAT_VERSION, RAW_SCHEMA
from pipelines.inputs.transforms import OPS

RAW_COLUMNS = tuple(field.name for field in RAW_SCHEMA)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")


def digest(value: Any) -> str:
    """SHA-256 (hex) of ``value``'s canonical JSON: the same value hashes the same anywhere."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def partition_key(fingerprint: Dict[str, Any]) -> str:
    """The key of a raw partition (a data range), from its fingerprint."""
    return digest({"partition": fingerprint})


@dataclasses.dataclass
class Transform:
    """One node of a transform graph."""

    name: str
    """Unique within its graph; not part of the key."""
    op: str
    """One of ``pipelines.inputs.transforms.OPS``."""
    inputs: List[str]
    """Raw column names or other nodes' names, in the op's order."""
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """The op's parameters (JSON values); defaults are filled in before hashing."""
    version: int = 1
    """Bumped by the author to recompute the node (and everything downstream) everywhere."""
    materialize: Optional[bool] = None
    """Stored by SIG (True) or computed by readers from its inputs (False); None: the op's default."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"transform name {self.name!r}: letters, digits, '_', '.', '-' (at most 128)")
        if self.name in RAW_COLUMNS:
            raise ValueError(f"transform {self.name!r}: the name of a raw column")
        if self.op not in OPS:
            raise ValueError(f"transform {self.name!r}: op {self.op!r} is not one of {', '.join(OPS)}")
        if not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"transform {self.name!r}: version must be an int >= 1, got {self.version!r}")
        if self.materialize is not None and not isinstance(self.materialize, bool):
            raise ValueError(f"transform {self.name!r}: materialize must be true, false or null")
        op = OPS[self.op]
        self.inputs = list(self.inputs)
        fewest, most = op.inputs
        if len(self.inputs) < fewest or (most is not None and len(self.inputs) > most):
            wanted = f"{fewest}" if fewest == most else f"{fewest} or more"
            raise ValueError(f"transform {self.name!r}: op {self.op} takes {wanted} inputs, got {len(self.inputs)}")
        if self.op == "column" and self.inputs[0] not in RAW_COLUMNS:
            raise ValueError(f"transform {self.name!r}: op column reads a raw column, not {self.inputs[0]!r}")
        self.params = op.resolved_params(dict(self.params), self.name)

    @property
    def materialized(self) -> bool:
        return OPS[self.op].materialize if self.materialize is None else self.materialize


@dataclasses.dataclass
class TransformGraph:
    """Nodes and the outputs a job reads: ``label`` (one node), ``dense`` and ``sparse``
    (node names, in feature order). Every node is reachable or not; only those the outputs
    need are ever computed."""

    nodes: List[Transform]
    label: str
    dense: List[str]
    sparse: List[str]

    def __post_init__(self) -> None:
        self.nodes = [n if isinstance(n, Transform) else Transform(**n) for n in self.nodes]
        self.by_name: Dict[str, Transform] = {}
        for node in self.nodes:
            if node.name in self.by_name:
                raise ValueError(f"transform graph: two nodes named {node.name!r}")
            self.by_name[node.name] = node
        for node in self.nodes:
            for name in node.inputs:
                if name not in self.by_name and name not in RAW_COLUMNS:
                    raise ValueError(f"transform {node.name!r}: input {name!r} is neither a node nor a raw column")
        for output in [self.label, *self.dense, *self.sparse]:
            if output not in self.by_name:
                raise ValueError(f"transform graph: output {output!r} is not a node")
        if not self.sparse and not self.dense:
            raise ValueError("transform graph: no dense and no sparse outputs")
        self._keys: Dict[str, str] = {}
        for node in self.nodes:
            self.key(node.name)  # also finds cycles

    def key(self, name: str, _visiting: Sequence[str] = ()) -> str:
        """The stable key of node (or raw column) ``name``."""
        if name in RAW_COLUMNS:
            return digest({"raw": name, "format": RAW_FORMAT_VERSION})
        if name not in self._keys:
            if name in _visiting:
                raise ValueError(f"transform graph: a cycle through {' -> '.join([*_visiting, name])}")
            node = self.by_name[name]
            inputs = [self.key(i, (*_visiting, name)) for i in node.inputs]
            self._keys[name] = digest({"op": node.op, "op_version": OPS[node.op].version, "version": node.version,
                                       "params": node.params, "inputs": inputs})  # fmt: skip
        return self._keys[name]

    @property
    def outputs(self) -> List[str]:
        return [self.label, *self.dense, *self.sparse]

    def needed(self) -> List[str]:
        """Every node the outputs depend on, inputs before the nodes that read them."""
        order: List[str] = []

        def visit(name: str) -> None:
            if name in RAW_COLUMNS or name in order:
                return
            for i in self.by_name[name].inputs:
                visit(i)
            order.append(name)

        for output in self.outputs:
            visit(output)
        return order

    def keys(self) -> Dict[str, str]:
        """Name -> key of every node the outputs need."""
        return {name: self.key(name) for name in self.needed()}

    def shared_fraction(self, other: "TransformGraph") -> float:
        """The share of this graph's needed nodes whose key ``other`` needs too."""
        mine, theirs = set(self.keys().values()), set(other.keys().values())
        return len(mine & theirs) / len(mine)

    def to_json(self) -> Dict[str, Any]:
        return {"nodes": [dataclasses.asdict(n) for n in self.nodes], "label": self.label,
                "dense": list(self.dense), "sparse": list(self.sparse)}  # fmt: skip

    @classmethod
    def from_json(cls, value: Dict[str, Any]) -> "TransformGraph":
        unknown = sorted(set(value) - {"nodes", "label", "dense", "sparse"})
        if unknown:
            raise ValueError(f"transform graph JSON: unknown keys {', '.join(unknown)}")
        return cls(nodes=[Transform(**n) for n in value["nodes"]], label=value["label"],
                   dense=list(value["dense"]), sparse=list(value["sparse"]))  # fmt: skip


def ctr_graph(
    num_dense: int = 13, num_sparse: int = 28, rows: int = 100_000, window: int = 64,
    bucket_rows: Optional[Dict[int, int]] = None, cross_columns: Sequence[str] = ("c1", "c2"),
) -> TransformGraph:  # fmt: skip
    """A click-through job's graph: dense ``log1p`` of ``i0`` .. (``num_dense`` <= 13); sparse
    ``hash`` of ``c0`` .., all into ``rows`` buckets (``bucket_rows`` overrides per sparse
    feature), then a ``cross`` of ``cross_columns`` and the user's activity (``c0``'s count
    over the last ``window`` events, bucketized), the last two features when ``num_sparse``
    >= 3. Every raw column read goes through a materialized ``column`` node."""
    if not 1 <= num_dense <= 13:
        raise ValueError(f"num_dense: 1..13 raw integer columns, got {num_dense}")
    if not 3 <= num_sparse <= 28:
        raise ValueError(f"num_sparse: 3..28 (26 hashed columns, a cross, the user's activity), got {num_sparse}")
    bucket_rows = bucket_rows or {}
    nodes = [Transform("click", "column", ["label"])]
    dense = []
    for k in range(num_dense):
        nodes += [Transform(f"raw_i{k}", "column", [f"i{k}"]), Transform(f"dense_{k}", "log1p", [f"raw_i{k}"])]
        dense.append(f"dense_{k}")
    used = sorted({f"c{k}" for k in range(num_sparse - 2)} | set(cross_columns) | {"c0"}, key=lambda c: int(c[1:]))
    nodes += [Transform(f"raw_{c}", "column", [c]) for c in used]
    sparse = []
    for k in range(num_sparse - 2):
        nodes.append(Transform(f"sparse_{k}", "hash", [f"raw_c{k}"], {"buckets": bucket_rows.get(k, rows), "salt": k}))
        sparse.append(f"sparse_{k}")
    nodes += [
        Transform("cross", "cross", [f"raw_{c}" for c in cross_columns], {"buckets": bucket_rows.get(num_sparse - 2, rows)}),
        Transform(f"user_events_{window}", "window_count", ["raw_c0"], {"window": window}),
        Transform("user_activity", "bucketize", [f"user_events_{window}"], {"boundaries": [1, 2, 4, 8, 16, 32]}),
    ]
    return TransformGraph(nodes, label="click", dense=dense, sparse=sparse + ["cross", "user_activity"])
