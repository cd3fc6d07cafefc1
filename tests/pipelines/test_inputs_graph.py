"""SIG's transform graph and raw logs: stable keys (definition + inputs, not names), graph
validation naming the node, the transforms against plain references, Criteo-format parsing."""

import numpy as np
import pyarrow.compute as pc
import pytest

from pipelines.inputs.graph import Transform, TransformGraph, ctr_graph, partition_key
from pipelines.inputs.raw import RAW_SCHEMA, RawLogError, SyntheticRawLog, TsvRawLog, parse_tsv
from pipelines.inputs.transforms import OPS, Column, window_counts


def small_graph(buckets=100, version=1, name="h"):
    nodes = [
        Transform("y", "column", ["label"]),
        Transform("raw", "column", ["c3"]),
        Transform(name, "hash", ["raw"], {"buckets": buckets}, version=version),
        Transform("d", "log1p", ["i0"]),
    ]
    return TransformGraph(nodes, label="y", dense=["d"], sparse=[name])


def test_keys_hash_definition_and_inputs_not_names():
    base = small_graph()
    renamed = small_graph(name="other_name")
    assert base.key("h") == renamed.key("other_name")
    assert base.key("h") == TransformGraph.from_json(base.to_json()).key("h")
    assert base.key("h") != small_graph(buckets=101).key("h")  # a parameter
    assert base.key("h") != small_graph(version=2).key("h")  # the author's version
    # A changed input changes every key downstream of it.
    moved = TransformGraph([Transform("y", "column", ["label"]), Transform("raw", "column", ["c4"]),
                            Transform("h", "hash", ["raw"], {"buckets": 100}), Transform("d", "log1p", ["i0"])],
                           label="y", dense=["d"], sparse=["h"])  # fmt: skip
    assert moved.key("raw") != base.key("raw") and moved.key("h") != base.key("h")
    assert moved.key("d") == base.key("d")
    # Defaults are hashed resolved: an explicit default is the same transform.
    explicit = TransformGraph([Transform("y", "column", ["label"]), Transform("raw", "column", ["c3"]),
                               Transform("h", "hash", ["raw"], {"buckets": 100, "salt": 0}),
                               Transform("d", "log1p", ["i0"])], label="y", dense=["d"], sparse=["h"])  # fmt: skip
    assert explicit.key("h") == base.key("h")


def test_partition_keys_follow_the_data_range(tmp_path):
    log = SyntheticRawLog(str(tmp_path), rows=10, seed=3)
    assert partition_key(log.fingerprint(0)) == partition_key(SyntheticRawLog("elsewhere", rows=10, seed=3).fingerprint(0))
    assert len({partition_key(log.fingerprint(p)) for p in range(3)}) == 3
    assert partition_key(log.fingerprint(0)) != partition_key(SyntheticRawLog(str(tmp_path), rows=11, seed=3).fingerprint(0))


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "nope", "inputs": ["a"]}], "op 'nope'"),
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "hash", "inputs": ["a"]}], "needs parameter 'buckets'"),
        ([Transform("a", "column", ["label"]),
          {"name": "b", "op": "hash", "inputs": ["a"], "params": {"buckets": 3, "bins": 2}}], "no parameter bins"),
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "hash", "inputs": ["zz"], "params": {"buckets": 3}}],
         "input 'zz'"),
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "column", "inputs": ["a"]}], "reads a raw column"),
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "cross", "inputs": ["a"], "params": {"buckets": 3}}],
         "takes 2 or more inputs"),
        ([Transform("a", "column", ["label"]), {"name": "b", "op": "log1p", "inputs": ["c"]},
          {"name": "c", "op": "log1p", "inputs": ["b"]}], "cycle"),
        ([Transform("a", "column", ["label"]), {"name": "label", "op": "log1p", "inputs": ["a"]}], "raw column"),
    ],
)  # fmt: skip
def test_bad_graphs_fail_naming_the_node(nodes, message):
    with pytest.raises(ValueError, match=message):
        TransformGraph(nodes, label="a", dense=["a"], sparse=[])


def test_shared_fraction_and_needed_order():
    a = ctr_graph(num_sparse=8, rows=1000)
    b = ctr_graph(num_sparse=8, rows=1000, bucket_rows={0: 50}, window=32)
    needed = a.needed()
    for name in needed:  # inputs first
        assert all(i not in a.by_name or needed.index(i) < needed.index(name) for i in a.by_name[name].inputs)
    # b changes one hash node, the window count and the bucketized activity over it.
    assert b.shared_fraction(a) == pytest.approx(1 - 3 / len(b.needed()))
    assert a.shared_fraction(a) == 1.0


def test_window_counts_match_a_plain_loop():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 7, 400)
    valid = rng.random(400) > 0.1
    for window in (1, 5, 64, 1000):
        expected = [int(valid[i]) * sum(keys[j] == keys[i] for j in range(max(0, i - window), i)) for i in range(400)]
        assert window_counts(keys, valid, window).tolist() == expected


