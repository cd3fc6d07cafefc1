"""The warp-a-bag pooled forward (``ops.forward_warp``, launch configs with FLAT 3) against the
reference and, bit for bit, the lockstep kernel's one id a step (both add a bag's rows one
after another; CPU, Triton interpreter, small shapes)."""

import pytest
import torch

from tests.helpers import assert_tbe_close, make_bags
from tests.ops.test_embedding_forward import build, reference, rows_of
from tests.ops.test_forward_flat import run


@pytest.mark.parametrize("pooling, weighted", [("SUM", False), ("MEAN", True)])
def test_warp_bags_sum_in_order(pooling, weighted):
    """Bags of 0-70 ids (empty ones, and bags over two rounds of 32 ids) in programs of 2-4
    bags, 4-8 rows at once: the reference's sums, the lockstep kernel's bits."""
    emb = build(pooling=pooling)
    B = 5  # programs of 2 or 4 bags: the last one part-filled
    indices, offsets = make_bags(rows_of(emb), B=B, max_len=70, seed=31, hot_fraction=0.3)
    lengths = offsets[1:] - offsets[:-1]
    assert (lengths == 0).any() and (lengths > 64).any()
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(31)) if weighted else None
    expected = reference(emb, indices, offsets, psw)
    for bags, unroll, block_d in [(4, 8, 64), (2, 4, 16)]:
        out = run(emb, indices, offsets, psw, (bags, unroll, block_d, bags, 1, 0, 3))
        assert_tbe_close(out, expected, 70)
        assert torch.equal(out, run(emb, indices, offsets, psw, (bags, 1, block_d, 1, 1, 0))), (bags, unroll)
    # A program column per feature (every row in one column block, as the module launches the
    # end-to-end tables), and int32 ids and offsets: the same bits.
    out = run(emb, indices, offsets, psw, (4, 8, 64, 4, 1, 0, 3))
    assert torch.equal(run(emb, indices, offsets, psw, (4, 8, 64, 4, 1, 0, 3), direct=True), out)
    assert torch.equal(run(emb, indices.int(), offsets.int(), psw, (4, 8, 64, 4, 1, 0, 3)), out)


@pytest.mark.parametrize("pooling, weighted, dtype", [("SUM", False, torch.float32), ("MEAN", True, torch.float32),
                                                    ("SUM", True, torch.bfloat16)], ids=["sum", "mean-weighted", "bf16"])
def test_lean_rows_give_the_same_bits(pooling, weighted, dtype):
    """FLAT 4 (``forward_warp._lean_rows``: a bag a program, rows before a round's last group
    of UNROLL loaded without a row mask, the last group masked by a 32-bit count): the bits of
    FLAT 3 and of the lockstep kernel's one id a step, for bags of 0-70 ids (lengths that end
    anywhere in a group, bags over two rounds of 32), tables of D 5-36 in 64-column blocks
    (column masks), every D equal to the block (direct: FULL, loads with no mask at all),
    int32 ids and offsets; bf16 rows too (no heuristic takes FLAT 4 for them yet)."""
    emb = build(dtype, pooling=pooling)
    indices, offsets = make_bags(rows_of(emb), B=5, max_len=70, seed=41, hot_fraction=0.3)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(41)) if weighted else None
    for unroll, block_d, direct in [(8, 64, False), (4, 16, False), (8, 64, True)]:
        out = run(emb, indices, offsets, psw, (1, unroll, block_d, 1, 1, 0, 4), direct=direct)
        assert torch.equal(out, run(emb, indices, offsets, psw, (1, unroll, block_d, 1, 1, 0, 3), direct=direct))
        assert torch.equal(out, run(emb, indices, offsets, psw, (1, 1, block_d, 1, 1, 0))), (unroll, block_d)
    assert torch.equal(run(emb, indices.int(), offsets.int(), psw, (1, 8, 64, 1, 1, 0, 4)), out)
    full = build(dtype, pooling=pooling, specs=[(23, 16), (9, 16)], feature_table_map=[0, 1, 0])
    indices, offsets = make_bags(rows_of(full), B=3, max_len=40, seed=42, hot_fraction=0.3)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(42)) if weighted else None
    out = run(full, indices, offsets, psw, (1, 4, 16, 1, 1, 0, 4), direct=True)  # FULL
    assert torch.equal(out, run(full, indices, offsets, psw, (1, 1, 16, 1, 1, 0)))
    assert_tbe_close(out, reference(full, indices, offsets, psw), 40)


def test_launch_values_no_kernel_reads_raise():
    """Values no kernel reads raise instead of being ignored: an eighth value, PREFETCH on the
    warp kernel; FLAT 4 takes one bag a program."""
    emb = build(pooling="MEAN")
    indices, offsets = make_bags(rows_of(emb), B=3, max_len=8, seed=7)
    for config in [(16, 2, 64, 1, 1, 1, 0, 4), (1, 8, 64, 1, 1, 0, 3, 2), (1, 8, 64, 1, 1, 1, 3), (1, 8, 64, 1, 1, 1, 4),
                   (2, 8, 64, 2, 1, 0, 4)]:  # fmt: skip
        with pytest.raises(ValueError, match="at most seven values, the warp kernel \\(FLAT 3 and 4\\) takes no "
                                             "PREFETCH .*and FLAT 4 one bag a program"):
            run(emb, indices, offsets, None, config)


