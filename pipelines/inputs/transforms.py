"""The feature transforms a graph node may apply, vectorized over numpy columns.

A ``Column`` is values plus a validity mask (Arrow's nulls). Each ``Op`` names its inputs'
count, its parameters (type and default; a missing required one or an unknown one is an
error naming the node), its implementation version (part of every key, so a change in what
an op computes never serves old parts) and whether its nodes are materialized by default:
parsing raw columns (``column``) and windowed counts over a user's history (``window_count``)
are the costly steps worth storing; the elementwise ones (``hash``, ``bucketize``, ``log1p``,
``clamp``, ``cross``) cost about what reading their result would, so readers compute them.
Imports numpy and pyarrow only.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa

_REQUIRED = object()
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclasses.dataclass
class Column:
    """A column of one partition: ``values`` (int64 or float32) and ``valid`` (False: null)."""

    values: np.ndarray
    valid: np.ndarray

    @classmethod
    def from_arrow(cls, array: Any) -> "Column":
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if array.null_count == 0:
            return cls(array.to_numpy(zero_copy_only=False), np.ones(len(array), bool))
        # The values buffer as it is (a null's slot holds anything: every op masks by
        # ``valid``) and the validity bitmap unpacked: no fill, no copy of the values.
        bitmap, data = array.buffers()[:2]
        dtype = array.type.to_pandas_dtype()
        values = np.frombuffer(data, dtype=dtype, count=len(array) + array.offset)[array.offset :]
        bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), count=array.offset + len(array), bitorder="little")
        return cls(values, bits[array.offset :].view(bool))  # unpacked bits are 0 or 1: valid bools as they are

    def to_arrow(self) -> pa.Array:
        return pa.array(self.values, mask=None if self.valid.all() else ~self.valid)


def _as_uint64(x: np.ndarray) -> np.ndarray:
    """``x`` as uint64 with two's-complement wrapping: a view of int64 (no copy), else a cast."""
    return x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.uint64)


