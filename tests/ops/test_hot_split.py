"""RunsLaunch.hot_split: with the hot rows summed apart, the other ids compacted before the
sort (from the positions kernel's positions or the training forward's); the step is bit for
bit ``hot_rows``' without the split, whose sort keeps the hot ids as sentinels."""

import dataclasses
import warnings

import pytest
import torch

from tbe_plugin.ops import embedding_backward, hot_split
from tbe_plugin.ops.backward_launch import RunsLaunch, runs_launch
from tbe_plugin.ops.common import Pooling
from tbe_plugin.ops.embedding_backward import forward_positions_apply
from tests.helpers import assert_bitwise_equal
from tests.ops.backward_helpers import build, step_on_bad_inputs, train_each

HOT = RunsLaunch(hot_rows=16, hot_sample=8, hot_min_ids=0, graph_max_ids=0, plan_in_forward=False)
SPLIT = dataclasses.replace(HOT, hot_split=True)
SPECS = [(40, 8), (25, 20), (60, 4)]


def _spy_compactions(monkeypatch):
    """(ids in, ids left) of each compaction."""
    seen, original = [], hot_split.compact_kept

    def spied(rows, bags, scale, sentinel, counts=None):
        out = original(rows, bags, scale, sentinel, counts)
        left = int((out[0] != sentinel).sum())  # (nothing left: one sentinel)
        seen.append((rows.numel(), left))
        return out

    monkeypatch.setattr(embedding_backward, "compact_kept", spied)
    return seen


def test_compact_kept_keeps_order_and_factors():
    sentinel = torch.iinfo(torch.int32).max
    rows = torch.tensor([5, sentinel, 3, 9, sentinel, 3, sentinel], dtype=torch.int32)
    bags = torch.tensor([0, 1, 2, 3, 4, 5, 6], dtype=torch.int32)
    scale = torch.tensor([0.5, 1, 2, 3, 4, 5, 6], dtype=torch.float32)
    got_rows, got_bags, got_scale = hot_split.compact_kept(rows, bags, scale, sentinel)
    assert got_rows.tolist() == [5, 3, 9, 3] and got_bags.tolist() == [0, 2, 3, 5]
    assert got_scale.tolist() == [0.5, 2, 3, 5]
    assert got_rows.dtype == torch.int32 and got_bags.dtype == torch.int32
    none = torch.full((5,), sentinel, dtype=torch.int32)
    empty_rows, empty_bags, empty_scale = hot_split.compact_kept(none, bags[:5], None, sentinel)
    assert empty_rows.tolist() == [sentinel] and empty_bags.tolist() == [0] and empty_scale is None


def test_compact_kept_across_blocks(monkeypatch):
    monkeypatch.setattr(hot_split, "SPLIT_BLOCK", 16)
    g = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 50, (200,), generator=g)
    sentinel = torch.iinfo(torch.int64).max
    rows[torch.rand(200, generator=g) < 0.6] = sentinel
    bags = torch.arange(200, dtype=torch.int32)
    got_rows, got_bags, _ = hot_split.compact_kept(rows, bags, None, sentinel)
    keep = rows != sentinel
    assert torch.equal(got_rows, rows[keep]) and torch.equal(got_bags, bags[keep])


def test_split_hot_counts_and_marks_the_hot_ids(monkeypatch):
    """Two features of B=3 bags; feature 0's hot rows {2, 7}, feature 1's {11, 12} (padded with
    a row above every row): each hot id counted at (feature, slot, bag) and given the sentinel;
    an id outside every bag (the sentinel already) untouched."""
    monkeypatch.setattr(hot_split, "SPLIT_BLOCK", 4)
    sentinel = torch.iinfo(torch.int32).max
    rows = torch.tensor([2, 3, 7, 2, 5, 11, 12, 11, 10, sentinel], dtype=torch.int32)
    bags = torch.tensor([0, 0, 1, 2, 2, 3, 3, 5, 5, 0], dtype=torch.int32)
    hot = torch.full((2, 16), 99, dtype=torch.int64)
    hot[0, :2], hot[1, :2] = torch.tensor([2, 7]), torch.tensor([11, 12])
    counts = torch.zeros(2, 16, 3)
    kept = hot_split.split_hot(rows, bags, hot, counts, 3, sentinel)
    assert rows.tolist() == [sentinel, 3, sentinel, sentinel, 5, sentinel, sentinel, sentinel, 10, sentinel]
    assert kept.tolist() == [1, 1, 1]  # blocks of 4 positions: ids 3 | 5 | 10 left
    want = torch.zeros(2, 16, 3)
    want[0, 0, 0] = want[0, 1, 1] = want[0, 0, 2] = 1  # row 2 in bags 0 and 2, row 7 in bag 1
    want[1, 0, 0] = want[1, 1, 0] = want[1, 0, 2] = 1  # feature 1's bags 3 and 5 are its bags 0 and 2
    assert torch.equal(counts, want)
    with pytest.raises(ValueError, match="hot_counts"):
        hot_split.split_hot(rows, bags, hot, torch.zeros(2, 8, 3), 3, sentinel)