def test_transforms_keep_nulls_and_ranges():
    x = Column(np.array([5, -3, 7, 123456789], dtype=np.int64), np.array([True, True, False, True]))
    y = Column(np.array([1, 2, 3, 4], dtype=np.int64), np.array([True, False, True, True]))
    hashed = OPS["hash"].apply([x], {"buckets": 10, "salt": 0})
    assert hashed.valid.tolist() == x.valid.tolist() and ((hashed.values >= 0) & (hashed.values < 10)).all()
    assert OPS["hash"].apply([x], {"buckets": 10, "salt": 1}).values.tolist() != hashed.values.tolist()
    crossed = OPS["cross"].apply([x, y], {"buckets": 1000, "salt": 0})
    assert crossed.valid.tolist() == [True, False, False, True]
    logged = OPS["log1p"].apply([x], {})
    np.testing.assert_allclose(logged.values, [np.log1p(5), 0.0, 0.0, np.log1p(123456789)], rtol=1e-6)
    assert logged.valid.all()  # a missing count is 0
    binned = OPS["bucketize"].apply([x], {"boundaries": [0.0, 6.0]})
    assert binned.values[[0, 1, 3]].tolist() == [1, 0, 2]
    clamped = OPS["clamp"].apply([x], {"lo": 0.0, "hi": 6.0})
    assert clamped.values[[0, 1, 3]].tolist() == [5.0, 0.0, 6.0]
    # Arrow round trip keeps the nulls.
    assert Column.from_arrow(hashed.to_arrow()).valid.tolist() == hashed.valid.tolist()


def test_criteo_tsv_lines_parse_as_torchrec_reads_them(tmp_path):
    ints = ["1", "", "-1"] + [str(k) for k in range(10)]
    cats = ["68fd1e64", "", "0000000a"] + [f"{k:08x}" for k in range(23)]
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(["\t".join(["1"] + ints + cats), "\t".join(["0"] + [""] * 13 + [""] * 26)]) + "\n")
    table = parse_tsv(str(path))
    assert table.schema == RAW_SCHEMA and table.num_rows == 2
    row = {name: values[0] for name, values in table.to_pydict().items()}
    assert row["label"] == 1 and row["i0"] == 1 and row["i1"] is None and row["i2"] == -1
    assert row["c0"] == int("68fd1e64", 16) and row["c1"] is None and row["c2"] == 10
    assert all(v is None for k, v in table.slice(1).to_pylist()[0].items() if k != "label")
    log = TsvRawLog([str(path)])
    assert log.read(0).equals(table) and log.fingerprint(0)["bytes"] == path.stat().st_size
    with pytest.raises(IndexError, match="partition 1"):
        log.read(1)


@pytest.mark.parametrize("line, message", [("1\t2\t3", "not a Criteo-format"),
                                           ("1" + "\t" * 13 + "\tzz" + "\t" * 25, "not hexadecimal"),
                                           ("1" + "\t" * 13 + "\t123456789" + "\t" * 25, "9 hex digits")])  # fmt: skip
def test_malformed_tsv_fails_naming_the_file(tmp_path, line, message):
    path = tmp_path / "bad.tsv"
    path.write_text(line + "\n")
    with pytest.raises(RawLogError, match=message) as error:
        parse_tsv(str(path))
    assert "bad.tsv" in str(error.value)


def test_synthetic_log_is_deterministic_and_round_trips_its_hex(tmp_path):
    log = SyntheticRawLog(str(tmp_path / "a"), rows=300, seed=1, users=50)
    table = log.read(2)
    fields = log.generate(2)
    again = SyntheticRawLog(str(tmp_path / "b"), rows=300, seed=1, users=50).read(2)
    assert table.equals(again) and table.num_rows == 300
    for k in (0, 5, 25):
        expected = [None if s is None else int(s, 16) for s in fields[f"c{k}"].to_pylist()]
        assert table[f"c{k}"].to_pylist() == expected
    assert table["c0"].null_count == 0 and len(set(table["c0"].to_pylist())) <= 50
    assert 0.05 < np.mean(table["label"].to_numpy()) < 0.7
    assert not table.equals(log.read(3))
    assert pc.min(table["i0"]).as_py() == -1  # as Criteo's first integer column


def _splitmix64_reference(x: int) -> int:
    mask = 2**64 - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_hashes_are_splitmix64_exactly_and_leave_their_inputs_alone():
    """Stored parts are keyed by the op's version, not its output: the hash must never drift.
    Plain Python integers as the reference, negative ids (two's complement) included."""
    from pipelines.inputs.transforms import splitmix64

    ids = np.array([0, 1, -1, 2**62 + 12345, -(2**63), 0x1D2E3F4A], dtype=np.int64)
    kept = ids.copy()
    as_unsigned = [int(v) % 2**64 for v in ids]
    assert splitmix64(ids).tolist() == [_splitmix64_reference(v) for v in as_unsigned]
    hashed = OPS["hash"].apply([Column(ids, np.ones(len(ids), bool))], {"buckets": 1000, "salt": 7})
    assert hashed.values.tolist() == [_splitmix64_reference(v ^ 7) % 1000 for v in as_unsigned]
    crossed = OPS["cross"].apply([Column(ids, np.ones(len(ids), bool)), Column(ids[::-1].copy(), np.ones(len(ids), bool))],
                                 {"buckets": 97, "salt": 0})  # fmt: skip
    mixed = [_splitmix64_reference(_splitmix64_reference(a) ^ b) for a, b in zip(as_unsigned, as_unsigned[::-1])]
    assert crossed.values.tolist() == [_splitmix64_reference(m) % 97 for m in mixed]  # then hashed with salt 0
    assert (ids == kept).all()
