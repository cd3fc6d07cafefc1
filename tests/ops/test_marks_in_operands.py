"""RunsLaunch.marks_in_operands: the pieces design's marks found by the sorted-operands
kernel (a byte a position and its block's counts), then the marks kernel's write pass from
them. The lists are the two-pass marks kernel's, entry for entry, over blocks of 16 positions
(runs across block edges, hot rows across cells and groups, short runs, per-piece records,
merged repeats, hot rows summed apart, int64 row keys), and training is bit for bit the same."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops import embedding_backward
from tbe_plugin.ops.common import Pooling
from tbe_plugin.ops.embedding_backward import plan_backward
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import (
    OPTIMIZERS,
    SMALL_PIECES,
    assert_option_trains_bitwise,
    build,
    train_steps,
)

PIECES = SMALL_PIECES  # cells of 4 ids, groups of 2 cells; eager, planned in the backward


def _plan(emb, indices, offsets, launch, pooling=Pooling.SUM, psw=None):
    width = sum(emb.feature_dims)
    grad_rows = (offsets.numel() - 1) // len(emb.feature_table_map)
    return plan_backward(emb.feature_meta, sum(emb.table_rows), indices, offsets, psw, False, int(pooling), True, 0,
                         (grad_rows, width), launch, emb._row_classes, max(emb.table_dims))  # fmt: skip


def _lists(plan):
    """The marks' lists up to what they hold (their buffers are larger)."""
    marks = plan.marks
    pieces, multis = int(marks.class_piece_pos[-1]), int(marks.class_multi_pos[-1])
    listed = {"piece_starts": marks.piece_starts[: pieces + 1], "multi_heads": marks.multi_heads[:multis],
              "class_piece_pos": marks.class_piece_pos, "class_multi_pos": marks.class_multi_pos}  # fmt: skip
    if marks.records[0] is not marks.piece_starts:
        for k, record in enumerate(marks.records):
            if record.numel() > 1:  # (unscaled: the factors' record is an unused element)
                listed[f"record{k}"] = record[:pieces]
    if marks.short:
        short_index, long_index, short_pos, long_pos = marks.split
        listed.update(short_index=short_index[: int(short_pos[-1])], long_index=long_index[: int(long_pos[-1])],
                      class_short_pos=short_pos, class_long_pos=long_pos)  # fmt: skip
    return listed


LAUNCHES = {
    "plain": {},
    "short": dict(piece_short=2),
    "short-records": dict(piece_short=4, piece_records=True),
    "merged": dict(merge_repeats=4, merge_min_ids=0),
    "merged-in-place": dict(merge_repeats=8, merge_min_ids=0, merge_compact=False, piece_short=2),
}


@pytest.mark.parametrize("name", list(LAUNCHES))
@pytest.mark.parametrize("hot", [0.0, 0.9])
def test_the_marks_are_the_marks_kernels(small_blocks, name, hot):
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=9, max_len=14, seed=11, hot_fraction=hot)
    indices = torch.cat([indices, torch.tensor([3, 1])])  # ids past the last bag: sentinels at the end
    launch = dataclasses.replace(PIECES, **LAUNCHES[name])
    want = _plan(emb, indices, offsets, launch)
    got = _plan(emb, indices, offsets, dataclasses.replace(launch, marks_in_operands=True))
    assert want.marks.short == got.marks.short
    expected, found = _lists(want), _lists(got)
    assert expected.keys() == found.keys()
    for key in expected:
        assert torch.equal(expected[key], found[key]), key
    assert int(want.marks.class_piece_pos[-1]) > 16  # pieces over several blocks
    if hot:
        assert int(want.marks.class_multi_pos[-1]) > 0  # a run over several cells


def test_hot_rows_apart_and_int64_keys(small_blocks, monkeypatch):
    """Hot rows summed apart (their ids take the sentinel row, sorted last) and int64 row
    keys: the same lists."""
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=[(300, 8), (90, 8)], ftm=[0, 1, 0])
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=12, max_len=16, seed=5, hot_fraction=0.8)
    for launch in (dataclasses.replace(PIECES, hot_rows=16, hot_min_ids=0), PIECES):
        monkeypatch.setattr(embedding_backward, "INT32_KEYS_BELOW", 0 if launch is PIECES else 2**31 - 1)
        want = _plan(emb, indices, offsets, launch)
        got = _plan(emb, indices, offsets, dataclasses.replace(launch, marks_in_operands=True))
        assert want.sorted_operands[0].dtype == (torch.int64 if launch is PIECES else torch.int32)
        for key, value in _lists(want).items():
            assert torch.equal(value, _lists(got)[key]), key


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_is_bitwise_the_same(small_blocks, optimizer):
    assert_option_trains_bitwise(optimizer, marks_in_operands=True)


def test_a_runs_other_ids_need_no_row_start(small_blocks, monkeypatch):
    """With the marks, the sorted-operands kernel writes a row's start and D only where a
    piece starts: the backward reads them nowhere else. Poisoned everywhere else after the
    plan, the step is still the default's, bit for bit."""
    original = embedding_backward.plan_backward
    poisoned = []

    def poison(*args, **kwargs):
        plan = original(*args, **kwargs)
        if plan.marks is not None:
            n = plan.sorted_operands[0].numel()
            elsewhere = torch.ones(n, dtype=torch.bool)
            elsewhere[plan.marks.piece_starts[: int(plan.marks.class_piece_pos[-1])]] = False
            plan.sorted_operands[1][elsewhere] = -(2**40)  # the row's start in the weights
            plan.sorted_operands[2][elsewhere] = -(2**20)  # D
            poisoned.append(int(elsewhere.sum()))
        return plan

    trained = []
    for in_operands in (False, True):
        emb = build("ADAM", learning_rate=0.05)
        emb.backward_launch = dataclasses.replace(PIECES, piece_short=2, marks_in_operands=in_operands)
        if in_operands:
            monkeypatch.setattr(embedding_backward, "plan_backward", poison)
        trained.append(train_steps(emb, steps=2, B=8, max_len=12, seed=30, hot=0.9))
    assert_bitwise_equal(*trained)
    assert len(poisoned) == 2 and min(poisoned) > 0


def test_the_chunk_design_takes_no_marks():
    """``marks_in_operands`` is for the pieces design; the chunk design plans as without it."""
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=5, max_len=9, seed=2, hot_fraction=0.5)
    plan = _plan(emb, indices, offsets, dataclasses.replace(PIECES, design="chunks", marks_in_operands=True))
    assert plan.marks is None


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_marks_in_operands_on_cuda(optimizer):
    """Zipf(1.15) ids over tables of D 16, 128 and 400, B=16384 (``cuda_zipf_steps``): the
    step with the marks found beside the operands is the default's, bit for bit, with and
    without merged repeats."""
    from tbe_plugin.ops.backward_launch import RunsLaunch
    from tests.ops.backward_helpers import cuda_zipf_steps

    plain = RunsLaunch(graph_max_ids=0)
    merged = RunsLaunch(graph_max_ids=0, merge_repeats=32, merge_min_ids=0, merge_compact=False)
    launches = (plain, dataclasses.replace(plain, marks_in_operands=True), merged,
                dataclasses.replace(merged, marks_in_operands=True))  # fmt: skip
    modules, _ = cuda_zipf_steps(optimizer, launches)
    assert_bitwise_equal(modules[0], modules[1])
    assert_bitwise_equal(modules[2], modules[3])