def splitmix64(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """SplitMix64's finalizer over uint64 (wrapping arithmetic): a fixed, well-mixed hash.
    Into ``out`` (may be ``x`` itself) or a new array; the input is never changed otherwise.
    Every step is in place: readers hash dozens of columns per partition, and a temporary
    per step was most of their time (profiled at 6876757)."""
    x = np.add(_as_uint64(x), _GOLDEN, out=out)
    shifted = np.empty_like(x)
    for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(x, np.uint64(shift), out=shifted)
        x ^= shifted
        x *= np.uint64(multiplier)
    np.right_shift(x, np.uint64(31), out=shifted)
    x ^= shifted
    return x


def _hash_into(values: np.ndarray, buckets: int, salt: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = np.bitwise_xor(_as_uint64(values), np.uint64(salt % 2**64))
        splitmix64(x, out=x)
        x %= np.uint64(buckets)
        return x.view(np.int64)  # < buckets < 2**63: the same values as int64


def window_counts(keys: np.ndarray, valid: np.ndarray, window: int) -> np.ndarray:
    """For each event i, how many of the events i-window .. i-1 share its key (0 for a null
    key), in O(n log n): events sorted by (key, position), each counts the events of its key
    from the first one at position >= i - window up to itself."""
    n = len(keys)
    positions = np.arange(n, dtype=np.int64)
    order = np.lexsort((positions, keys))
    _, key_rank = np.unique(keys[order], return_inverse=True)
    stride = np.int64(n + window + 1)  # positions shifted by window stay in [0, stride)
    composite = key_rank.astype(np.int64) * stride + positions[order] + window
    first_in_window = np.searchsorted(composite, composite - window, side="left")
    counts = np.empty(n, dtype=np.int64)
    counts[order] = np.arange(n) - first_in_window
    return np.where(valid, counts, 0)


def _column(inputs: List[Column], params: Dict[str, Any]) -> Column:
    return inputs[0]


def _log1p(inputs: List[Column], params: Dict[str, Any]) -> Column:
    x = inputs[0]
    out = x.values.astype(np.float32)  # a copy: the rest is in place
    np.maximum(out, np.float32(0.0), out=out)
    np.log1p(out, out=out)
    out[~x.valid] = 0.0
    return Column(out, np.ones(len(x.valid), bool))


def _clamp(inputs: List[Column], params: Dict[str, Any]) -> Column:
    x = inputs[0]
    return Column(np.clip(x.values.astype(np.float32), params["lo"], params["hi"]), x.valid)


def _hash(inputs: List[Column], params: Dict[str, Any]) -> Column:
    x = inputs[0]
    return Column(_hash_into(x.values, params["buckets"], params["salt"]), x.valid)


def _bucketize(inputs: List[Column], params: Dict[str, Any]) -> Column:
    x = inputs[0]
    return Column(np.searchsorted(np.asarray(params["boundaries"]), x.values, side="right").astype(np.int64), x.valid)


def _cross(inputs: List[Column], params: Dict[str, Any]) -> Column:
    mixed = np.zeros(len(inputs[0].values), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for x in inputs:
            mixed ^= _as_uint64(x.values)
            splitmix64(mixed, out=mixed)
    valid = np.logical_and.reduce([x.valid for x in inputs])
    return Column(_hash_into(mixed, params["buckets"], params["salt"]), valid)


def _window_count(inputs: List[Column], params: Dict[str, Any]) -> Column:
    key = inputs[0]
    return Column(window_counts(key.values, key.valid, params["window"]), np.ones(len(key.valid), bool))


@dataclasses.dataclass(frozen=True)
class Op:
    """A transform kind: ``inputs`` is (fewest, most) inputs (None: no limit); ``params``
    maps each parameter to (type, default or required); ``check`` returns what is wrong with
    given values (empty: nothing)."""

    name: str
    apply: Callable[[List[Column], Dict[str, Any]], Column]
    inputs: Tuple[int, Optional[int]]
    params: Dict[str, Tuple[type, Any]]
    materialize: bool
    version: int = 1
    check: Callable[[Dict[str, Any]], str] = lambda params: ""

    def resolved_params(self, given: Dict[str, Any], node: str) -> Dict[str, Any]:
        """``given`` with defaults filled in and types checked; raises naming ``node``."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise ValueError(f"transform {node!r}: op {self.name} takes no parameter {', '.join(unknown)}")
        resolved = {}
        for key, (kind, default) in self.params.items():
            value = given.get(key, default)
            if value is _REQUIRED:
                raise ValueError(f"transform {node!r}: op {self.name} needs parameter {key!r}")
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if kind is list:
                value = [float(v) for v in value] if isinstance(value, (list, tuple)) else value
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"transform {node!r}: parameter {key!r} must be {kind.__name__}, got {value!r}")
            resolved[key] = value
        problem = self.check(resolved)
        if problem:
            raise ValueError(f"transform {node!r}: {problem}")
        return resolved


def _positive_buckets(params: Dict[str, Any]) -> str:
    return "" if params["buckets"] >= 1 else f"buckets must be >= 1, got {params['buckets']}"


OPS: Dict[str, Op] = {
    op.name: op
    for op in (
        Op("column", _column, (1, 1), {}, materialize=True),
        Op("log1p", _log1p, (1, 1), {}, materialize=False),
        Op("clamp", _clamp, (1, 1), {"lo": (float, _REQUIRED), "hi": (float, _REQUIRED)}, materialize=False,
           check=lambda p: "" if p["lo"] <= p["hi"] else f"lo {p['lo']} > hi {p['hi']}"),  # fmt: skip
        Op("hash", _hash, (1, 1), {"buckets": (int, _REQUIRED), "salt": (int, 0)}, materialize=False,
           check=_positive_buckets),  # fmt: skip
        Op("bucketize", _bucketize, (1, 1), {"boundaries": (list, _REQUIRED)}, materialize=False,
           check=lambda p: "" if p["boundaries"] and p["boundaries"] == sorted(p["boundaries"])
           else "boundaries must be a non-empty ascending list"),  # fmt: skip
        Op("cross", _cross, (2, None), {"buckets": (int, _REQUIRED), "salt": (int, 0)}, materialize=False,
           check=_positive_buckets),  # fmt: skip
        Op("window_count", _window_count, (1, 1), {"window": (int, _REQUIRED)}, materialize=True,
           check=lambda p: "" if p["window"] >= 1 else f"window must be >= 1, got {p['window']}"),  # fmt: skip
    )
}
