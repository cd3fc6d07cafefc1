"""Ours vs FBGEMM's TBE on the same weights and inputs: CPU TBE here, CUDA TBE on the device.

FBGEMM's CPU TBE serves FP32/FP16 weights, FP32/FP16 outputs and needs D % 4 == 0;
PoolingMode.NONE needs one D for all tables. The GPU tests cover the larger shapes.
"""

import logging

import pytest
import torch

logging.getLogger().setLevel(logging.ERROR)  # fbgemm-gpu 1.6 logs a version note many times
fbgemm_training = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # noqa: E402
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)

from tbe_plugin import TritonTableBatchedEmbeddingBags  # noqa: E402
from tests.helpers import assert_tbe_close, make_bags  # noqa: E402

ComputeDevice = fbgemm_training.ComputeDevice
SplitTBE = fbgemm_training.SplitTableBatchedEmbeddingBagsCodegen
_SPARSE = {torch.float32: SparseType.FP32, torch.float16: SparseType.FP16, torch.bfloat16: SparseType.BF16}


def make_pair(dims, rows, device, weights_dtype=torch.float32, output_dtype=torch.float32,
              pooling=PoolingMode.SUM, feature_table_map=None, bounds=BoundsCheckMode.WARNING):  # fmt: skip
    """FBGEMM's TBE and ours, built with the same arguments, ours holding FBGEMM's weights."""
    on_cpu = device == "cpu"
    location = EmbeddingLocation.HOST if on_cpu else EmbeddingLocation.DEVICE
    compute = ComputeDevice.CPU if on_cpu else ComputeDevice.CUDA
    specs = [(r, d, location, compute) for r, d in zip(rows, dims)]
    kwargs = dict(
        feature_table_map=feature_table_map,
        weights_precision=_SPARSE[weights_dtype],
        output_dtype=_SPARSE[output_dtype],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        pooling_mode=pooling,
        bounds_check_mode=bounds,
    )
    torch.manual_seed(0)
    fbgemm = SplitTBE(specs, **kwargs)
    fbgemm.init_embedding_weights_uniform(-0.5, 0.5)
    ours = TritonTableBatchedEmbeddingBags(specs, **kwargs)
    with torch.no_grad():
        for mine, theirs in zip(ours.split_embedding_weights(), fbgemm.split_embedding_weights()):
            mine.copy_(theirs)
    return fbgemm, ours


def feature_rows(module, rows):
    ftm = module.feature_table_map
    return [rows[t] for t in ftm]


@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pooled_matches_fbgemm_cpu(pooling, weighted, weights_dtype, index_dtype):
    dims, rows = [4, 12, 8, 20], [30, 11, 17, 25]
    fbgemm, ours = make_pair(dims, rows, "cpu", weights_dtype, pooling=pooling,
                             feature_table_map=[0, 1, 2, 3, 1])  # fmt: skip
    indices, offsets = make_bags(feature_rows(ours, rows), B=4, max_len=6, index_dtype=index_dtype,
                                 seed=21, hot_fraction=0.25)  # fmt: skip
    psw = torch.rand(indices.numel()) if weighted else None
    expected = fbgemm(indices.clone(), offsets.clone(), psw)
    assert_tbe_close(ours(indices, offsets, psw), expected, 6)


def test_unpooled_and_fp16_output_match_fbgemm_cpu():
    fbgemm, ours = make_pair([8, 8], [13, 21], "cpu", pooling=PoolingMode.NONE)
    indices, offsets = make_bags(feature_rows(ours, [13, 21]), B=3, max_len=4, seed=22)
    assert_tbe_close(ours(indices, offsets), fbgemm(indices.clone(), offsets.clone()), 1)
    fbgemm, ours = make_pair([8, 12], [13, 21], "cpu", output_dtype=torch.float16)
    indices, offsets = make_bags(feature_rows(ours, [13, 21]), B=3, max_len=4, seed=23)
    assert_tbe_close(ours(indices, offsets), fbgemm(indices.clone(), offsets.clone()), 4)


def test_bad_ids_and_offsets_repaired_as_fbgemm_cpu():
    fbgemm, ours = make_pair([4, 8], [10, 6], "cpu", bounds=BoundsCheckMode.IGNORE)
    indices = torch.tensor([1, 12, 3, -2, 5, 7, 2, 9, 0])
    offsets = torch.tensor([0, 2, 4, 6, 10])  # last offset past len(indices)
    expected = fbgemm(indices.clone(), offsets.clone())
    assert_tbe_close(ours(indices, offsets), expected, 4)


