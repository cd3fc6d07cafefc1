"""RunsLaunch.forward_positions and forward_merge: the training forward's warp kernels write
the backward's positions (each position's global row and bag; with the merge, a bag's repeats
within a round of 32 ids merged into the first, bag and factor packed); the backward trains
from them as from the positions kernel's plan (bitwise without the merge, up to the merged
sums' rounding with it, bitwise repeatably), and irregular offsets are rewritten on the
device by the backward's own rule."""

import dataclasses
import warnings

import pytest
import torch

from tbe_plugin.ops import embedding_backward
from tbe_plugin.ops.backward_launch import runs_launch
from tbe_plugin.ops.common import BoundsCheck, Pooling, new_status
from tbe_plugin.ops.embedding_forward import forward_into, launch_forward
from tbe_plugin.ops.positions import ForwardPositions, repair_positions, unpack_bags
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import build

PLAIN = dataclasses.replace(runs_launch(), plan_in_forward=True, graph_max_ids=0, forward_positions=False)
FUSED = dataclasses.replace(PLAIN, forward_positions=True)
MERGED = dataclasses.replace(PLAIN, forward_merge=True)
SPECS = [(40, 128), (50, 128)]  # 128-column fp32 rows in bags of > 12 ids: the warp kernel (FLAT 4)
FTM = [0, 1, 0]


def _spy_plans(monkeypatch):
    """The ``forward_positions`` each ``plan_backward`` call got (None when none)."""
    seen, original = [], embedding_backward.plan_backward

    def spied(*args, **kwargs):
        seen.append(kwargs.get("forward_positions"))
        return original(*args, **kwargs)

    from tbe_plugin.ops import training

    monkeypatch.setattr(training, "plan_backward", spied)
    return seen


