"""RunsLaunch.lean_operands: the sorted operands with int32 gradient offsets (where the output
gradient's offsets fit) and a row's start and D written only at a run's head or a multiple of
``piece_ids``. The plan holds the default's values wherever it writes, writes them exactly
there (a superset of the pieces' starts), and training is bit for bit the default's; so is
training with RunsLaunch.piece_evict's L2 hints (which move no data)."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops import embedding_backward
from tbe_plugin.ops.common import Pooling
from tbe_plugin.ops.embedding_backward import plan_backward
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import OPTIMIZERS, SMALL_PIECES, assert_option_trains_bitwise, build, train_each

PIECES = SMALL_PIECES  # cells of 4 ids, groups of 2 cells; eager, planned in the backward
UNWRITTEN = -7  # what every buffer the plan allocates holds before its kernels write


def _plan(emb, indices, offsets, launch, pooling, monkeypatch):
    """The plan, every buffer it allocates filled with UNWRITTEN first (so that what no kernel
    wrote shows)."""
    empty = torch.empty

    def filled(*args, **kwargs):
        return empty(*args, **kwargs).fill_(UNWRITTEN)

    width = sum(emb.feature_dims)
    bags = (offsets.numel() - 1) // len(emb.feature_table_map)
    grad_shape = (indices.numel(), max(emb.feature_dims)) if pooling == Pooling.NONE else (bags, width)
    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", filled)
        return plan_backward(emb.feature_meta, sum(emb.table_rows), indices, offsets, None, False, int(pooling),
                             True, 0, grad_shape, launch, emb._row_classes, max(emb.table_dims))  # fmt: skip


LAUNCHES = {
    "plain": {},
    "short": dict(piece_short=2),
    "short-records": dict(piece_short=4, piece_records=True),
    "merged": dict(merge_repeats=4, merge_min_ids=0),
}


@pytest.mark.parametrize("name", list(LAUNCHES))
@pytest.mark.parametrize("pooling", [Pooling.SUM, Pooling.MEAN, Pooling.NONE])
def test_the_plan_holds_the_defaults_values_where_it_writes(small_blocks, monkeypatch, name, pooling):
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=9, max_len=14, seed=11, hot_fraction=0.8)
    indices = torch.cat([indices, torch.tensor([3, 1])])  # ids past the last bag: sentinels at the end
    launch = dataclasses.replace(PIECES, **LAUNCHES[name])
    want = _plan(emb, indices, offsets, launch, pooling, monkeypatch)
    got = _plan(emb, indices, offsets, dataclasses.replace(launch, lean_operands=True), pooling, monkeypatch)
    w_rows, w_start, w_dim, w_grad, w_scale = want.sorted_operands
    g_rows, g_start, g_dim, g_grad, g_scale = got.sorted_operands
    assert torch.equal(w_rows, g_rows) and torch.equal(w_scale, g_scale)
    assert w_grad.dtype == torch.int64 and g_grad.dtype == torch.int32
    valid = w_rows < sum(emb.table_rows)
    assert 0 < int(valid.sum()) <= valid.numel()  # (merged repeats are compacted: no sentinel ids left)
    assert torch.equal(w_grad[valid], g_grad[valid].long())
    # The row's start and D: the default writes them at every valid id; lean at a valid id that
    # heads its run or sits on a multiple of piece_ids, and nowhere else.
    q = torch.arange(valid.numel())
    before = torch.cat([torch.tensor([-2], dtype=w_rows.dtype), w_rows[:-1]])
    may_start = valid & ((w_rows != before) | (q % launch.piece_ids == 0))
    assert 0 < int(may_start.sum()) < int(valid.sum())
    assert bool((w_start[valid] != UNWRITTEN).all())
    assert torch.equal(g_start != UNWRITTEN, may_start) and torch.equal(g_dim != UNWRITTEN, may_start)
    assert torch.equal(g_start[may_start], w_start[may_start]) and torch.equal(g_dim[may_start], w_dim[may_start])
    # Every piece the pieces kernels visit starts at such a place; the marks are the default's.
    marks = want.marks
    starts = marks.piece_starts[: int(marks.class_piece_pos[-1])]
    assert bool(may_start[starts].all())
    assert torch.equal(starts, got.marks.piece_starts[: int(got.marks.class_piece_pos[-1])])
    assert torch.equal(marks.multi_heads[: int(marks.class_multi_pos[-1])],
                       got.marks.multi_heads[: int(got.marks.class_multi_pos[-1])])  # fmt: skip


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_is_bitwise_the_same(small_blocks, optimizer):
    assert_option_trains_bitwise(optimizer, lean_operands=True)


@pytest.mark.parametrize("case", ["records", "weighted", "unpooled", "int64-offsets"])
def test_training_is_bitwise_the_same_elsewhere(small_blocks, monkeypatch, case):
    """Per-piece records (the offsets copied into the int64 records), per-sample weights
    (scaled ids), unpooled outputs (an offset a position) and a gradient too large for int32
    offsets (the threshold lowered: int64 offsets, as without the option)."""
    if case == "int64-offsets":
        monkeypatch.setattr(embedding_backward, "INT32_OFFSETS_BELOW", 0)
    pooling = "NONE" if case == "unpooled" else "SUM"
    specs = dict(specs=[(300, 8), (90, 8)], ftm=[0, 1, 0]) if case == "unpooled" else {}
    launches = [dataclasses.replace(PIECES, piece_short=2, piece_records=case == "records", lean_operands=lean)
                for lean in (False, True)]  # fmt: skip
    trained = train_each(launches, lambda: build("ADAM", pooling=pooling, learning_rate=0.05, **specs), steps=2,
                         B=6, max_len=10, seed=40, hot=0.9, psw=case == "weighted")  # fmt: skip
    assert_bitwise_equal(*trained)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_l2_hints_train_bitwise_the_same(small_blocks, optimizer):
    """RunsLaunch.piece_evict (hints only, on the pieces kernel's loads and stores): the same
    step, with and without the lean operands (their PTX: ``test_gpu_compile``)."""
    launches = [dataclasses.replace(PIECES, piece_short=2, piece_evict=evict, lean_operands=lean)
                for evict, lean in ((False, False), (True, False), (True, True))]  # fmt: skip
    trained = train_each(launches, lambda: build(optimizer, learning_rate=0.05), steps=2, B=7, max_len=12, seed=21,
                         hot=0.8)  # fmt: skip
    assert_bitwise_equal(trained[0], trained[1])
    assert_bitwise_equal(trained[0], trained[2])


def test_the_options_name_the_design_they_need():
    """``lean_operands`` and ``piece_evict`` are the pieces design's: with the chunk design (which
    reads every id's start and D) they are refused, by name."""
    for name in ("lean_operands", "piece_evict"):
        with pytest.raises(ValueError, match=f"RunsLaunch.{name} is for the pieces design"):
            dataclasses.replace(PIECES, design="chunks", **{name: True})


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_lean_operands_on_cuda(optimizer):
    """Zipf(1.15) ids over tables of D 16, 128 and 400, B=16384 (``cuda_zipf_steps``): the step
    with the lean operands is the default's, bit for bit, with and without the marks found
    beside the operands."""
    from tbe_plugin.ops.backward_launch import RunsLaunch
    from tests.ops.backward_helpers import cuda_zipf_steps

    plain = RunsLaunch(graph_max_ids=0)
    launches = (plain, dataclasses.replace(plain, lean_operands=True),
                dataclasses.replace(plain, lean_operands=True, marks_in_operands=True))  # fmt: skip
    modules, _ = cuda_zipf_steps(optimizer, launches)
    assert_bitwise_equal(modules[0], modules[1])
    assert_bitwise_equal(modules[0], modules[2])