def test_init_uniform_draws_the_same_weights_as_fbgemm():
    specs = [(50, 8, EmbeddingLocation.HOST, ComputeDevice.CPU), (20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    torch.manual_seed(5)
    fbgemm = SplitTBE(specs)
    fbgemm.init_embedding_weights_uniform(-0.1, 0.1)
    torch.manual_seed(5)
    ours = TritonTableBatchedEmbeddingBags(specs)
    ours.init_embedding_weights_uniform(-0.1, 0.1)
    for a, b in zip(ours.split_embedding_weights(), fbgemm.split_embedding_weights()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    ours.set_learning_rate(0.01)
    fbgemm.set_learning_rate(0.01)
    assert ours.get_learning_rate() == fbgemm.get_learning_rate()


# -------------------------------------------------------------------- training


# Element-wise adaptive optimizers: their first step is about lr * g / |g| per element, so
# an element whose summed gradient cancels to near zero moves by an amount that depends
# on the summation order (FBGEMM's and ours differ, both exact to rounding). Their parity
# tests use gradients away from zero; the optimizer states still check every sum.
SIGN_LIKE_FIRST_STEP = (EmbOptimType.EXACT_ADAGRAD, EmbOptimType.ADAM, EmbOptimType.LAMB)
LOWP_WEIGHT_TOL = 2e-3  # an fp16 ulp is 2**-11 relative: weights within 1.0 differ by <= 1e-3


def make_training_pair(dims, rows, device, optimizer, weights_dtype=torch.float32, pooling=PoolingMode.SUM,
                       feature_table_map=None, **hyper):  # fmt: skip
    """FBGEMM's TBE and ours with the same optimizer arguments and initial weights."""
    on_cpu = device == "cpu"
    location = EmbeddingLocation.HOST if on_cpu else EmbeddingLocation.DEVICE
    compute = ComputeDevice.CPU if on_cpu else ComputeDevice.CUDA
    specs = [(r, d, location, compute) for r, d in zip(rows, dims)]
    kwargs = dict(feature_table_map=feature_table_map, weights_precision=_SPARSE[weights_dtype],
                  optimizer=optimizer, pooling_mode=pooling, stochastic_rounding=False, **hyper)  # fmt: skip
    fbgemm = SplitTBE(specs, **kwargs)
    ours = TritonTableBatchedEmbeddingBags(specs, **kwargs)
    torch.manual_seed(0)
    with torch.no_grad():
        for mine, theirs in zip(ours.split_embedding_weights(), fbgemm.split_embedding_weights()):
            theirs.uniform_(-0.5, 0.5)
            mine.copy_(theirs)
    return fbgemm, ours


def train_both(fbgemm, ours, rows, steps, B, max_len, weighted, device, hot=0.3, seed=0, zipf=None,
               positive_grad=False):  # fmt: skip
    """Trains both on the same batches; outputs, then weights and states must match.

    Low-precision weights may round an update either way where the two sides' fp32 (ours)
    and partly fp64 (FBGEMM's bias corrections) arithmetic differ in the last bits: the
    weights then differ by an ulp, as the final check allows, and every later output by
    up to ``max_len`` such ulps. ``positive_grad`` keeps every summed gradient away from
    zero (see ``SIGN_LIKE_FIRST_STEP``).
    """
    lowp = ours.weights.dtype != torch.float32
    for step in range(steps):
        if zipf is None:
            indices, offsets = make_bags(rows, B=B, max_len=max_len, seed=seed + step, hot_fraction=hot,
                                         device=device)  # fmt: skip
        else:
            indices, offsets = zipf_bags(rows, B, max_len, zipf, seed + step, torch.int64)
        psw = torch.rand(indices.numel(), device=device) if weighted else None
        outs = []
        for module in (fbgemm, ours):
            out = module(indices.clone(), offsets.clone(), psw)
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(step)).to(out)
            if positive_grad:
                grad = grad.abs() + 0.1
            out.backward(grad)
            outs.append(out.detach())
        if lowp and step > 0:
            torch.testing.assert_close(outs[1], outs[0], atol=LOWP_WEIGHT_TOL * max_len, rtol=0)
        else:
            assert_tbe_close(outs[1], outs[0], max_len)
    for mine, theirs in zip(ours.split_embedding_weights(), fbgemm.split_embedding_weights()):
        tol = 1e-5 if mine.dtype == torch.float32 else LOWP_WEIGHT_TOL
        torch.testing.assert_close(mine.float(), theirs.float(), atol=tol, rtol=tol)
    for mine_t, theirs_t in zip(ours.split_optimizer_states(), fbgemm.split_optimizer_states()):
        for mine, theirs in zip(mine_t, theirs_t):
            torch.testing.assert_close(mine, theirs.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "optimizer", [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.EXACT_ADAGRAD]
)
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_training_matches_fbgemm_cpu(optimizer, pooling, weighted):
    """FBGEMM's CPU TBE trains EXACT_SGD/ROWWISE_ADAGRAD/ADAGRAD but ignores weight decay
    (1.8.0): weight decay is compared with the reference (tests/ops) and FBGEMM's CUDA TBE."""
    hyper = dict(learning_rate=0.05, eps=1e-4)
    if pooling == PoolingMode.MEAN and weighted:
        pytest.skip("FBGEMM's CPU backward omits MEAN's 1/L when weighted (its forward applies it); "
                    "the GPU test compares this case")  # fmt: skip
    # One feature per table: FBGEMM's CPU rowwise Adagrad fails on tables shared by
    # features ("num of rows processed by adagrad ... does not match"); the GPU test shares.
    dims, rows = [4, 12, 8], [30, 11, 17]
    fbgemm, ours = make_training_pair(dims, rows, "cpu", optimizer, pooling=pooling, **hyper)
    train_both(fbgemm, ours, rows, steps=3, B=4, max_len=5, weighted=weighted, device="cpu")


# ------------------------------------------------------------------------- GPU


def zipf_bags(rows, B, L, alpha, seed, index_dtype):
    g = torch.Generator().manual_seed(seed)
    F = len(rows)
    ranks = torch.distributions.Pareto(1.0, alpha - 1.0).sample((F * B * L,)).long() - 1
    ids = torch.cat([ranks[f * B * L : (f + 1) * B * L] % rows[f] for f in range(F)])
    perm = torch.randperm(max(rows), generator=g)
    ids = torch.cat([perm[ids[f * B * L : (f + 1) * B * L]] % rows[f] for f in range(F)])
    offsets = torch.arange(0, F * B * L + 1, L)
    return ids.to(index_dtype).cuda(), offsets.to(index_dtype).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_fbgemm_cuda(pooling, weighted, weights_dtype, index_dtype):
    if pooling == PoolingMode.NONE and weighted:
        pytest.skip("FBGEMM ignores per-sample weights with NONE; we refuse them")
    dims = [128] * 6 if pooling == PoolingMode.NONE else [64, 128, 256, 96, 32, 128]
    rows = [100_000, 50_000, 20_000, 100_000, 1000, 7]
    fbgemm, ours = make_pair(dims, rows, "cuda", weights_dtype, pooling=pooling)
    indices, offsets = make_bags(rows, B=512, max_len=40, index_dtype=index_dtype, seed=31,
                                 hot_fraction=0.1, device="cuda")  # fmt: skip
    psw = torch.rand(indices.numel(), device="cuda") if weighted else None
    expected = fbgemm(indices.clone(), offsets.clone(), psw)
    assert_tbe_close(ours(indices, offsets, psw), expected, 40)


@pytest.mark.gpu
@pytest.mark.parametrize("B, L", [(65536, 20), (1, 1000), (4096, 1)])
def test_matches_fbgemm_cuda_large_and_zipf(B, L):
    rows = [1_000_000, 500_000, 100]
    fbgemm, ours = make_pair([128, 64, 32], rows, "cuda")
    indices, offsets = zipf_bags(rows, B, L, alpha=1.15, seed=32, index_dtype=torch.int64)
    expected = fbgemm(indices.clone(), offsets.clone())
    assert_tbe_close(ours(indices, offsets), expected, L)


@pytest.mark.gpu
def test_fatal_on_cuda_raises_and_leaves_the_context_usable():
    from tbe_plugin import BoundsCheckError

    fbgemm, ours = make_pair([16, 16], [100, 50], "cuda", bounds=BoundsCheckMode.FATAL)
    indices, offsets = make_bags([100, 50], B=64, max_len=8, seed=33, device="cuda")
    bad = indices.clone()
    bad[-1] = 50
    with pytest.raises(BoundsCheckError, match="id 50 at indices"):
        ours(bad, offsets)
    torch.cuda.synchronize()  # no device-side assert: the context still works
    assert_tbe_close(ours(indices, offsets), fbgemm(indices.clone(), offsets.clone()), 8)


@pytest.mark.gpu
def test_bf16_weights_on_cuda_match_reference():
    from tbe_plugin.ops.reference import tbe_forward_reference

    ours = TritonTableBatchedEmbeddingBags([(10_000, 128), (5000, 64)], weights_precision="BF16", device="cuda")
    ours.init_embedding_weights_uniform(-1, 1)
    indices, offsets = make_bags([10_000, 5000], B=1024, max_len=30, seed=34, device="cuda")
    expected = tbe_forward_reference(ours.split_embedding_weights(), [0, 1], indices.cpu(), offsets.cpu())
    assert_tbe_close(ours(indices, offsets), expected.cuda(), 30)


ALL_OPTIMIZERS = [
    EmbOptimType.EXACT_SGD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.ADAM,
    EmbOptimType.PARTIAL_ROWWISE_ADAM,
    EmbOptimType.LAMB,
]


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ALL_OPTIMIZERS)
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE])
@pytest.mark.parametrize("weighted", [False, True])
def test_training_matches_fbgemm_cuda(optimizer, pooling, weighted):
    if pooling == PoolingMode.NONE and weighted:
        pytest.skip("FBGEMM ignores per-sample weights with NONE; we refuse them")
    dims = [64] * 4 if pooling == PoolingMode.NONE else [64, 128, 32, 96]
    rows = [5000, 300, 20_000, 7]
    fbgemm, ours = make_training_pair(dims, rows, "cuda", optimizer, pooling=pooling,
                                      feature_table_map=[0, 1, 2, 3, 1], learning_rate=0.05)  # fmt: skip
    train_both(fbgemm, ours, [rows[t] for t in [0, 1, 2, 3, 1]], steps=3, B=256, max_len=12,
               weighted=weighted, device="cuda", positive_grad=optimizer in SIGN_LIKE_FIRST_STEP)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "optimizer, mode",
    [
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, "L2"),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, "DECOUPLE"),
        (EmbOptimType.ADAM, "NONE"),
        (EmbOptimType.PARTIAL_ROWWISE_ADAM, "NONE"),
        (EmbOptimType.LAMB, "NONE"),
    ],
)
def test_weight_decay_matches_fbgemm_cuda(optimizer, mode):
    WeightDecayMode = fbgemm_training.WeightDecayMode
    fbgemm, ours = make_training_pair([64, 32], [3000, 500], "cuda", optimizer, learning_rate=0.05,
                                      weight_decay=0.01, weight_decay_mode=WeightDecayMode[mode])  # fmt: skip
    train_both(fbgemm, ours, [3000, 500], steps=3, B=256, max_len=10, weighted=False, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ALL_OPTIMIZERS)
