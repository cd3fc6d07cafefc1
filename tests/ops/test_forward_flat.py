"""The flat-range pooled forward (``ops.forward_flat``, launch configs with FLAT) against the
reference and against the lockstep kernel (CPU, Triton interpreter, small shapes)."""

import pytest
import torch

from tbe_plugin.ops.common import STATUS_BAD_OFFSETS
from tbe_plugin.ops.embedding_forward import _work_items, forward_into
from tests.helpers import assert_tbe_close, make_bags
from tests.ops.test_embedding_forward import build, reference, rows_of


def run(emb, indices, offsets, psw, config, direct=False, batch=None):
    B = batch if batch is not None else (offsets.numel() - 1) // len(emb.feature_dims)
    work = None if direct else _work_items(emb.feature_dims, config[2], emb.device)
    out = torch.full((B, sum(emb.feature_dims)), float("nan"), device=indices.device)  # every element written
    forward_into(out, emb.weights, emb.feature_meta, work, indices, offsets, psw, emb.bounds_check_status,
                 int(emb.pooling_mode), int(emb.bounds_check_mode), emb._align, config)  # fmt: skip
    return out


@pytest.mark.parametrize("pooling, weighted", [("SUM", False), ("MEAN", True)])  # the interpreter: ~20 s each
def test_flat_ranges_sum_the_bags_in_order(pooling, weighted):
    """Bags of 0-23 ids (empty ones too) in programs of 4-16 bags, 4-16 ids a step, ids a step
    ahead or not: the reference's sums, and bit for bit the lockstep kernel's one id a step
    (both add a bag's rows one after another; MEAN scales the sum), so a bag that spans
    steps, starts or ends at a step's edge, or shares a step with others is summed whole."""
    emb = build(pooling=pooling)
    B = 7  # programs of 4 bags: the last one part-filled
    indices, offsets = make_bags(rows_of(emb), B=B, max_len=23, seed=23, hot_fraction=0.3)
    lengths = offsets[1:] - offsets[:-1]
    assert (lengths == 0).any() and (lengths == 1).any() and (lengths > 8).any()
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(23)) if weighted else None
    expected = reference(emb, indices, offsets, psw)
    for bags, block_l, block_d, prefetch, flat in [(4, 8, 64, 0, 1), (4, 4, 16, 1, 2), (16, 16, 64, 1, 1),
                                                   (8, 8, 64, 1, 2)]:  # fmt: skip
        out = run(emb, indices, offsets, psw, (bags, block_l, block_d, 1, 1, prefetch, flat))
        assert_tbe_close(out, expected, 23)
        lockstep = run(emb, indices, offsets, psw, (bags, 1, block_d, 1, 1, 0))
        assert torch.equal(out, lockstep), (bags, block_l, block_d, prefetch, flat)
        if max(emb.feature_dims) <= block_d:
            assert torch.equal(run(emb, indices, offsets, psw, (bags, block_l, block_d, 1, 1, prefetch, flat),
                                   direct=True), out)  # fmt: skip


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_repaired_offsets_sum_bag_by_bag(pooling):
    """Offsets the WARNING mode repairs (a decreasing one, an end past the ids) leave bags that
    overlap or skip ids: the flat kernel sums such a program's bags one by one and gives
    FBGEMM's repaired sums (as the lockstep kernel, bit for bit); the valid program beside
    it takes the flat path."""
    emb = build(specs=[(10, 4)], feature_table_map=[0], bounds_check_mode="WARNING", pooling=pooling)
    indices = torch.arange(12) % 10
    offsets = torch.tensor([0, 3, 2, 13, 5, 6, 8, 9, 12])  # bags 0-3 (one program of 4) need repair
    with pytest.warns(RuntimeWarning, match="invalid offsets"):
        emb(indices, offsets)  # the module's own launch warns
    out = run(emb, indices, offsets, None, (4, 4, 16, 1, 1, 1, 1))
    assert torch.equal(out, run(emb, indices, offsets, None, (4, 1, 16, 1, 1, 0)))
    # With bag marks, a bad offset anywhere sends every program bag by bag: the same sums.
    assert torch.equal(out, run(emb, indices, offsets, None, (4, 4, 16, 1, 1, 1, 2)))
    # Repaired per bag: start clamped into [0, 12], end into [start, 12]; bag 2 overlaps bag 1.
    bounds = [(0, 3), (3, 3), (2, 12), (12, 12), (5, 6), (6, 8), (8, 9), (9, 12)]
    rows = emb.split_embedding_weights()[0]
    for b, (s, e) in enumerate(bounds):
        want = rows[indices[s:e]].sum(0) / (e - s if pooling == "MEAN" else 1) if e > s else torch.zeros(4)
        torch.testing.assert_close(out[b], want, rtol=1e-6, atol=1e-6)


def test_an_unknown_flat_value_raises_naming_it():
    emb = build()
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=3, seed=1)
    with pytest.raises(ValueError, match="seventh value \\(FLAT\\) must be 0, 1, 2, 3 or 4, got 5"):
        run(emb, indices, offsets, None, (4, 4, 16, 1, 1, 1, 5))


@pytest.mark.gpu
def test_flat_kernel_on_the_device_matches_the_lockstep_kernel():
    """On CUDA, the flat kernel with bag marks on a production-shaped batch (Poisson bags of
    means 5-40, Zipf ids, ~2.4M ids) equals the lockstep kernel's within fp32 rounding and
    gives the same bits twice, and with one bad offset (WARNING: every program then sums
    its bags one by one) the lockstep kernel's repaired sums."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

    tables = tuple(TableWorkload(rows=100_000, dim=128, mean_pooling=5.0 + 5 * t, alpha=1.1) for t in range(8))
    workload = Workload("flat", tables, batch_size=16384)
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables], bounds_check_mode="WARNING",
                                          device="cuda")  # fmt: skip
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets, _ = generate_batch(workload, seed=3, device="cuda")
    flat, lockstep = (32, 32, 128, 1, 1, 1, 2), (16, 2, 128, 1, 1, 1)
    with torch.no_grad():
        out = run(emb, indices, offsets, None, flat)
        assert torch.equal(out, run(emb, indices, offsets, None, flat))
        torch.testing.assert_close(out, run(emb, indices, offsets, None, lockstep), rtol=1e-5, atol=1e-5)
        bad = offsets.clone()
        bad[5] = bad[4] - 1  # bag 4 ends before it starts
        torch.testing.assert_close(run(emb, indices, bad, None, flat), run(emb, indices, bad, None, lockstep),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
        assert int(emb.bounds_check_status[STATUS_BAD_OFFSETS]) > 0  # the bad offset was counted
