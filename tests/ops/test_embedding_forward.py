"""Forward kernels vs the pure-PyTorch reference (CPU, Triton interpreter, small shapes)."""

import pytest
import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops.common import Pooling
from tbe_plugin.ops.reference import tbe_forward_reference
from tests.helpers import assert_tbe_close, make_bags

# Mixed dims, one not a power of two and one not a multiple of 4; feature 3 shares table 1.
SPECS = [(23, 8), (17, 12), (9, 36), (30, 5)]
FEATURE_TABLE_MAP = [0, 1, 2, 1, 3]
MAX_LEN = 5


def build(weights_dtype=torch.float32, output_dtype=torch.float32, pooling="SUM", specs=SPECS,
          feature_table_map=FEATURE_TABLE_MAP, **kwargs):  # fmt: skip
    names = {torch.float32: "FP32", torch.float16: "FP16", torch.bfloat16: "BF16"}
    emb = TritonTableBatchedEmbeddingBags(
        specs,
        feature_table_map=feature_table_map,
        weights_precision=names[weights_dtype],
        output_dtype=names[output_dtype],
        pooling_mode=pooling,
        device="cpu",
        **kwargs,
    )
    torch.manual_seed(0)
    emb.init_embedding_weights_uniform(-1.0, 1.0)
    return emb


def rows_of(emb):
    return [emb.table_rows[t] for t in emb.feature_table_map]


def reference(emb, indices, offsets, psw=None, upcast=True):
    return tbe_forward_reference(
        emb.split_embedding_weights(), emb.feature_table_map, indices, offsets, psw,
        pooling=int(emb.pooling_mode), output_dtype=emb.output_dtype, upcast=upcast,
    )  # fmt: skip