@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM", "LAMB"])
@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_split_trains_bitwise_like_the_hot_rows(monkeypatch, optimizer, pooling):
    """From the positions kernel (planned in the backward): shared tables, SUM and MEAN."""
    seen = _spy_compactions(monkeypatch)
    trained = train_each((HOT, SPLIT), lambda: build(optimizer, pooling=pooling, specs=SPECS, ftm=[0, 1, 2, 0],
                                                      learning_rate=0.05), steps=2, B=6, max_len=9, seed=13, hot=0.6)
    assert_bitwise_equal(*trained)
    assert len(seen) == 2 and all(0 < kept < ids for ids, kept in seen)


def test_split_with_the_lean_operands_and_l2_hints(monkeypatch):
    """The split beside RunsLaunch.lean_operands and piece_evict (profile_backward's stack16):
    the split's step, bit for bit."""
    seen = _spy_compactions(monkeypatch)
    launches = (SPLIT, dataclasses.replace(SPLIT, lean_operands=True, piece_evict=True))
    trained = train_each(launches, lambda: build("ADAM", pooling="MEAN", specs=SPECS, ftm=[0, 1, 2],
                                                 learning_rate=0.05), steps=2, B=6, max_len=9, seed=17, hot=0.6)
    assert_bitwise_equal(*trained)
    assert len(seen) == 4 and all(0 < left < ids for ids, left in seen)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_split_with_the_radix_sort(monkeypatch, pooling):
    """With RunsLaunch.radix_sort (its sentinel the least all-ones value above the rows, and
    the bags sorted beside the rows for SUM): the split's compaction, the hot rows' step."""
    seen = _spy_compactions(monkeypatch)
    launches = [dataclasses.replace(launch, radix_sort=True) for launch in (HOT, SPLIT)]
    trained = train_each(launches, lambda: build("EXACT_ROWWISE_ADAGRAD", pooling=pooling, specs=SPECS,
                                                 ftm=[0, 1, 2], learning_rate=0.05), steps=2, B=6, max_len=9, seed=5,
                         hot=0.6)  # fmt: skip
    assert_bitwise_equal(*trained)
    assert len(seen) == 2 and all(0 < left < ids for ids, left in seen)


def test_every_id_hot(monkeypatch):
    """Sampling 64 ids a feature of these small batches makes every row hot: nothing is left to
    the sort (one sentinel goes on), the step is still the hot rows' own."""
    seen = _spy_compactions(monkeypatch)
    launches = [dataclasses.replace(launch, hot_sample=64) for launch in (HOT, SPLIT)]
    trained = train_each(launches, lambda: build("ADAM", specs=SPECS, ftm=[0, 1, 2], learning_rate=0.05), steps=2,
                         B=4, max_len=5, seed=3, hot=0.6)  # fmt: skip
    assert_bitwise_equal(*trained)
    assert [left for _, left in seen] == [0, 0]
    assert not torch.equal(trained[0].weights, build("ADAM", specs=SPECS, ftm=[0, 1, 2]).weights)


def test_split_with_int64_keys_and_bad_ids_and_offsets(monkeypatch):
    """int64 row keys; ids outside their tables and a decreasing offset under WARNING."""
    monkeypatch.setattr(embedding_backward, "INT32_KEYS_BELOW", 0)
    seen = _spy_compactions(monkeypatch)
    assert_bitwise_equal(*step_on_bad_inputs((HOT, SPLIT), SPECS, [0, 1, 2]))
    assert len(seen) == 1 and 0 < seen[0][1] < seen[0][0]


# 128-column fp32 rows in bags of > 12 ids: the forward's warp kernel (FLAT 4), which writes positions.
WIDE = [(40, 128), (50, 128)]


