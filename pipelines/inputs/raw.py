"""Raw click-event logs that the transform graph runs on, one partition (a data range) at a time.

A raw log is a sequence of partitions, each a file of Criteo-format TSV lines in event order
(a 0/1 label, 13 integer columns, 26 hexadecimal categorical columns, any of them possibly
empty). ``read(p)`` parses partition ``p`` into an Arrow table with the columns of
``RAW_SCHEMA`` (``label``, ``i0`` .. ``i12``, ``c0`` .. ``c25``; empty fields are nulls,
categorical values decoded to integers); ``fingerprint(p)`` is a JSON value naming the
partition's content, which the graph hashes into every key over that partition.

``TsvRawLog`` reads given files (Criteo's day files split into pieces, or any log in that
format). ``SyntheticRawLog`` writes a deterministic click log of that format into a
directory on first use of each partition (users in ``c0``, Zipf-like ids, learnable labels)
and reads it back the same way, so computing a partition locally pays the parse that a
real log costs. Imports pyarrow and numpy only.
"""

import json
import os
import uuid
from typing import Any, Dict, List, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

RAW_DENSE, RAW_SPARSE = 13, 26
DENSE_COLUMNS = tuple(f"i{k}" for k in range(RAW_DENSE))
SPARSE_COLUMNS = tuple(f"c{k}" for k in range(RAW_SPARSE))
RAW_SCHEMA = pa.schema(
    [("label", pa.int8())] + [(c, pa.int64()) for c in DENSE_COLUMNS] + [(c, pa.int64()) for c in SPARSE_COLUMNS]
)
# Bumped when parsing changes what a raw column holds: it is part of every key.
RAW_FORMAT_VERSION = 1
_HEX_DIGITS = 8  # Criteo's categorical values are 32-bit, 8 hex digits

_NIBBLE = np.full(256, 255, dtype=np.uint8)
for _digit, _char in enumerate("0123456789abcdef"):
    _NIBBLE[ord(_char)] = _NIBBLE[ord(_char.upper())] = _digit


class RawLogError(ValueError):
    """A raw partition that cannot be parsed; the message names the file and the column."""


def decode_hex(column: pa.Array, where: str) -> pa.Array:
    """Hexadecimal strings of at most 8 digits as int64, nulls kept (vectorized: the strings
    are padded to 8 digits and their bytes looked up, no Python loop per value)."""
    valid = column.is_valid()
    too_long = pc.max(pc.utf8_length(column)).as_py()
    if too_long is not None and too_long > _HEX_DIGITS:
        raise RawLogError(f"{where}: a value of {too_long} hex digits (at most {_HEX_DIGITS})")
    padded = pc.utf8_lpad(column.fill_null(""), _HEX_DIGITS, "0")
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8, count=len(padded) * _HEX_DIGITS)
    nibbles = _NIBBLE[data].reshape(-1, _HEX_DIGITS)
    if (nibbles == 255).any():
        raise RawLogError(f"{where}: a value that is not hexadecimal")
    shifts = np.arange(4 * (_HEX_DIGITS - 1), -1, -4, dtype=np.uint64)
    values = (nibbles.astype(np.uint64) << shifts).sum(axis=1).astype(np.int64)
    return pa.array(values, mask=~valid.to_numpy(zero_copy_only=False))


