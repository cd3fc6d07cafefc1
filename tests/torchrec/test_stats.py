"""FeatureStatisticsCollector against a plain numpy reference on known batches: pooling
factors, distinct rows, hot-row shares, the heavy rows and row ranges' lookup shares;
no host read on sampled steps; JSON and state_dict round trips."""

import math

import numpy as np
import pytest
import torch
from torchrec import KeyedJaggedTensor

from tbe_plugin.torchrec.stats import (
    HEAVY_ROWS,
    ROW_BUCKETS,
    FeatureStatistics,
    FeatureStatisticsCollector,
    TableInfo,
    merge_heavy_rows,
)

# (name, feature, rows, dim): 2048 rows = 2 rows per bucket, so bucket-aligned ranges are exact;
# 50 rows: hot 0.1% and 1% are both the single hottest row; "extra" is a feature nobody watches.
TABLES = [TableInfo("big", "f_big", 2048, 16), TableInfo("small", "f_small", 50, 8, weight_bytes=2),
          TableInfo("mid", "f_mid", 3000, 32)]  # fmt: skip
HOT_ROW = {"big": 7, "small": 3, "mid": 2999}
BATCH = 32


def make_batch(step: int, rank: int = 0):
    """A KJT with every table's feature and one unwatched one, lengths 0..7 and 12, one
    bag of 40 at step 0 (under 1% of the bags: the p99 is not the max), a hot row drawing
    about a third of the ids."""
    rng = np.random.default_rng([step, rank])
    keys, lengths, values = [], [], []
    for info in TABLES + [TableInfo("x", "extra", 10, 4)]:
        bag_lengths = rng.integers(0, 8, BATCH)
        bag_lengths[rng.random(BATCH) < 0.2] = 12
        if step == 0:
            bag_lengths[0] = 40
        ids = rng.zipf(1.3, int(bag_lengths.sum())) % info.rows
        ids[rng.random(ids.size) < 0.3] = HOT_ROW.get(info.name, 0)
        keys.append(info.feature)
        lengths.append(bag_lengths)
        values.append(ids)
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.tensor(np.concatenate(values)),
                                               lengths=torch.tensor(np.concatenate(lengths)))  # fmt: skip


def reference(batches):
    """The statistics of ``batches`` (lists of KJTs) computed table by table with numpy."""
    out = {}
    for info in TABLES:
        lengths, counts, distinct, hot = [], [], 0, [0, 0]
        for kjt in batches:
            jt = kjt[info.feature]
            ids = jt.values().numpy()
            lengths.append(jt.lengths().numpy())
            rows, row_counts = np.unique(ids, return_counts=True)
            distinct += rows.size
            ordered = np.sort(row_counts)[::-1]
            for i, fraction in enumerate((0.001, 0.01)):
                hot[i] += ordered[: max(1, math.ceil(fraction * info.rows))].sum()
            counts.append(np.bincount(ids, minlength=info.rows))
        lengths = np.sort(np.concatenate(lengths))
        lookups = lengths.sum()
        out[info.name] = {
            "mean_pooling": lookups / lengths.size,
            "p99_pooling": float(lengths[math.ceil(0.99 * lengths.size) - 1]),
            "distinct_per_rank_batch": distinct / len(batches),
            "distinct_fraction": distinct / lookups,
            "hot_0p1pct_share": hot[0] / lookups,
            "hot_1pct_share": hot[1] / lookups,
            "lookups_per_batch": lookups / len(batches),
            "bags_per_batch": lengths.size / len(batches),
            "row_counts": np.sum(counts, 0) / len(batches),
        }
    return out


def collect(steps, sample_every=2):
    collector = FeatureStatisticsCollector(TABLES, torch.device("cpu"), sample_every=sample_every)
    for step in steps:
        collector.observe(make_batch(step))
    return collector


