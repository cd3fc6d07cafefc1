"""RunsLaunch.merge_repeats: a bag's repeats of a row within an aligned window of positions
merged before the sort into one id whose factor sums theirs (``positions.merged_positions``).

The kept ids and factors are those of a Python reading of the rule; training with it matches
the pure-PyTorch reference in every pooled mode and optimizer, is bitwise repeatable and the
same planned in the forward or in the backward; the plan holds fewer ids; where it does not
apply (unpooled, per-sample weights' gradient, a graph's padded batch) the backward runs
bitwise as without it."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops import embedding_backward
from tbe_plugin.ops.backward_launch import RunsLaunch, runs_launch
from tbe_plugin.ops.common import Pooling
from tbe_plugin.ops.embedding_backward import plan_backward
from tbe_plugin.ops.indexing import META_ROW_BASE
from tbe_plugin.ops.positions import merged_positions, unpack_bags
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import (
    OPTIMIZERS,
    assert_step_close,
    build,
    cuda_zipf_steps,
    train_and_compare,
    train_steps,
)

EAGER = dataclasses.replace(runs_launch(), graph_max_ids=0, plan_in_forward=False)


@pytest.fixture
def merges(monkeypatch):
    """Counts the batches whose ids were merged (a list of the kept counts)."""
    kept, original = [], embedding_backward.merged_positions

    def counted(*args, **kwargs):
        result = original(*args, **kwargs)
        kept.append(int((result[0] != kwargs.get("sentinel", -1)).sum()))  # in place: the sentinel where dropped
        return result

    monkeypatch.setattr(embedding_backward, "merged_positions", counted)
    return kept


def _merged(window, **fields):
    return dataclasses.replace(EAGER, merge_repeats=window, merge_min_ids=0, **fields)


def _expected(emb, indices, offsets, psw, window, mean):
    """The rule read in Python: per aligned window of positions, the first id of each (bag,
    row) kept, in position order, with the sum of its repeats' factors."""
    num_features = len(emb.feature_table_map)
    B = (offsets.numel() - 1) // num_features
    bases = emb.feature_meta[:, META_ROW_BASE]  # each feature's table's first global row
    kept, order = {}, []
    for bag in range(num_features * B):
        start, end = int(offsets[bag]), int(offsets[bag + 1])
        for p in range(start, end):
            row = int(bases[bag // B]) + int(indices[p])
            factor = float(psw[p]) if psw is not None else 1.0
            if mean:
                factor *= 1.0 / (end - start)
            key = (p // window, bag, row)
            if key not in kept:
                kept[key] = 0.0
                order.append(key)
            kept[key] += factor
    rows = torch.tensor([k[2] for k in order])
    bags = torch.tensor([k[1] for k in order])
    return rows, bags, torch.tensor([kept[k] for k in order])


@pytest.mark.parametrize("window", [2, 8, 64])
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True), ("MEAN", True)])
def test_kept_ids_and_factors_follow_the_rule(window, pooling, weighted):
    emb = build("EXACT_SGD", pooling=pooling)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=6, max_len=14, seed=3, hot_fraction=0.5)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(1)) if weighted else None
    B = (offsets.numel() - 1) // len(rows)
    got_rows, packed = merged_positions(emb.feature_meta, indices, offsets, psw, B, len(rows) * B, torch.int32,
                                        pooling == "MEAN", True, window)  # fmt: skip
    got_bags, got_scale = unpack_bags(packed)
    want_rows, want_bags, want_scale = _expected(emb, indices, offsets, psw, window, pooling == "MEAN")
    assert got_rows.tolist() == want_rows.tolist() and got_bags.tolist() == want_bags.tolist()
    if pooling == "SUM" and not weighted:
        assert got_scale.tolist() == want_scale.tolist()  # counts, exact
    torch.testing.assert_close(got_scale, want_scale.float(), rtol=1e-6, atol=0)
    assert got_rows.numel() < indices.numel()  # the hot row repeats: ids were merged


@pytest.mark.parametrize("window", [4, 32])
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", True)])
def test_in_place_form_keeps_the_same_ids_at_their_positions(window, pooling, weighted):
    """``merge_compact=False``: every position, a kept one with its row and its packed bag and
    factor (the compacted form's, in the same order), a dropped one (or one outside every
    bag) with the sentinel row."""
    emb = build("EXACT_SGD", pooling=pooling)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=6, max_len=14, seed=3, hot_fraction=0.5)
    indices = torch.cat([indices, torch.tensor([1, 2])])  # two ids past the last bag
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(1)) if weighted else None
    B = (offsets.numel() - 1) // len(rows)
    common = (emb.feature_meta, indices, offsets, psw, B, len(rows) * B, torch.int32, pooling == "MEAN", True, window)
    sentinel = torch.iinfo(torch.int32).max
    compact_rows, compact_packed = merged_positions(*common, sentinel=sentinel)
    in_place_rows, in_place_packed = merged_positions(*common, compact=False, sentinel=sentinel)
    assert in_place_rows.numel() == indices.numel() and in_place_packed.numel() == indices.numel()
    kept = in_place_rows != sentinel
    assert torch.equal(in_place_rows[kept], compact_rows)
    assert torch.equal(in_place_packed[kept], compact_packed)
    assert not kept[-2:].any() and compact_rows.numel() < int(offsets[-1])  # outside bags; merged


