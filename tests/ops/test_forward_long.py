"""The lockstep pooled forward's LONG option (a launch config's eighth value): tables whose
bags average at least LONG ids are summed a bag at a time, the others in lockstep (CPU,
Triton interpreter, small shapes)."""

import pytest
import torch

from tests.helpers import assert_tbe_close, make_bags
from tests.ops.test_embedding_forward import build, reference, rows_of
from tests.ops.test_forward_flat import run


def mixed_length_bags(emb, B, max_lens, seed):
    """Feature-major bags whose lengths are uniform in [0, max_lens[f]]: short and long
    features in one batch (``make_bags`` per feature, joined)."""
    rows = rows_of(emb)
    parts = [make_bags([rows[f]], B=B, max_len=m, seed=seed + f, hot_fraction=0.3) for f, m in enumerate(max_lens)]
    indices = torch.cat([ids for ids, _ in parts])
    lengths = torch.cat([off[1:] - off[:-1] for _, off in parts])
    return indices, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


@pytest.mark.parametrize("pooling, weighted", [("SUM", False), ("MEAN", True)])
def test_long_tables_go_bag_by_bag_and_sum_right(pooling, weighted):
    """Features averaging 1, 12 and 20 ids (two share a table) in programs of 4 bags with
    LONG 8: the long ones go bag by bag, 8 ids a step, over several steps, the short ones in
    lockstep; every sum is the reference's, and a LONG no table reaches gives the default
    launch's bits."""
    emb = build(pooling=pooling)
    B = 7  # programs of 4 bags: the last one part-filled
    indices, offsets = mixed_length_bags(emb, B, max_lens=[2, 24, 2, 40, 0], seed=11)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(11)) if weighted else None
    expected = reference(emb, indices, offsets, psw)
    plain = run(emb, indices, offsets, psw, (4, 2, 64, 1, 1, 1))
    for prefetch in (0, 1):
        out = run(emb, indices, offsets, psw, (4, 2, 64, 1, 1, prefetch, 0, 8))
        assert_tbe_close(out, expected, 40)
        lens = (offsets[1:] - offsets[:-1]).reshape(5, B).float().mean(1)
        assert (lens[[1, 3]] >= 8).all() and (lens[[0, 2, 4]] < 8).all()  # both paths taken
        assert torch.equal(out[:, :8], plain[:, :8])  # feature 0: lockstep either way
    assert torch.equal(run(emb, indices, offsets, psw, (4, 2, 64, 1, 1, 1, 0, 1000)), plain)


def test_bad_long_values_raise_naming_them():
    emb = build()
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=3, seed=1)
    for config in [(4, 2, 16, 1, 1, 1, 0, -1), (4, 2, 16, 1, 1, 1, 1, 8), (4, 2, 16, 1, 1, 1, 0, 2.5)]:
        with pytest.raises(ValueError, match="eighth value \\(LONG\\) must be an int >= 0"):
            run(emb, indices, offsets, None, config)


@pytest.mark.gpu
def test_long_tables_on_the_device():
    """On CUDA, a production-shaped batch (Poisson bags of means 5-40, Zipf ids): LONG 16
    sends half the tables bag by bag; sums within fp32 rounding of the default launch, the
    same bits twice, and the short tables' columns bit for bit the default's."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

    tables = tuple(TableWorkload(rows=100_000, dim=128, mean_pooling=5.0 + 5 * t, alpha=1.1) for t in range(8))
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables], device="cuda")
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets, _ = generate_batch(Workload("long", tables, batch_size=16384), seed=3, device="cuda")
    with torch.no_grad():
        plain = run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1))
        out = run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1, 0, 16))
        assert torch.equal(out, run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1, 0, 16)))
        torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-4)
        assert torch.equal(out[:, :128 * 2], plain[:, :128 * 2])  # means 5 and 10: lockstep
        assert not torch.equal(out[:, -128:], plain[:, -128:])  # mean 40: summed in another order