@pytest.mark.parametrize("pooling", ["SUM", "MEAN", "NONE"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_forward_matches_reference(pooling, weighted, weights_dtype, index_dtype):
    if pooling == "NONE" and weighted:
        pytest.skip("per-sample weights are refused with PoolingMode.NONE (tested below)")
    emb = build(weights_dtype, pooling=pooling)
    indices, offsets = make_bags(rows_of(emb), B=3, max_len=MAX_LEN, index_dtype=index_dtype,
                                 seed=1, hot_fraction=0.3)  # fmt: skip
    psw = torch.rand(indices.numel()) if weighted else None
    out = emb(indices, offsets, psw)
    assert_tbe_close(out, reference(emb, indices, offsets, psw), MAX_LEN)


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("output_dtype", [torch.float16, torch.bfloat16])
def test_low_precision_outputs(weights_dtype, output_dtype):
    emb = build(weights_dtype, output_dtype)
    indices, offsets = make_bags(rows_of(emb), B=4, max_len=MAX_LEN, seed=2)
    out = emb(indices, offsets)
    expected = reference(emb, indices, offsets)
    lowp = reference(emb, indices, offsets, upcast=False)
    assert_tbe_close(out, expected, MAX_LEN, lowp_reference=lowp)


def test_fp32_accumulation_beats_low_precision_sum():
    """A long fp16 bag: fp32 accumulation stays within one output rounding of exact."""
    emb = build(torch.float16, torch.float32, specs=[(4, 8)], feature_table_map=[0])
    indices = torch.zeros(200, dtype=torch.int64)
    offsets = torch.tensor([0, 200])
    out = emb(indices, offsets)
    exact = emb.split_embedding_weights()[0][0].double() * 200
    assert (out[0].double() - exact).abs().max() < 1e-4


@pytest.mark.parametrize("pooling", ["SUM", "MEAN", "NONE"])
def test_empty_inputs(pooling):
    emb = build(pooling=pooling)
    F = len(FEATURE_TABLE_MAP)
    # B = 0: offsets holds only the end.
    out = emb(torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    assert out.shape == ((0, sum(emb.feature_dims)) if pooling != "NONE" else (0, 36))
    # B = 2, every bag empty: zeros (MEAN of an empty bag is zero).
    out = emb(torch.zeros(0, dtype=torch.int64), torch.zeros(F * 2 + 1, dtype=torch.int64))
    if pooling == "NONE":
        assert out.shape == (0, 36)
    else:
        assert out.shape == (2, sum(emb.feature_dims))
        assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_batch_of_one_long_bags_and_features_without_lookups(pooling):
    emb = build(pooling=pooling)
    indices, offsets = make_bags(rows_of(emb), B=1, max_len=40, seed=3, empty_features=[1, 4])
    out = emb(indices, offsets)
    assert_tbe_close(out, reference(emb, indices, offsets), 40)
    cols = emb.D_offsets
    assert torch.count_nonzero(out[:, cols[1] : cols[2]]) == 0


def test_single_table_single_feature_dim_one():
    emb = build(specs=[(7, 1)], feature_table_map=[0])
    indices, offsets = make_bags([7], B=5, max_len=3, seed=4)
    assert_tbe_close(emb(indices, offsets), reference(emb, indices, offsets), 3)


def test_mixed_index_and_offset_dtypes():
    emb = build()
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=MAX_LEN, seed=5)
    expected = reference(emb, indices, offsets)
    assert_tbe_close(emb(indices.int(), offsets.long()), expected, MAX_LEN)
    assert_tbe_close(emb(indices.long(), offsets.int()), expected, MAX_LEN)


def test_all_ids_hot():
    emb = build()
    F = len(FEATURE_TABLE_MAP)
    lengths = torch.full((F * 3,), 6)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.full((int(lengths.sum()),), 2, dtype=torch.int64)
    assert_tbe_close(emb(indices, offsets), reference(emb, indices, offsets), 6)


def test_weighted_mean_divides_by_length_not_weight_sum():
    emb = build(pooling="MEAN", specs=[(4, 4)], feature_table_map=[0])
    with torch.no_grad():
        emb.split_embedding_weights()[0].copy_(torch.arange(16.0).view(4, 4))
    out = emb(torch.tensor([1, 2]), torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))
    expected = (torch.arange(4.0, 8.0) * 1 + torch.arange(8.0, 12.0) * 2) / 2
    torch.testing.assert_close(out[0], expected)


def test_unpooled_pads_narrow_tables_with_zeros():
    emb = build(pooling="NONE")
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=3, seed=6)
    out = emb(indices, offsets)
    assert out.shape == (indices.numel(), max(d for _, d in SPECS))
    assert_tbe_close(out, reference(emb, indices, offsets), 1)
    if Pooling.NONE == emb.pooling_mode:
        with pytest.raises(ValueError, match="per_sample_weights"):
            emb(indices, offsets, torch.ones(indices.numel()))


def test_compiles_fullgraph():
    emb = build()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def forward(self, indices, offsets, psw):
            return self.emb(indices, offsets, psw).sum(dim=1) * 2

    model = Model()
    indices, offsets = make_bags(rows_of(emb), B=3, max_len=MAX_LEN, seed=7)
    psw = torch.rand(indices.numel())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(indices, offsets, psw), model(indices, offsets, psw))


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16])
def test_rows_wider_than_one_column_block(weights_dtype):
    """D past the kernel's column block (128 fp32, 256 fp16) is split over programs."""
    specs = [(11, 300), (7, 160), (5, 8)]
    emb = build(weights_dtype, specs=specs, feature_table_map=[0, 1, 2, 0])
    indices, offsets = make_bags(rows_of(emb), B=3, max_len=4, seed=8)
    assert_tbe_close(emb(indices, offsets), reference(emb, indices, offsets), 4)