def test_ids_outside_bags_and_out_of_range_ids():
    """Ids after the last offset are in no bag and dropped; with bounds checks an id outside
    its table reads as row 0 of it (the forward's repair), and merges with row 0's repeats."""
    emb = build("EXACT_SGD")
    num_features = len(emb.feature_table_map)
    B = 2
    lengths = torch.tensor([3, 1, 0, 2, 4, 0, 1, 1])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.tensor([0, 99, 0, 5, 1, 1, 0, -3, 0, 7, 2, 2, 2, 2, 2])  # 3 past the last bag
    rows, packed = merged_positions(emb.feature_meta, indices, offsets, None, B, num_features * B, torch.int32,
                                    False, True, 4)  # fmt: skip
    bags, scale = unpack_bags(packed)
    want_rows, want_bags, want_scale = _expected(emb, indices.clamp(min=0) * (indices < 23), offsets, None, 4, False)
    assert rows.tolist() == want_rows.tolist() and bags.tolist() == want_bags.tolist()
    assert scale.tolist() == want_scale.tolist()
    assert int(scale.sum()) == int(offsets[-1])  # every id in a bag counted once


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_with_merged_repeats_matches_the_reference(merges, optimizer):
    emb = build(optimizer, learning_rate=0.05)
    emb.backward_launch = _merged(4)
    train_and_compare(emb, optimizer, steps=2, B=5, max_len=9, hot=0.5, lr=0.05)
    assert len(merges) == 2


@pytest.mark.parametrize("pooling,weighted", [("MEAN", False), ("SUM", True), ("MEAN", True)])
def test_scaled_modes_with_merged_repeats_match_the_reference(merges, pooling, weighted):
    emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling, learning_rate=0.05)
    emb.backward_launch = _merged(8)
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, B=5, max_len=9, hot=0.5, weighted=weighted, lr=0.05)
    assert len(merges) == 2


def test_chunk_design_with_merged_repeats_matches_the_reference(merges):
    emb = build("ADAM", learning_rate=0.05)
    emb.backward_launch = _merged(4, design="chunks")
    train_and_compare(emb, "ADAM", steps=2, B=5, max_len=9, hot=0.5, lr=0.05)
    assert len(merges) == 2


def _train(launch, optimizer="EXACT_ROWWISE_ADAGRAD", pooling="SUM", steps=2, weighted=False):
    """``steps`` steps of a fresh module; ``weighted``: per-sample weights (no gradient)."""
    emb = build(optimizer, pooling=pooling)
    emb.backward_launch = launch
    return train_steps(emb, steps=steps, B=5, max_len=9, seed=40, hot=0.5, psw=weighted)


def test_bitwise_repeatable_and_the_same_planned_in_the_forward(merges):
    first = _train(_merged(4))
    again = _train(_merged(4))
    in_forward = _train(_merged(4, plan_in_forward=True))
    assert_bitwise_equal(first, again)
    assert_bitwise_equal(first, in_forward)
    assert len(merges) == 6
    plain = _train(EAGER)
    assert not torch.equal(first.weights, build("EXACT_ROWWISE_ADAGRAD").weights)  # trained
    torch.testing.assert_close(first.weights, plain.weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("optimizer,pooling,weighted", [("EXACT_ROWWISE_ADAGRAD", "SUM", False),
                                                        ("ADAM", "MEAN", False), ("LAMB", "SUM", True)])
def test_in_place_form_trains_bitwise_as_the_compacted(merges, optimizer, pooling, weighted):
    """The kept ids leave the stable sort in the same order in both forms (the dropped ones,
    with the sentinel row, after them): the same plan past the sort, the same step bit for bit."""
    compacted = _train(_merged(8), optimizer, pooling, weighted=weighted)
    in_place = _train(_merged(8, merge_compact=False), optimizer, pooling, weighted=weighted)
    assert_bitwise_equal(compacted, in_place)
    assert len(merges) == 4 and merges[:2] == merges[2:]


@pytest.mark.parametrize("compact", [True, False])
def test_int64_keys_train_as_int32_keys(merges, monkeypatch, compact):
    """Tables of 2**31 rows and more sort int64 rows (the sentinel int64's largest value):
    the same step, bit for bit, as with int32 rows."""
    int32_keys = _train(_merged(8, merge_compact=compact))
    monkeypatch.setattr(embedding_backward, "INT32_KEYS_BELOW", 0)
    int64_keys = _train(_merged(8, merge_compact=compact))
    assert_bitwise_equal(int32_keys, int64_keys)
    assert len(merges) == 4 and merges[:2] == merges[2:]


def test_in_place_plan_is_the_compacted_plan_then_sentinels():
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=6, max_len=12, seed=7, hot_fraction=0.6)
    compacted = _plan(emb, indices, offsets, _merged(8))
    in_place = _plan(emb, indices, offsets, _merged(8, merge_compact=False))
    kept = compacted.sorted_operands[0].numel()
    assert kept < indices.numel() == in_place.sorted_operands[0].numel()
    assert torch.equal(compacted.class_pos, in_place.class_pos) and int(in_place.class_pos[-1]) == kept
    for got, want in zip(in_place.sorted_operands, compacted.sorted_operands):
        assert torch.equal(got[:kept], want)
    assert (in_place.sorted_operands[0][kept:] == in_place.sentinel).all()
    assert in_place.scaled and compacted.scaled