def test_statistics_match_numpy_reference():
    collector = collect(range(9), sample_every=2)
    stats = collector.statistics({"test": True})
    expected = reference([make_batch(s) for s in range(0, 9, 2)])
    assert stats.steps_observed == 9 and stats.world_size == 1 and stats.rank_batch_size == BATCH
    for table in stats.tables:
        want = expected[table.name]
        assert table.batches == 5
        for key in ("mean_pooling", "p99_pooling", "distinct_per_rank_batch", "distinct_fraction",
                    "hot_0p1pct_share", "hot_1pct_share", "lookups_per_batch", "bags_per_batch"):  # fmt: skip
            assert getattr(table, key) == pytest.approx(want[key], rel=1e-12), (table.name, key)
        assert table.p99_pooling == 12  # the bag of 40 is under 1% of the bags
        assert table.bytes_per_lookup == table.dim * table.weight_bytes
        # The hot row is seen on every step, so it is counted exactly, heaviest first.
        row, count = table.heavy_rows[0]
        assert row == HOT_ROW[table.name] and count == pytest.approx(want["row_counts"][row])
        counts = want["row_counts"]
        assert table.lookup_share(0, table.rows) == pytest.approx(1.0)
        # Ranges on bucket edges are exact (heavy rows and the rest of their bucket add up).
        per_bucket = table.rows / ROW_BUCKETS
        if per_bucket == int(per_bucket):
            for first, stop in ((0, 1024), (1024, 2048), (6, 8), (512, 1300)):
                assert table.lookup_share(first, stop) == pytest.approx(counts[first:stop].sum() / counts.sum()), (
                    first, stop)
        else:  # smaller buckets than rows interpolate: a range holding the hot row gets its lookups
            row = HOT_ROW[table.name]
            assert table.lookup_share(row, row + 1) >= counts[row] / counts.sum() - 1e-9


def test_observe_reads_nothing_back_on_sampled_steps(monkeypatch):
    """A sampled step only launches work: no tensor value reaches the host (which would
    wait for the device on a GPU)."""
    collector = FeatureStatisticsCollector(TABLES, torch.device("cpu"), sample_every=1)
    batches = [make_batch(s) for s in range(3)]
    for kjt in batches:  # KJT caches (offsets, length per key) filled before watching
        kjt.length_per_key(), kjt.offset_per_key(), kjt.stride()
    reads = []
    for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique"):
        original = getattr(torch.Tensor, name)

        def watched(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, watched)
    for kjt in batches:
        collector.observe(kjt)
    monkeypatch.undo()
    assert reads == []
    assert collector.statistics().tables[0].batches == 3  # and the steps were counted


def test_json_and_state_dict_round_trip(tmp_path):
    stats = collect(range(6)).statistics({"commit": "abc"})
    path = tmp_path / "stats.json"
    stats.save(str(path))
    loaded = FeatureStatistics.load(str(path))
    assert loaded.to_dict() == stats.to_dict()
    assert loaded.table("small").lookup_share(0, 25) == stats.table("small").lookup_share(0, 25)

    # Resuming from a state_dict after step 5 continues as if never stopped.
    first = collect(range(5), sample_every=3)
    resumed = FeatureStatisticsCollector(TABLES, torch.device("cpu"), sample_every=3)
    resumed.load_state_dict(first.state_dict())
    for step in range(5, 11):
        resumed.observe(make_batch(step))
    assert resumed.statistics().to_dict() == collect(range(11), sample_every=3).statistics().to_dict()
    with pytest.raises(ValueError, match="shape"):
        FeatureStatisticsCollector(TABLES[:2], torch.device("cpu")).load_state_dict(first.state_dict())


def test_merge_heavy_rows_sums_duplicates_and_pads():
    rows = torch.tensor([[5, 3, 5, -1, 9]])
    counts = torch.tensor([[2, 4, 3, 0, 1]])
    top_rows, top_counts = merge_heavy_rows(rows, counts, keep=HEAVY_ROWS)
    assert top_rows[0, :3].tolist() == [5, 3, 9] and top_counts[0, :3].tolist() == [5, 4, 1]
    assert (top_rows[0, 3:] == -1).all() and (top_counts[0, 3:] == 0).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="sample_every"):
        FeatureStatisticsCollector(TABLES, torch.device("cpu"), sample_every=0)
    with pytest.raises(ValueError, match="feature"):
        FeatureStatisticsCollector([TABLES[0], TableInfo("other", "f_big", 10, 4)], torch.device("cpu"))
    collector = FeatureStatisticsCollector(TABLES, torch.device("cpu"), sample_every=1)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f_big"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="f_small"):
        collector.observe(kjt)