@pytest.mark.parametrize("weights_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_wide_two_byte_rows_read_whole(weights_dtype, pooling):
    """2-byte rows of 512 columns and more, in bags of 7-48 ids, run in a class of their own
    with a 512-column block (``wide_rows``): a table of D=600 (two blocks, the second
    partial) and one of D=512 beside a narrow one; the reference's sums."""
    from tbe_plugin.ops.embedding_forward import WIDE_TILE, pooled_launch_config, pooled_tile_classes, wide_rows

    specs = [(11, 600), (7, 512), (5, 64)]
    emb = build(weights_dtype, pooling=pooling, specs=specs, feature_table_map=[0, 1, 2, 1])
    indices, offsets = make_bags(rows_of(emb), B=4, max_len=20, seed=3, hot_fraction=0.3)
    avg_len = indices.numel() / (offsets.numel() - 1)
    assert wide_rows(avg_len, 2) and not wide_rows(avg_len, 4) and not wide_rows(3.0, 2)
    assert pooled_tile_classes(emb.feature_dims, True) == ((64, (2,)), (WIDE_TILE, (0, 1, 3)))
    assert pooled_launch_config(avg_len, WIDE_TILE, 2)[2] == WIDE_TILE
    assert pooled_tile_classes(emb.feature_dims) == ((64, (2,)), (128, (0, 1, 3)))  # not wide: 128-column blocks
    assert_tbe_close(emb(indices, offsets), reference(emb, indices, offsets), 20)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
@pytest.mark.parametrize("weighted", [False, True])
def test_every_launch_size_sums_the_bags(pooling, weighted):
    """Every pooled launch config (bags per program, ids per step, column block, warps, ids
    loaded a step ahead or not) gives the reference's sums, and the same config the same bits twice. (The sum over a
    step's ids is a tree, so two configs may differ in the last bits: adding a bag's rows one
    after another, FBGEMM's order, made the H200 forward 1.2-2.3x slower at d7a99c8.) Bags of
    0-23 ids, so that steps of 1 to 16 ids end inside and at the ends of bags."""
    from tbe_plugin.ops.embedding_forward import _work_items, forward_into

    emb = build(pooling=pooling)
    indices, offsets = make_bags(rows_of(emb), B=5, max_len=23, seed=8, hot_fraction=0.3)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(8)) if weighted else None
    expected = reference(emb, indices, offsets, psw)
    configs = [(16, 2, 64, 1, 0), (1, 16, 64, 1, 0), (4, 4, 16, 2, 0), (8, 1, 32, 1, 0), (2, 8, 64, 2, 0),
               (16, 2, 64, 1, 1), (1, 4, 64, 1, 1), (4, 4, 16, 2, 1)]  # the last value: PREFETCH
    directs = 0
    for bags, block_l, block_d, warps, prefetch in configs:
        outputs = []
        # Twice: through the work items, then (where every row fits the column block) with a
        # program column per feature (work items None, DIRECT): the same bits.
        for direct in (False, max(emb.feature_dims) <= block_d):
            directs += direct
            work = None if direct else _work_items(emb.feature_dims, block_d, emb.device)
            out = torch.empty(5, sum(emb.feature_dims))
            forward_into(out, emb.weights, emb.feature_meta, work, indices, offsets, psw, emb.bounds_check_status,
                         int(emb.pooling_mode), int(emb.bounds_check_mode), emb._align,
                         (bags, block_l, block_d, warps, 1, prefetch))  # fmt: skip
            outputs.append(out)
        assert torch.equal(outputs[0], outputs[1])
        assert_tbe_close(outputs[0], expected, 23)
    assert directs >= 4  # the 64-column configs


def test_host_helpers_match_tritons():
    """The launchers' plain-Python ceil division and power of two (Triton's are constexpr
    functions, ~5 us a call on the host) give Triton's values; the tile classes are cached
    and immutable."""
    import triton

    from tbe_plugin.ops.common import cdiv, next_power_of_2
    from tbe_plugin.ops.embedding_forward import pooled_tile_classes

    assert next_power_of_2(0) == 1  # a row of no columns still takes the smallest tile (Triton's gives 0)
    for n in [1, 2, 3, 4, 5, 7, 8, 9, 127, 128, 129, 1000, 2**20 - 1, 2**20, 2**20 + 1, 2**40 + 3]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 64, 1024):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)
    classes = pooled_tile_classes([16, 128, 20, 300, 8, 64])
    assert classes == ((16, (0, 4)), (32, (2,)), (64, (5,)), (128, (1, 3)))
    assert pooled_tile_classes([16, 128, 20, 300, 8, 64]) is classes and isinstance(classes, tuple)
