"""ops.hot_product: hot rows' gradient sums as a count-matrix product, in a fixed order."""

import pytest
import torch

from tbe_plugin.ops.hot_product import hot_sums


def _case(F=3, K=16, B=150, dims=(8, 24, 16), seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (F, K, B), generator=generator).float()
    counts[1, 5] = 0  # a slot whose row sits in no bag
    grad = torch.randn(B, sum(dims), generator=generator)
    col_offsets = torch.tensor([0, dims[0], dims[0] + dims[1]])
    return counts, grad, col_offsets, torch.tensor(dims)


def test_hot_sums_match_the_product_per_feature():
    """Mixed D, B not a multiple of the slices or the bag blocks, an empty slot: each feature's
    rows are counts @ its columns (fp64 reference), zero past its D; two calls bitwise equal."""
    counts, grad, col_offsets, dims = _case()
    # Offsets and D as columns of one metadata tensor (strided views), as the backward passes them.
    meta = torch.stack([col_offsets, dims], 1)
    got = hot_sums(counts, grad, meta[:, 0], meta[:, 1], split_b=64, block_b=32, block_d=16)
    assert got.shape == (3, 16, 24)
    for f in range(3):
        cols = grad[:, int(col_offsets[f]) : int(col_offsets[f] + dims[f])].double()
        want = counts[f].double() @ cols
        torch.testing.assert_close(got[f, :, : int(dims[f])].double(), want, rtol=1e-5, atol=1e-5)
        assert not got[f, :, int(dims[f]) :].any()
    assert not got[1, 5].any()
    assert torch.equal(got, hot_sums(counts, grad, col_offsets, dims, split_b=64, block_b=32, block_d=16))


def test_hot_sums_reject_bad_shapes():
    counts, grad, col_offsets, dims = _case()
    with pytest.raises(ValueError, match="power of two"):
        hot_sums(counts[:, :12], grad, col_offsets, dims)
    with pytest.raises(ValueError, match="fp32"):
        hot_sums(counts.double(), grad, col_offsets, dims)
    with pytest.raises(ValueError, match="grad must be"):
        hot_sums(counts, grad[:10], col_offsets, dims)
    with pytest.raises(ValueError, match="multiple of block_b"):
        hot_sums(counts, grad, col_offsets, dims, split_b=48, block_b=32)


def test_hot_sums_scale_each_bag_first():
    """``bag_scale`` (MEAN's 1/L a bag): the product of the scaled counts, the fp64 sum up to
    fp32 rounding."""
    counts, grad, col_offsets, dims = _case(B=70)
    scale = torch.rand(3 * 70)
    got = hot_sums(counts, grad, col_offsets, dims, split_b=64, block_b=32, block_d=16, bag_scale=scale)
    for f in range(3):
        cols = grad[:, int(col_offsets[f]) : int(col_offsets[f] + dims[f])] * scale[f * 70 : (f + 1) * 70, None]
        torch.testing.assert_close(got[f, :, : int(dims[f])].double(), counts[f].double() @ cols.double(), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="bag_scale"):
        hot_sums(counts, grad, col_offsets, dims, bag_scale=scale[:-1])


@pytest.mark.parametrize("scaled", [False, True])
def test_hot_sums_on_tf32x3(scaled):
    """``tf32x3`` (RunsLaunch.hot_tf32x3): the same sums up to ~2**-21 of each operand (the
    interpreter computes the dots in full precision; the GPU test bounds the tensor cores'),
    two calls bitwise equal."""
    counts, grad, col_offsets, dims = _case(B=70)
    scale = torch.rand(3 * 70) if scaled else None
    sizes = dict(split_b=64, block_b=32, block_d=16, bag_scale=scale)
    got = hot_sums(counts, grad, col_offsets, dims, tf32x3=True, **sizes)
    want = hot_sums(counts, grad, col_offsets, dims, **sizes)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    assert torch.equal(got, hot_sums(counts, grad, col_offsets, dims, tf32x3=True, **sizes))


@pytest.mark.gpu
@pytest.mark.parametrize("K", [16, 64])
def test_hot_sums_on_tf32x3_on_cuda(K):
    """On the tensor cores, ctr-dlrm-sized (30 features, B=16384, D=128, counts 0-3): each sum
    within 2**-19 of the sum of its terms' magnitudes of the fp32 FMA sum (one TF32 product,
    ~2**-11 a term, reaches that on average over 16384 random terms; three keep ~2**-21 a
    term), bitwise repeatable."""
    generator = torch.Generator().manual_seed(1)
    F, B, D = 30, 16384, 128
    counts = torch.randint(0, 4, (F, K, B), generator=generator).float().cuda()
    grad = torch.randn(B, F * D, generator=generator).cuda()
    col_offsets = torch.arange(F).cuda() * D
    dims = torch.full((F,), D).cuda()
    fp32 = hot_sums(counts, grad, col_offsets, dims, max_dim=D)
    tf32x3 = hot_sums(counts, grad, col_offsets, dims, max_dim=D, tf32x3=True)
    magnitude = counts @ grad.abs().view(B, F, D).transpose(0, 1)  # each sum's terms' magnitudes (counts >= 0)
    assert bool(((tf32x3 - fp32).abs() <= 2**-19 * magnitude).all())
    assert torch.equal(tf32x3, hot_sums(counts, grad, col_offsets, dims, max_dim=D, tf32x3=True))
