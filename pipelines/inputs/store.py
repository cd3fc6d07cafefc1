"""The SIG store: materialized parts as Parquet files under a URL (fsspec), committed whole.

Layout under the root (a local directory by default; ``s3://``, ``gs://`` ... where their
fsspec backends are installed)::

    parts/<partition key>/<file key>.parquet       columns named by node keys
    parts/<partition key>/<file key>.commit.json   the commit marker, written last
    tmp/<random>.partial                           writes in progress (invisible)

A file holds the nodes one reader (or the service) computed for one partition; its key is
the SHA-256 of its bytes, so two writers of the same content write the same file. A write
goes to ``tmp/``, is moved into ``parts/``, and only then is its commit marker written (also
through ``tmp/``): a reader looks only at commit markers, so a writer killed at any point
leaves nothing visible. The markers are the manifest (``manifest()``): partition, file,
node keys, rows, bytes, SHA-256. Reading a part checks its size and hash against its
marker, then its schema: a truncated or malformed file raises ``CorruptPart`` (the caller
discards it and recomputes) and is never served.

Every path is built from keys checked to be 64 hex digits: no request can name a path
outside the store. Parquet and JSON only. Imports pyarrow and fsspec only.
"""

import hashlib
import json
import logging
import os
import re
import sys
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

_KEY = re.compile(r"^[0-9a-f]{64}$")
COMMIT_SUFFIX, DATA_SUFFIX = ".commit.json", ".parquet"
COMMIT_FORMAT = 1
# Test hook: pause (for a test to kill the process) midway through writing the data
# ("write") or after the data is in place but before its marker ("commit").
FAULT_PAUSE_AT = "PIPELINES_SIG_FAULT_PAUSE_AT"


class CorruptPart(Exception):
    """A committed part that does not match its marker or cannot be parsed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt SIG part {path}: {reason}")
        self.path, self.reason = path, reason


def check_key(key: str, what: str) -> str:
    """``key`` if it is a key (64 lowercase hex digits); raises naming ``what`` otherwise."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"{what}: {str(key)[:80]!r} is not a key (64 hex digits)")
    return key


def commit_record(partition: str, file: str, nodes: List[str], rows: int, size: int, sha256: str) -> Dict[str, Any]:
    return {"format": COMMIT_FORMAT, "partition": partition, "file": file, "nodes": list(nodes), "rows": rows,
            "bytes": size, "sha256": sha256, "created": time.time()}  # fmt: skip


def parse_commit(text: bytes, path: str) -> Dict[str, Any]:
    """A commit marker's record, checked; raises ``CorruptPart`` naming ``path``."""
    try:
        record = json.loads(text)
        assert record["format"] == COMMIT_FORMAT, f"format {record['format']}"
        for field in ("partition", "file", "sha256"):
            check_key(record[field], field)
        for node in record["nodes"]:
            check_key(node, "node")
        assert isinstance(record["rows"], int) and isinstance(record["bytes"], int), "rows and bytes must be ints"
        return record
    except (ValueError, KeyError, TypeError, AssertionError) as error:
        raise CorruptPart(path, f"malformed commit marker ({error})") from error


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