def _long_bags(B, seed, rows=(40, 50, 40), lo=13, hi=30):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (len(rows) * B,), generator=g)
    ids = [torch.where(torch.rand(n, generator=g) < 0.5, torch.randint(0, 3, (n,), generator=g),
                       torch.randint(0, rows[k // B], (n,), generator=g)) for k, n in enumerate(lengths.tolist())]
    return torch.cat(ids), torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


@pytest.mark.parametrize("irregular,thread", [(False, False), (True, False), (False, True)])
def test_split_from_the_forwards_positions(monkeypatch, irregular, thread):
    """Planned in the forward, from the positions the forward wrote (the hot ids found by
    ``_hot_split_kernel``), against the hot rows from the positions kernel; irregular offsets
    (a first offset above 0: positions in no bag) repaired on the device first, and ids
    outside their tables read as row 0. ``thread``: the plan (and its host read of the count)
    made by the plan thread (``RunsLaunch.plan_thread``)."""
    from tbe_plugin.ops import training

    written, original = [], training.plan_backward

    def spied(*args, **kwargs):
        positions = kwargs.get("forward_positions")
        written.append(positions is not None and positions.written)
        return original(*args, **kwargs)

    monkeypatch.setattr(training, "plan_backward", spied)
    chosen, choose = [], hot_split.hot_choice

    def choosing(where):  # where the hot rows are chosen: before the lookup (training) or in the plan
        def spied_choice(*args):
            chosen.append((where, args[4]))
            return choose(*args)

        return spied_choice

    monkeypatch.setattr(training, "hot_choice", choosing("forward"))
    monkeypatch.setattr(embedding_backward, "hot_choice", choosing("plan"))
    seen = _spy_compactions(monkeypatch)
    fused = dataclasses.replace(SPLIT, plan_in_forward=True, forward_positions=True, plan_thread=thread)
    trained = []
    for launch in (HOT, fused):
        emb = build("EXACT_ROWWISE_ADAGRAD", specs=WIDE, ftm=[0, 1, 0], learning_rate=0.05,
                    bounds_check_mode="WARNING")  # fmt: skip
        emb.backward_launch = launch
        for step in range(2):
            indices, offsets = _long_bags(3, seed=40 + step)
            if irregular:
                offsets[0] = 2
                indices[5], indices[-3] = 999, -4  # outside their tables: row 0 (the forward's repair)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the offsets' report (once a module)
                out = emb(indices, offsets)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
        trained.append(emb)
    assert_bitwise_equal(*trained)
    assert written == [True, True] and len(seen) == 2 and all(0 < kept < ids for ids, kept in seen)
    # In the positions kernel's plans (in the backward), then before the split's lookups (once a
    # batch: the plan takes the forward's choice).
    assert chosen == [("plan", 16), ("plan", 16), ("forward", 16), ("forward", 16)]


def test_the_options_need_hot_rows():
    for name in ("hot_split", "hot_tf32x3"):
        with pytest.raises(ValueError, match=f"RunsLaunch.{name} needs hot_rows"):
            RunsLaunch(**{name: True})


def test_forward_positions_take_the_split_only():
    """The forward writes positions with the hot rows only when they are split (and not merged
    in the forward: the split reads an int32 bag)."""
    args = (int(Pooling.SUM), False, False, 10, 4)
    assert forward_positions_apply(runs_launch(), *args)
    assert not forward_positions_apply(dataclasses.replace(runs_launch(), hot_rows=16), *args)
    assert forward_positions_apply(dataclasses.replace(runs_launch(), hot_rows=16, hot_split=True), *args)
    assert not forward_positions_apply(
        dataclasses.replace(runs_launch(), hot_rows=16, hot_split=True, forward_merge=True), *args)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_hot_split_on_cuda(optimizer):
    """Zipf(1.15) ids over three tables of D=128 (B=16384, 20 ids a bag): 16 hot rows a table
    with the split (from the forward's positions, planned on the side stream) is bit for bit
    the hot rows without it (from the positions kernel), and two runs agree."""
    from tests.ops.backward_helpers import cuda_zipf_steps

    hot = dataclasses.replace(runs_launch(), hot_rows=16, hot_min_ids=0, graph_max_ids=0)
    split = dataclasses.replace(hot, hot_split=True)
    thread = dataclasses.replace(split, plan_thread=True)  # the plan and its host read by the plan thread
    modules, _ = cuda_zipf_steps(optimizer, (hot, split, split, thread), dims=(128, 128, 128))
    assert_bitwise_equal(modules[1], modules[0])
    assert_bitwise_equal(modules[1], modules[2])
    assert_bitwise_equal(modules[3], modules[0])
