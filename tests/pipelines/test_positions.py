"""Data positions: a source restarted from the position after its k-th batch (a fresh
instance, as a resumed job makes) yields exactly the batches that followed, for every
source; Criteo files wait for their ready marker; ``PositionedBatches`` keeps the
positions, its limit, and reads ahead for readiness."""

import json
from itertools import islice

import pytest
import torch

from pipelines.app.config import DataConfig, TableSpec, TablesConfig
from pipelines.app.data import CriteoTSV, SyntheticClickLog, WorkloadClickLog
from pipelines.resumable import DataNotReady, PositionedBatches
from tests.pipelines.test_criteo import write_criteo


def _key(batch):
    kjt = batch.sparse_features
    return (batch.labels.tolist(), batch.dense_features.sum().item(), kjt.values().tolist(), kjt.lengths().tolist())


def assert_resumes_exactly(make_source, count):
    """For each k, ``make_source().batches_from(position after k)`` continues the stream."""
    pairs = list(islice(make_source().batches_from(None), count))
    assert len(pairs) == count
    for k in range(count):
        position = json.loads(json.dumps(pairs[k - 1][1] if k else None))  # as train_state.json keeps it
        resumed = [_key(batch) for batch, _ in islice(make_source().batches_from(position), count - k)]
        assert resumed == [_key(batch) for batch, _ in pairs[k:]], k


TABLES = TablesConfig(num_tables=2, rows=50, dim=4, pooling_factor=2)


@pytest.mark.parametrize("distinct", [0, 3])
def test_synthetic_click_log_resumes_exactly(distinct):
    data = DataConfig(batch_size=4, distinct_batches=distinct)
    assert_resumes_exactly(lambda: SyntheticClickLog(TABLES, data, 3, rank=1), 6)


def test_workload_click_log_resumes_exactly():
    tables = TablesConfig(num_tables=2, dim=4, per_table=[TableSpec(40, 2.0, 1.1), TableSpec(60, 1.0, 0.0)])
    data = DataConfig(batch_size=4, distinct_batches=2)
    assert_resumes_exactly(lambda: WorkloadClickLog(tables, data, 3, torch.device("cpu")), 5)


@pytest.mark.parametrize("rank", [0, 1])
def test_criteo_resumes_at_its_file_and_offset(tmp_path, rank):
    """Two files whose batches straddle the boundary (202 lines, batches of 8), dealt to 2 ranks."""
    days = [tmp_path / "day_0.tsv", tmp_path / "day_1.tsv"]
    write_criteo(days[0], 202, seed=0)
    write_criteo(days[1], 60, seed=1)
    assert_resumes_exactly(lambda: CriteoTSV(days, 8, 1000, rank=rank, world_size=2), 16)
    positions = [p for _, p in CriteoTSV(days, 8, 1000, rank=rank, world_size=2).batches_from()]
    assert {p["file"] for p in positions} == {0, 1} and len(positions) == 16  # (202 + 60) // 8 = 32 batches, dealt


def test_criteo_waits_for_a_missing_file_or_marker(tmp_path):
    days = [tmp_path / "day_0.tsv", tmp_path / "day_1.tsv"]
    write_criteo(days[0], 16, seed=0)
    reader = CriteoTSV(days, 8, 1000, ready_suffix="._SUCCESS")
    with pytest.raises(DataNotReady, match="day_0.tsv._SUCCESS") as wait:
        next(reader.batches_from())
    assert wait.value.waiting_for == [f"{days[0]}._SUCCESS"]
    (tmp_path / "day_0.tsv._SUCCESS").touch()
    batches = reader.batches_from()
    assert [p["batch"] for _, p in (next(batches), next(batches))] == [1, 2]
    with pytest.raises(DataNotReady) as wait:
        next(batches)
    assert wait.value.waiting_for == [str(days[1]), f"{days[1]}._SUCCESS"]


def _counting(n_ready, waiting_for=("day_1",)):
    """Pairs (i, i + 1) for i < n_ready, then DataNotReady."""
    for i in range(n_ready):
        yield i, i + 1
    raise DataNotReady(list(waiting_for))


def test_positioned_batches_read_ahead_and_remember_positions():
    batches = PositionedBatches(_counting(5), start=0, limit=10, history=3)
    assert batches.waiting_for(2) == [] and batches.handed_out == 0  # read ahead, not handed out
    assert [next(batches) for _ in range(3)] == [0, 1, 2]
    assert batches.position_after(3) == 3 and batches.position_after(1) == 1
    with pytest.raises(KeyError, match="history=3"):
        batches.position_after(0)
    assert batches.waiting_for(2) == [] and batches.waiting_for(3) == ["day_1"]
    assert [next(batches), next(batches)] == [3, 4]
    with pytest.raises(DataNotReady):
        next(batches)
    evaluation = PositionedBatches(_counting(2), start=0, stop_when_not_ready=True)
    assert list(evaluation) == [0, 1]


def test_positioned_batches_stop_at_the_limit_without_waiting():
    batches = PositionedBatches(_counting(3), start=None, limit=3)
    assert batches.waiting_for(5) == []  # the data it will not draw is not waited for
    assert list(batches) == [0, 1, 2]
    assert PositionedBatches(iter([]), start=None).waiting_for(2) == []  # the end of the data is no wait
    with pytest.raises(ValueError, match="limit"):
        PositionedBatches(iter([]), start=None, limit=-1)
