"""SIG's store: commits are whole or invisible (a real writer process killed midway leaves
nothing a reader sees), corrupt or truncated parts are detected, discarded and recomputed,
never served, and no key reaches outside the store."""

import json
import os
import signal
import subprocess

import pyarrow as pa
import pytest

from pipelines.inputs.graph import ctr_graph, partition_key
from pipelines.inputs.pool import light_command
from pipelines.inputs.raw import SyntheticRawLog
from pipelines.inputs.reader import NoSig, SigReader, StoreClient
from pipelines.inputs.store import FAULT_PAUSE_AT, CorruptPart, PartStore
from pipelines.inputs.wire import read_frame, write_frame

KEY_A, KEY_B = "a" * 64, "b" * 64


@pytest.fixture
def setup(tmp_path):
    raw = SyntheticRawLog(str(tmp_path / "raw"), rows=800, seed=0, users=100)
    graph = ctr_graph(num_sparse=6, rows=500)
    return raw, graph, PartStore(str(tmp_path / "store"))


def test_write_commit_lookup_read(tmp_path):
    store = PartStore(str(tmp_path))
    table = pa.table({KEY_A: pa.array([1, 2, None]), KEY_B: pa.array([0.5, 1.5, 2.5], pa.float32())})
    record = store.write(KEY_A, table)
    assert store.write(KEY_A, table) == record  # the same content: the same file, committed once
    assert [r["file"] for r in store.manifest()] == [record["file"]]
    assert record["rows"] == 3 and sorted(record["nodes"]) == [KEY_A, KEY_B]
    assert store.lookup(KEY_A, [KEY_A, "c" * 64]) == {KEY_A: record["file"]}
    assert store.lookup(KEY_B, [KEY_A]) == {}
    assert store.read(KEY_A, record["file"], [KEY_B])[KEY_B].equals(table[KEY_B])


@pytest.mark.parametrize("bad", ["../" + "a" * 61, "A" * 64, "a" * 63, "a" * 64 + "/..", ""])
def test_no_key_names_a_path_outside_the_store(tmp_path, bad):
    store = PartStore(str(tmp_path))
    with pytest.raises(ValueError, match="is not a key"):
        store.lookup(bad, [KEY_A])
    with pytest.raises(ValueError, match="is not a key"):
        store.read(KEY_A, bad, [KEY_A])
    with pytest.raises(ValueError, match="is not a key"):
        store.write(KEY_A, pa.table({bad or "x": [1]}))


def _reader_process(spec, stage):
    env = dict(os.environ, **{FAULT_PAUSE_AT: stage})
    process = subprocess.Popen(light_command("pipelines.inputs.pool:reader_main", json.dumps(spec)), env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert read_frame(process.stdout)[0]["ready"]
    return process


@pytest.mark.parametrize("stage", ["write", "commit"])
def test_a_writer_killed_midway_leaves_no_visible_output(setup, stage):
    """A real reader process computes partition 0 and publishes it; it is SIGKILLed halfway
    through writing the data ("write") or with the data moved into place but no marker yet
    ("commit"). Nothing is in the manifest, lookups miss, a sweep removes the leftovers, and
    the next reader recomputes the same features and commits them."""
    raw, graph, store = setup
    spec = {"graph": graph.to_json(), "raw": raw.spec(), "sig": {"kind": "store", "url": store.url}}
    process = _reader_process(spec, stage)
    write_frame(process.stdin, {"op": "read", "task": 0, "partition": 0})
    for line in process.stderr:
        if b"sig-fault: paused at " + stage.encode() in line:
            break
    else:
        pytest.fail(f"the writer never reached {stage}: {process.wait()}")
    partial = [p for p in os.listdir(os.path.join(store.root, "tmp"))]
    assert len(partial) == (1 if stage == "write" else 0)
    if stage == "write":
        assert os.path.getsize(os.path.join(store.root, "tmp", partial[0])) > 0
    process.send_signal(signal.SIGKILL)
    process.wait()
    keys = list(graph.keys().values())
    where = partition_key(raw.fingerprint(0))
    assert store.manifest() == [] and store.lookup(where, keys) == {}
    removed = store.sweep(older_than_s=0)
    assert len(removed) == 1  # the partial write, or the data file that never got its marker
    assert ("/tmp/" if stage == "write" else "/parts/") in removed[0]
    reader = SigReader(graph, raw, StoreClient(store))
    assert reader.read(0).equals(SigReader(graph, raw, NoSig()).read(0))
    assert reader.stats.hits == 0 and reader.stats.misses == reader.stats.lookups > 0
    assert len(store.manifest()) == 1 and store.sweep(older_than_s=0) == []


def _commit(store):
    (record,) = store.manifest()
    base = os.path.join(store.root, "parts", record["partition"], record["file"])
    return record, base + ".parquet", base + ".commit.json"


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_corrupt_parts_are_recomputed_never_served(setup, damage):
    raw, graph, store = setup
    expected = SigReader(graph, raw, StoreClient(store)).read(0)  # computes and commits
    record, data, _ = _commit(store)
    content = open(data, "rb").read()
    if damage == "truncate":
        open(data, "wb").write(content[: len(content) // 2])
    elif damage == "flip":
        open(data, "wb").write(content[:100] + bytes([content[100] ^ 1]) + content[101:])
    else:
        os.remove(data)
    with pytest.raises(CorruptPart, match={"truncate": "truncated", "flip": "SHA-256", "remove": "missing"}[damage]):
        store.read(record["partition"], record["file"], record["nodes"][:1])
    reader = SigReader(graph, raw, StoreClient(store))
    assert reader.read(0).equals(expected)
    assert reader.stats.corrupt == 1 and reader.stats.hits == 0 and reader.stats.misses == reader.stats.lookups
    (fresh,) = store.manifest()
    assert store.read(fresh["partition"], fresh["file"], fresh["nodes"]).num_rows == raw.rows
    again = SigReader(graph, raw, StoreClient(store))
    again.read(0)
    assert again.stats.hits == again.stats.lookups and again.stats.corrupt == 0


def test_a_malformed_commit_marker_is_discarded(setup):
    raw, graph, store = setup
    SigReader(graph, raw, StoreClient(store)).read(0)
    record, data, marker = _commit(store)
    open(marker, "w").write('{"format": 1, "partition": "..')
    assert store.lookup(record["partition"], record["nodes"]) == {}
    assert not os.path.exists(marker)
    reader = SigReader(graph, raw, StoreClient(store))
    reader.read(0)
    assert reader.stats.misses == reader.stats.lookups and len(store.manifest()) == 1