def test_bad_ids_and_offsets_are_counted_as_the_lockstep_kernel_counts_them():
    """WARNING mode: an id past its table reads row 0 and a decreasing offset is repaired, as
    in the lockstep kernel (same sums, both counted)."""
    emb = build(bounds_check_mode="WARNING")
    indices, offsets = make_bags(rows_of(emb), B=4, max_len=6, seed=2)
    indices[3] = 10_000
    offsets[6] = offsets[5] - 1
    initial = emb.bounds_check_status.clone()
    lockstep = run(emb, indices, offsets, None, (4, 1, 64, 1, 1, 0))
    expected = emb.bounds_check_status.clone()
    assert int(expected.sum()) > 0
    for config in [(4, 4, 64, 4, 1, 0, 3), (1, 4, 64, 1, 1, 0, 3)]:
        emb.bounds_check_status.copy_(initial)
        assert torch.equal(run(emb, indices, offsets, None, config), lockstep), config
        assert torch.equal(emb.bounds_check_status, expected), config  # each id and bag counted once


def test_tables_that_may_hold_2_31_rows_take_the_lockstep_tile():
    """The warp kernel holds ids as int32: weights that could hold a table of 2**31 rows (numel
    // min D) get the lockstep tile; the heuristic's class otherwise, per-sample weights and
    bf16 rows included (expanded tensors: no memory)."""
    from tbe_plugin.ops.embedding_forward import module_launch_config

    small = torch.zeros(1).expand(2**20 * 128)
    assert module_launch_config(30.0, 128, small, [128, 128])[6:] == (4,)
    huge = torch.zeros(1).expand(2**31 * 128)
    assert module_launch_config(30.0, 128, huge, [128, 128]) == (16, 2, 128, 1, 1, 1)
    assert module_launch_config(30.0, 128, small, [1, 128])[6:] == (4,)  # 2**27 rows at most
    assert module_launch_config(10.0, 128, huge, [128]) == (16, 2, 128, 1, 1, 1)  # lockstep anyway
    assert module_launch_config(10.0, 128, small, [128]) == (16, 2, 128, 1, 1, 1)  # short bags: lockstep
    assert module_launch_config(100.0, 128, small, [128])[6:] == (4,)
    assert module_launch_config(100.0, 128, huge, [128]) == (1, 32, 128, 1, 3, 0)  # long bags' lockstep tile
    half = torch.zeros(1, dtype=torch.float16).expand(2**31 * 128)
    assert module_launch_config(30.0, 128, half, [128]) == (8, 1, 128, 1, 1, 1)  # fp16's own lockstep tile
    bf16 = torch.zeros(1, dtype=torch.bfloat16).expand(2**20 * 128)
    assert module_launch_config(30.0, 128, bf16, [128]) == (1, 8, 128, 1, 1, 0, 4)  # FLAT 4 for bf16 rows
    assert module_launch_config(100.0, 128, bf16, [128]) == (1, 32, 128, 1, 1, 0, 4)
    assert module_launch_config(10.0, 128, bf16, [128]) == (8, 1, 128, 1, 1, 1)  # 16-bit rows' short-bag tile


@pytest.mark.gpu
def test_warp_kernel_on_the_device_matches_the_lockstep_kernel():
    """On CUDA, a production-shaped batch (Poisson bags of means 5-40, Zipf ids): the lockstep
    kernel's one-id-a-step bits (four bags a program at once, or one; FLAT 4's lean rows,
    with and without FULL, with per-sample weights, and on bf16 rows), and the lockstep
    heuristic tile's sums within fp32 rounding."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

    tables = tuple(TableWorkload(rows=100_000, dim=128, mean_pooling=5.0 + 5 * t, alpha=1.1) for t in range(8))
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables], device="cuda")
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets, _ = generate_batch(Workload("warp", tables, batch_size=16384), seed=3, device="cuda")
    with torch.no_grad():
        out = run(emb, indices, offsets, None, (4, 8, 128, 4, 1, 0, 3))
        assert torch.equal(out, run(emb, indices, offsets, None, (16, 1, 128, 1, 1, 0)))
        assert torch.equal(out, run(emb, indices, offsets, None, (1, 8, 128, 1, 1, 0, 3)))
        assert torch.equal(out, run(emb, indices, offsets, None, (1, 8, 128, 1, 1, 0, 4), direct=True))  # lean, FULL
        assert torch.equal(out, run(emb, indices, offsets, None, (1, 32, 128, 1, 1, 0, 4)))  # lean
        torch.testing.assert_close(out, run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1)), rtol=1e-5,
                                   atol=1e-4)  # fmt: skip
        psw = torch.rand(indices.numel(), device="cuda")  # per-sample weights: FLAT 4 against one id a step
        weighted = run(emb, indices, offsets, psw, (16, 1, 128, 1, 1, 0))
        assert torch.equal(weighted, run(emb, indices, offsets, psw, (1, 8, 128, 1, 1, 0, 4), direct=True))
        assert torch.equal(weighted, run(emb, indices, offsets, psw, (1, 8, 128, 1, 1, 0, 4)))
    bf16 = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables], weights_precision="BF16", device="cuda")
    bf16.init_embedding_weights_uniform(-1, 1)
    with torch.no_grad():  # bf16 rows (no heuristic takes FLAT 4 for them yet): one id a step's bits
        out = run(bf16, indices, offsets, None, (16, 1, 128, 1, 1, 0))
        assert torch.equal(out, run(bf16, indices, offsets, None, (1, 8, 128, 1, 1, 0, 4), direct=True))