class PartStore:
    """Materialized parts under ``url``; see the module docstring for the layout and the
    commit protocol."""

    def __init__(self, url: str) -> None:
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if self.local:
            self.root = os.path.abspath(self.root)
            os.makedirs(os.path.join(self.root, "tmp"), exist_ok=True)

    def _partition_dir(self, partition: str) -> str:
        return f"{self.root}/parts/{check_key(partition, 'partition')}"

    def _paths(self, partition: str, file: str) -> Dict[str, str]:
        base = f"{self._partition_dir(partition)}/{check_key(file, 'file')}"
        return {"data": base + DATA_SUFFIX, "commit": base + COMMIT_SUFFIX}

    def _put(self, path: str, data: bytes, pause_at: Optional[str] = None) -> None:
        """``data`` at ``path``, whole or not at all: written under ``tmp/``, then moved."""
        partial = f"{self.root}/tmp/{uuid.uuid4().hex}.partial"
        with self.fs.open(partial, "wb") as f:
            if pause_at == "write" and os.environ.get(FAULT_PAUSE_AT) == "write":
                f.write(data[: len(data) // 2])
                f.flush()
                _pause("write")
            f.write(data)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(partial, path)

    def commits(self, partition: str) -> List[Dict[str, Any]]:
        """The committed files of ``partition``, oldest first; a malformed marker is discarded
        (with a warning) and skipped."""
        try:
            names = self.fs.ls(self._partition_dir(partition), detail=False)
        except FileNotFoundError:
            return []
        records = []
        for path in names:
            if not path.endswith(COMMIT_SUFFIX):
                continue
            try:
                record = parse_commit(self.fs.cat_file(path), path)
            except FileNotFoundError:  # discarded meanwhile
                continue
            except CorruptPart as error:
                log.warning("%s; discarding it", error)
                self.fs.rm(path)
                continue
            if path.rsplit("/", 1)[1] != record["file"] + COMMIT_SUFFIX or record["partition"] != partition:
                log.warning("SIG commit marker %s names another file; discarding it", path)
                self.fs.rm(path)
                continue
            records.append(record)
        return sorted(records, key=lambda r: r["created"])

    def lookup(self, partition: str, nodes: Iterable[str]) -> Dict[str, str]:
        """Node key -> the file that holds it in ``partition``, for the nodes committed there."""
        wanted = {check_key(n, "node") for n in nodes}
        found: Dict[str, str] = {}
        for record in self.commits(partition):
            for node in wanted.intersection(record["nodes"]):
                found.setdefault(node, record["file"])
        return found

    def read_bytes(self, partition: str, file: str) -> bytes:
        """The file's bytes, checked against its marker (size, SHA-256) and parsed enough to
        know it is Parquet; raises ``CorruptPart``."""
        paths = self._paths(partition, file)
        try:
            record = parse_commit(self.fs.cat_file(paths["commit"]), paths["commit"])
            data = self.fs.cat_file(paths["data"])
        except FileNotFoundError as error:
            raise CorruptPart(paths["data"], f"missing ({error})") from error
        if len(data) != record["bytes"]:
            raise CorruptPart(paths["data"], f"{len(data)} bytes, the marker says {record['bytes']} (truncated?)")
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            raise CorruptPart(paths["data"], "SHA-256 differs from its commit marker")
        return data

    def read(self, partition: str, file: str, nodes: List[str]) -> pa.Table:
        """Columns ``nodes`` of a committed file, checked (see ``read_bytes``)."""
        data = self.read_bytes(partition, file)
        path = self._paths(partition, file)["data"]
        try:
            # One thread: readers run as a pool of processes, and a decode fanned out over
            # threads costs a reader more CPU time than it saves it wall time.
            table = pq.read_table(pa.BufferReader(data), columns=[check_key(n, "node") for n in nodes], use_threads=False)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as error:
            raise CorruptPart(path, f"not readable as Parquet ({error})") from error
        missing = sorted(set(nodes) - set(table.column_names))
        if missing:
            raise CorruptPart(path, f"lacks the columns of nodes {', '.join(m[:12] for m in missing)}")
        return table

    def write(self, partition: str, table: pa.Table) -> Dict[str, Any]:
        """Commits ``table`` (columns named by node keys) as a file of ``partition``; returns
        its commit record. Writing content that is already committed writes nothing."""
        for name in table.column_names:
            check_key(name, "column (a node key)")
        data = parquet_bytes(table)
        file = hashlib.sha256(data).hexdigest()
        paths = self._paths(partition, file)
        if self.fs.exists(paths["commit"]):
            return parse_commit(self.fs.cat_file(paths["commit"]), paths["commit"])
        self._put(paths["data"], data, pause_at="write")
        if os.environ.get(FAULT_PAUSE_AT) == "commit":
            _pause("commit")
        record = commit_record(partition, file, table.column_names, table.num_rows, len(data), file)
        self._put(paths["commit"], json.dumps(record).encode())
        return record

    def discard(self, partition: str, file: str) -> None:
        """Removes a file from the manifest (its marker first, so no reader is served it
        meanwhile), then its data."""
        paths = self._paths(partition, file)
        for path in (paths["commit"], paths["data"]):
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                pass

    def manifest(self) -> List[Dict[str, Any]]:
        """Every commit record in the store."""
        try:
            partitions = self.fs.ls(f"{self.root}/parts", detail=False)
        except FileNotFoundError:
            return []
        return [r for path in sorted(partitions) for r in self.commits(path.rstrip("/").rsplit("/", 1)[1])]

    def sweep(self, older_than_s: float = 3600.0) -> List[str]:
        """Removes what killed writers left (partial writes, data without a marker) older than
        ``older_than_s``; returns the paths removed."""
        removed = []
        now = time.time()
        leftovers = [p for p in self.fs.ls(f"{self.root}/tmp", detail=False)] if self.fs.exists(f"{self.root}/tmp") else []
        for partition_dir in self.fs.ls(f"{self.root}/parts", detail=False) if self.fs.exists(f"{self.root}/parts") else []:
            names = self.fs.ls(partition_dir, detail=False)
            committed = {n[: -len(COMMIT_SUFFIX)] for n in names if n.endswith(COMMIT_SUFFIX)}
            leftovers += [n for n in names if n.endswith(DATA_SUFFIX) and n[: -len(DATA_SUFFIX)] not in committed]
        for path in leftovers:
            if now - self.fs.modified(path).timestamp() >= older_than_s:
                self.fs.rm(path)
                removed.append(path)
        return removed


def _pause(stage: str) -> None:
    print(f"sig-fault: paused at {stage}", file=sys.stderr, flush=True)
    time.sleep(3600)