def test_training_fp16_weights_matches_fbgemm_cuda(optimizer):
    fbgemm, ours = make_training_pair([128, 64], [10_000, 2000], "cuda", optimizer,
                                      weights_dtype=torch.float16, learning_rate=0.05)  # fmt: skip
    try:  # FBGEMM 1.6's fp16 Adam backward raised in its CUDA template on the H200
        probe, _ = make_training_pair([128, 64], [10_000, 2000], "cuda", optimizer,
                                      weights_dtype=torch.float16, learning_rate=0.05)  # fmt: skip
        out = probe(torch.tensor([1, 2], device="cuda"), torch.tensor([0, 1, 2], device="cuda"))
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
    except RuntimeError as error:
        pytest.skip(f"FBGEMM cannot train {optimizer.name} with fp16 weights here: {str(error)[:200]}")
    train_both(fbgemm, ours, [10_000, 2000], steps=2, B=512, max_len=10, weighted=False, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ALL_OPTIMIZERS)
def test_training_zipf_hot_rows_large_batch_matches_fbgemm_cuda(optimizer):
    rows = [1_000_000, 100_000]
    fbgemm, ours = make_training_pair([128, 64], rows, "cuda", optimizer, learning_rate=0.01)
    train_both(fbgemm, ours, rows, steps=2, B=65536, max_len=20, weighted=False, device="cuda",
               zipf=1.15, positive_grad=True)  # fmt: skip