def _plan(emb, indices, offsets, launch, pooling=Pooling.SUM, psw=None, psw_requires_grad=False, graphed=False):
    total_rows = sum(emb.table_rows)
    width = sum(emb.feature_dims) if pooling != Pooling.NONE else max(emb.feature_dims)
    grad_rows = (offsets.numel() - 1) // len(emb.feature_table_map) if pooling != Pooling.NONE else indices.numel()
    return plan_backward(emb.feature_meta, total_rows, indices, offsets, psw, psw_requires_grad, int(pooling), True,
                         0, (grad_rows, width), launch, emb._row_classes, max(emb.table_dims), graphed)  # fmt: skip


def test_the_plan_holds_the_kept_ids_only_where_the_merge_applies():
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=6, max_len=12, seed=7, hot_fraction=0.6)
    N = indices.numel()
    merged = _plan(emb, indices, offsets, _merged(8))
    want_rows, _, _ = _expected(emb, indices, offsets, None, 8, False)
    assert merged.sorted_operands[0].numel() == want_rows.numel() < N and merged.scaled
    assert merged.sorted_operands[0].tolist() == sorted(want_rows.tolist())
    psw = torch.rand(N)
    for kwargs in (dict(psw=psw, psw_requires_grad=True), dict(graphed=True)):
        plan = _plan(emb, indices, offsets, _merged(8), **kwargs)
        assert plan.sorted_operands[0].numel() == N, kwargs
    small = _plan(emb, indices, offsets, dataclasses.replace(_merged(8), merge_min_ids=N + 1))
    assert small.sorted_operands[0].numel() == N  # a batch below merge_min_ids
    unpooled = build("EXACT_ROWWISE_ADAGRAD", pooling="NONE", specs=[(23, 8), (9, 8), (30, 8)])
    plan = _plan(unpooled, indices, offsets, _merged(8), pooling=Pooling.NONE)
    assert plan.sorted_operands[0].numel() == N and not plan.scaled


@pytest.mark.parametrize("pooling,weighted", [("NONE", False), ("SUM", True)])
def test_where_it_does_not_apply_the_backward_is_unchanged(merges, pooling, weighted):
    """Unpooled, and per-sample weights that need their gradient: bitwise as without it."""
    specs = [(23, 8), (9, 8), (30, 8)] if pooling == "NONE" else None
    runs = []
    for launch in (EAGER, _merged(8)):
        emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling, **({"specs": specs} if specs else {}))
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        indices, offsets = make_bags(rows, B=4, max_len=8, seed=5, hot_fraction=0.5)
        psw = torch.rand(indices.numel()).requires_grad_(True) if weighted else None
        out = emb(indices, offsets, psw)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0)))
        runs.append((emb, psw.grad if weighted else None))
    assert_bitwise_equal(runs[0][0], runs[1][0])
    assert merges == []
    if weighted:
        assert torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("window", [1, 3, 128])
def test_bad_window_names_the_option(window):
    with pytest.raises(ValueError, match="merge_repeats"):
        RunsLaunch(merge_repeats=window)
    with pytest.raises(ValueError, match="merge_min_ids"):
        RunsLaunch(merge_min_ids=-window)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_merged_repeats_on_cuda(merges, optimizer):
    """Zipf(1.15) ids over tables of D 16, 128 and 400 (B=16384, 20 ids a bag: the hot rows
    repeat within bags): with windows of 32 and 64 the step matches the default backward up
    to fp32 rounding, two runs agree bit for bit, the in-place form (``merge_compact=False``)
    bit for bit with the compacted one, and each merged step kept fewer ids."""
    plain = RunsLaunch(graph_max_ids=0)
    w32, w64 = (RunsLaunch(graph_max_ids=0, merge_repeats=w, merge_min_ids=0) for w in (32, 64))
    in_place = dataclasses.replace(w32, merge_compact=False)
    modules, indices = cuda_zipf_steps(optimizer, (plain, w32, w32, w64, in_place))
    assert_bitwise_equal(modules[1], modules[2])
    assert_bitwise_equal(modules[1], modules[4])
    for merged in (modules[1], modules[3]):
        assert_step_close(merged, modules[0])
    assert len(merges) == 4 and all(kept < 0.95 * indices.numel() for kept in merges), merges
    assert merges[0] == merges[1] == merges[3]