def _long_bags(emb, B, seed, lo=13, hi=44, hot=0.4):
    """Bags of lo..hi ids (past one round of 32 too), ``hot`` of them row 0 or 1 (repeats)."""
    g = torch.Generator().manual_seed(seed)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    lengths = torch.randint(lo, hi + 1, (len(rows) * B,), generator=g)
    ids = []
    for k, n in enumerate(lengths.tolist()):
        draw = torch.randint(0, rows[k // B], (n,), generator=g)
        hot_ids = torch.randint(0, 2, (n,), generator=g)
        ids.append(torch.where(torch.rand(n, generator=g) < hot, hot_ids, draw))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return torch.cat(ids), offsets


def _train(launch, pooling, steps, B=3, bounds="WARNING", batches=None):
    emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling, specs=SPECS, ftm=FTM, bounds_check_mode=bounds)
    emb.backward_launch = launch
    for step in range(steps):
        indices, offsets = batches[step] if batches else _long_bags(emb, B, seed=30 + step)
        out = emb(indices, offsets)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
    return emb


def test_forward_positions_train_bitwise_like_the_positions_kernel(monkeypatch):
    seen = _spy_plans(monkeypatch)
    plain = _train(PLAIN, "SUM", steps=2)
    fused = _train(FUSED, "SUM", steps=2)
    assert seen[:2] == [None, None] and all(p is not None and p.written and not p.merge for p in seen[2:])
    assert_bitwise_equal(fused, plain)
    assert not torch.equal(fused.weights, build("EXACT_ROWWISE_ADAGRAD", specs=SPECS, ftm=FTM).weights)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_merged_forward_positions_train_like_the_positions_kernel(monkeypatch, pooling):
    seen = _spy_plans(monkeypatch)
    plain = _train(PLAIN, pooling, steps=2)
    assert seen == [None, None]
    merged = _train(MERGED, pooling, steps=2)
    assert len(seen) == 4 and all(p is not None and p.written and p.merge for p in seen[2:])
    # The merged repeats add k x a row instead of the row k times: fp32 rounding apart.
    torch.testing.assert_close(merged.weights, plain.weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(merged.momentum1, plain.momentum1, rtol=1e-5, atol=1e-6)
    assert not torch.equal(merged.weights, build("EXACT_ROWWISE_ADAGRAD", specs=SPECS, ftm=FTM).weights)
    assert_bitwise_equal(merged, _train(MERGED, pooling, steps=2))  # repeatable


def test_mean_without_the_merge_keeps_the_positions_kernel(monkeypatch):
    """MEAN's factor travels packed with the bag: without the merge the plan makes its own."""
    seen = _spy_plans(monkeypatch)
    _train(FUSED, "MEAN", steps=1)
    assert seen == [None]


def _expected_positions(emb, indices, offsets, B, mean):
    """Per position: the global row (max int32 for a repeat of an earlier id of its round of
    32), and for kept ones the bag and factor (the round's count of the id, x 1/L for MEAN)."""
    rows, bags, factors = [], [], []
    bases = [sum(emb.table_rows[:t]) for t in range(len(emb.table_rows))]
    for bag in range(offsets.numel() - 1):
        start, end = int(offsets[bag]), int(offsets[bag + 1])
        base = bases[emb.feature_table_map[bag // B]]
        for r0 in range(start, end, 32):
            ids = indices[r0:min(r0 + 32, end)].tolist()
            for i, v in enumerate(ids):
                kept = v not in ids[:i]
                rows.append(base + v if kept else torch.iinfo(torch.int32).max)
                factor = float(ids.count(v)) * ((1.0 / max(end - start, 1)) if mean else 1.0)
                bags.append(bag if kept else -1)
                factors.append(factor if kept else 0.0)
    return torch.tensor(rows, dtype=torch.int32), torch.tensor(bags), torch.tensor(factors)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_the_forward_writes_rows_bags_and_counts(pooling):
    emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling, specs=SPECS, ftm=FTM)
    B = 2
    indices, offsets = _long_bags(emb, B, seed=5, hot=0.6)
    indices[offsets[1] + 3] = indices[offsets[1] + 35]  # one id in two rounds of its bag: two kept ids
    written = {}
    for merge in (False, True):
        positions = ForwardPositions(indices.numel(), torch.int32, indices.device, merge)
        status = new_status(indices.device)
        launch_forward(emb.weights, emb.feature_meta, indices, offsets, None, status, emb.feature_dims,
                       int(Pooling[pooling]), int(BoundsCheck.WARNING), torch.float32, emb._align,
                       positions)  # fmt: skip
        assert positions.written
        written[merge] = positions
    rows, bags, factors = _expected_positions(emb, indices, offsets, B, pooling == "MEAN")
    assert torch.equal(written[True].rows, rows)
    kept = rows != torch.iinfo(torch.int32).max
    assert 0 < int(kept.sum()) < indices.numel()  # some repeats merged, not all
    got_bags, got_factors = unpack_bags(written[True].bags[kept])
    assert torch.equal(got_bags.long(), bags[kept])
    torch.testing.assert_close(got_factors, factors[kept].float(), rtol=1e-6, atol=0)
    # Unmerged: every position's own row and its bag.
    lengths = offsets[1:] - offsets[:-1]
    every_bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    bases = torch.tensor([sum(emb.table_rows[:t]) for t in emb.feature_table_map])
    assert torch.equal(written[False].rows.long(), indices + bases[every_bag // B])
    assert torch.equal(written[False].bags.long(), every_bag)


def test_the_warp_kernel_of_several_bags_a_program_writes_them_too():
    """FLAT 3 (BAGS bags a program, a warp each; the tuner's configurations) as FLAT 4."""
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=SPECS, ftm=FTM)
    B = 3
    indices, offsets = _long_bags(emb, B, seed=6, hot=0.5)
    written = {}
    for flat, bags in ((4, 1), (3, 2)):
        positions = ForwardPositions(indices.numel(), torch.int32, indices.device, merge=True)
        out = torch.empty(B, sum(emb.feature_dims))
        assert forward_into(out, emb.weights, emb.feature_meta, None, indices, offsets, None, new_status("cpu"),
                            int(Pooling.SUM), int(BoundsCheck.WARNING), emb._align, (bags, 8, 128, bags, 1, 0, flat),
                            positions)  # fmt: skip
        written[flat] = positions
    assert torch.equal(written[3].rows, written[4].rows)
    kept = written[4].rows != torch.iinfo(torch.int32).max
    assert torch.equal(written[3].bags[kept], written[4].bags[kept])


def test_other_forward_kernels_leave_the_positions_to_the_backward(monkeypatch):
    """16-column rows take another kernel: nothing written, the plan makes its own."""
    seen = _spy_plans(monkeypatch)
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=[(40, 16), (50, 16)], ftm=FTM)
    emb.backward_launch = MERGED
    indices, offsets = _long_bags(emb, 2, seed=7)
    emb(indices, offsets).sum().backward()
    assert len(seen) == 1 and seen[0] is not None and not seen[0].written
    plain = build("EXACT_ROWWISE_ADAGRAD", specs=[(40, 16), (50, 16)], ftm=FTM)
    plain.backward_launch = PLAIN
    plain(indices, offsets).sum().backward()
    assert_bitwise_equal(emb, plain)


def test_irregular_offsets_are_rewritten_by_the_backward_rule():
    """Offsets that leave positions in no bag (a gap before the first, which FBGEMM's check
    lets pass) or in two (a decreasing offset, which it reports): the forward reads its clamped
    ranges; the positions are rewritten on the device, unmerged, as the positions kernel
    makes them, and training matches the plain plan bitwise."""
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=SPECS, ftm=FTM)
    indices, offsets = _long_bags(emb, 2, seed=8)
    gap = offsets.clone()
    gap[0] = 3  # positions 0..2 in no bag
    overlap = offsets.clone()
    overlap[2] = overlap[1] - 4  # bag 1 starts inside bag 0
    for bad in (gap, overlap):
        models = []
        for launch in (PLAIN, FUSED, MERGED):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the decreasing offset's report
                models.append(_train(launch, "SUM", steps=1, batches=[(indices, bad)]))
        assert_bitwise_equal(models[0], models[1])
        assert_bitwise_equal(models[0], models[2])


def test_repair_leaves_regular_offsets_alone():
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=SPECS, ftm=FTM)
    indices, offsets = _long_bags(emb, 2, seed=9)
    for dtype in (torch.int32, torch.int64):
        rows = torch.full((indices.numel(),), 7, dtype=torch.int32)
        bags = torch.full((indices.numel(),), 11, dtype=dtype)
        repair_positions(emb.feature_meta, indices, offsets, 2, offsets.numel() - 1, False, True, rows, bags)
        assert bool((rows == 7).all()) and bool((bags == 11).all())


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_forward_positions_on_cuda(monkeypatch, optimizer):
    """Zipf(1.15) ids over three tables of D=128 (B=16384, 20 ids a bag: the warp kernel, hot
    rows repeating within bags), the plan on the side stream: the forward's positions train
    bit for bit as the positions kernel's; merged, up to fp32 rounding, two runs bit for bit."""
    from tests.ops.backward_helpers import assert_step_close, cuda_zipf_steps

    seen = _spy_plans(monkeypatch)
    plain = dataclasses.replace(runs_launch(), graph_max_ids=0, forward_positions=False)
    fused = dataclasses.replace(plain, forward_positions=True)
    merged = dataclasses.replace(plain, forward_merge=True)
    modules, _ = cuda_zipf_steps(optimizer, (plain, fused, merged, merged), dims=(128, 128, 128))
    assert seen[0] is None and all(p is not None and p.written for p in seen[1:])
    assert_bitwise_equal(modules[1], modules[0])  # the positions kernel's plan, bit for bit
    assert_step_close(modules[2], modules[0])
    assert_bitwise_equal(modules[2], modules[3])