def parse_tsv(path: str) -> pa.Table:
    """One Criteo-format TSV file as a table of ``RAW_SCHEMA``."""
    names = [field.name for field in RAW_SCHEMA]
    types = {"label": pa.int8(), **{c: pa.int64() for c in DENSE_COLUMNS}, **{c: pa.string() for c in SPARSE_COLUMNS}}
    try:
        table = pa_csv.read_csv(
            path,
            pa_csv.ReadOptions(column_names=names),
            pa_csv.ParseOptions(delimiter="\t", quote_char=False),
            pa_csv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise RawLogError(f"{path}: not a Criteo-format TSV file ({error})") from error
    columns = [table[name].combine_chunks() for name in names]
    for k, name in enumerate(names):
        if name in SPARSE_COLUMNS:
            columns[k] = decode_hex(columns[k], f"{path}: column {name}")
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


class TsvRawLog:
    """Criteo-format TSV files, partition ``p`` = ``paths[p]``. A partition's fingerprint is
    its file name, size and modification time (what ``make`` trusts): an edited file gets
    new keys; the same file at another path of the same name keeps its keys."""

    def __init__(self, paths: Sequence[str]) -> None:
        if not paths:
            raise ValueError("paths: no TSV files given")
        self.paths = [str(p) for p in paths]

    @property
    def num_partitions(self) -> int:
        return len(self.paths)

    def _check(self, partition: int) -> None:
        if not 0 <= partition < len(self.paths):
            raise IndexError(f"partition {partition}: the log has partitions 0..{len(self.paths) - 1}")

    def fingerprint(self, partition: int) -> Dict[str, Any]:
        self._check(partition)
        stat = os.stat(self.paths[partition])
        return {"kind": "tsv", "format": RAW_FORMAT_VERSION, "name": os.path.basename(self.paths[partition]),
                "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}  # fmt: skip

    def read(self, partition: int) -> pa.Table:
        self._check(partition)
        return parse_tsv(self.paths[partition])

    def spec(self) -> Dict[str, Any]:
        """JSON that ``raw_log_from_spec`` rebuilds this log from (in a reader process)."""
        return {"kind": "tsv", "paths": list(self.paths)}


def _ids(rng: np.random.Generator, cardinality: int, count: int, column: int) -> np.ndarray:
    """Log-uniform popularity ranks in [0, cardinality) (a Zipf law of exponent 1, bounded),
    scattered over 32-bit ids by a fixed multiplicative hash per column."""
    ranks = np.floor(np.exp(rng.random(count) * np.log(cardinality))).astype(np.uint64) - 1
    return ((ranks * np.uint64(2654435761) + np.uint64(column * 40503 + 1)) % np.uint64(2**32)).astype(np.int64)


def _hex_strings(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """32-bit ids as 8-digit lowercase hex strings (vectorized), nulls where not ``valid``."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    chars = digits[(values.astype(np.uint64)[:, None] >> shifts) & np.uint64(15)]
    offsets = np.arange(0, 8 * len(values) + 1, 8, dtype=np.int32)
    strings = pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))
    return pc.if_else(pa.array(valid), strings, pa.nulls(len(values), pa.string()))


class SyntheticRawLog:
    """A deterministic click log of ``rows`` events per partition (endless), written as
    Criteo-format TSV into ``directory`` when a partition is first read (each file written
    whole, then renamed into place, so a reader never parses a partial one).

    ``c0`` is the user (``users`` of them, some far more active than others), ``c1`` ..
    ``c25`` ids of cardinalities from 10 to 10^6, ``i0`` .. ``i12`` heavy-tailed counts
    (``i0`` may be -1, as in Criteo). The label is drawn from a hidden logistic model of the
    counts, of a fixed score per id and of the user's activity over the preceding events,
    so a model over the transformed features can learn it. Nulls: 10% of the counts and 5%
    of ``c1`` .. ``c25``."""

    def __init__(self, directory: str, rows: int = 4096, seed: int = 0, users: int = 2000) -> None:
        if rows < 1:
            raise ValueError(f"rows: must be >= 1, got {rows}")
        if users < 1:
            raise ValueError(f"users: must be >= 1, got {users}")
        self.directory, self.rows, self.seed, self.users = str(directory), rows, seed, users
        self.num_partitions = None  # endless
        self.cardinalities = [users] + [int(round(10 ** (1 + 5 * k / (RAW_SPARSE - 2)))) for k in range(RAW_SPARSE - 1)]

    def fingerprint(self, partition: int) -> Dict[str, Any]:
        if partition < 0:
            raise IndexError(f"partition {partition}: must be >= 0")
        return {"kind": "synthetic", "format": RAW_FORMAT_VERSION, "generator": 1, "seed": self.seed,
                "rows": self.rows, "users": self.users, "partition": partition}  # fmt: skip

    def path(self, partition: int) -> str:
        return os.path.join(self.directory, f"clicks-s{self.seed}-r{self.rows}-u{self.users}-{partition:06d}.tsv")

    def ensure(self, partition: int) -> str:
        """Partition ``partition``'s file, written first if it is not there."""
        path = self.path(partition)
        if not os.path.exists(path):
            os.makedirs(self.directory, exist_ok=True)
            partial = f"{path}.{uuid.uuid4().hex}.partial"
            pa_csv.write_csv(self.generate(partition), partial,
                             pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"))  # fmt: skip
            os.replace(partial, path)  # atomic: a concurrent writer of the same partition wrote the same bytes
        return path

    def read(self, partition: int) -> pa.Table:
        self.fingerprint(partition)  # checks the index
        return parse_tsv(self.ensure(partition))

    def spec(self) -> Dict[str, Any]:
        return {"kind": "synthetic", "directory": self.directory, "rows": self.rows, "seed": self.seed,
                "users": self.users}  # fmt: skip

    def generate(self, partition: int) -> pa.Table:
        """Partition ``partition`` as a table of TSV fields (hex strings for ``c*``)."""
        hidden = np.random.default_rng([self.seed, 2**31 - 1])  # the same model for every partition
        dense_weights = hidden.normal(0.0, 1.0, RAW_DENSE) / np.sqrt(RAW_DENSE)
        user_activity = hidden.pareto(1.5, self.users) + 0.05
        rng = np.random.default_rng([self.seed, partition])
        n = self.rows
        user_rank = rng.choice(self.users, n, p=user_activity / user_activity.sum())
        users = ((user_rank.astype(np.uint64) * np.uint64(2654435761) + np.uint64(1)) % np.uint64(2**32)).astype(np.int64)
        counts = np.floor(np.exp(rng.normal(1.0, 1.2, (RAW_DENSE, n)))).astype(np.int64)
        counts[0] -= rng.random(n) < 0.1  # Criteo's first integer column holds some -1
        dense_valid = rng.random((RAW_DENSE, n)) >= 0.1
        ids = [users] + [_ids(rng, self.cardinalities[k], n, k) for k in range(1, RAW_SPARSE)]
        id_valid = [np.ones(n, bool)] + [rng.random(n) >= 0.05 for _ in range(1, RAW_SPARSE)]
        score = (np.log1p(np.maximum(counts, 0)) * dense_valid - 1.0).T @ dense_weights
        for k in range(1, 6):  # a few columns carry id effects, hashed: no table-sized arrays
            effect = ((ids[k].astype(np.uint64) * np.uint64(0x9E3779B1) >> np.uint64(8)) % np.uint64(1000)) / 500.0 - 1.0
            score += 0.6 * effect * id_valid[k]
        score += 0.5 * np.log1p(_recent_events(user_rank, 256)) - 1.0
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-2.0 * score))).astype(np.int8)
        columns: List[pa.Array] = [pa.array(labels)]
        columns += [pa.array(counts[k], mask=~dense_valid[k]) for k in range(RAW_DENSE)]
        columns += [_hex_strings(ids[k], id_valid[k]) for k in range(RAW_SPARSE)]
        return pa.Table.from_arrays(columns, names=[field.name for field in RAW_SCHEMA])


def _recent_events(keys: np.ndarray, window: int) -> np.ndarray:
    """For each event, how many of the ``window`` events before it have its key."""
    from pipelines.inputs.transforms import window_counts

    return window_counts(keys, np.ones(len(keys), bool), window)


def raw_log_from_spec(spec: Dict[str, Any]):
    """The raw log a ``spec()`` describes (JSON from another process or a config)."""
    kind = spec.get("kind")
    if kind == "tsv":
        return TsvRawLog(spec["paths"])
    if kind == "synthetic":
        return SyntheticRawLog(spec["directory"], rows=int(spec["rows"]), seed=int(spec["seed"]), users=int(spec["users"]))
    raise ValueError(f"raw log spec: kind {kind!r} is not tsv or synthetic ({json.dumps(spec)[:200]})")
