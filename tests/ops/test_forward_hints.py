"""The lockstep pooled forward's L2 hints (EVICT, a launch config's eighth value) and grid
order (ORDER, its ninth): the same bits as the default launch (CPU interpreter, small shapes;
the hints change where lines stay in L2, the order which program runs when, never a sum)."""

import pytest
import torch

from tests.helpers import make_bags
from tests.ops.test_embedding_forward import build, rows_of
from tests.ops.test_forward_flat import run


@pytest.mark.parametrize("pooling, weighted", [("SUM", False), ("MEAN", True)])
def test_hints_and_order_leave_the_sums_bitwise_equal(pooling, weighted):
    emb = build(pooling=pooling)
    indices, offsets = make_bags(rows_of(emb), B=7, max_len=9, seed=5, hot_fraction=0.3)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(5)) if weighted else None
    for base in [(4, 2, 16, 1, 1, 1), (4, 1, 64, 1, 1, 0)]:
        plain = run(emb, indices, offsets, psw, base)
        for evict, order in [(1, 0), (2, 0), (0, 1), (2, 1)]:
            out = run(emb, indices, offsets, psw, (*base, 0, evict, order))
            assert torch.equal(out, plain), (base, evict, order)


def test_bad_hint_values_raise_naming_them():
    emb = build()
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=3, seed=1)
    with pytest.raises(ValueError, match="eighth value \\(EVICT\\) must be one of \\(0, 1, 2\\), got 3"):
        run(emb, indices, offsets, None, (4, 2, 16, 1, 1, 1, 0, 3))
    with pytest.raises(ValueError, match="ninth value \\(ORDER\\) must be one of \\(0, 1\\), got 2"):
        run(emb, indices, offsets, None, (4, 2, 16, 1, 1, 1, 0, 0, 2))
    with pytest.raises(ValueError, match="EVICT and ORDER apply to the lockstep kernel"):
        run(emb, indices, offsets, None, (4, 2, 16, 1, 1, 1, 1, 1, 0))


def test_order_refuses_more_bag_blocks_than_grid_axis_one_holds():
    emb = build()
    B = 65536  # one bag a program: 65536 blocks on axis 1, one past its limit
    offsets = torch.zeros(len(emb.feature_dims) * B + 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="65536 bag blocks on grid axis 1, whose limit is 65535"):
        run(emb, torch.zeros(0, dtype=torch.int64), offsets, None, (1, 1, 16, 1, 1, 0, 0, 0, 1), batch=B)


@pytest.mark.gpu
def test_hints_and_order_on_the_device_give_the_default_bits():
    """On CUDA, a production-shaped batch (Poisson bags of means 5-40, Zipf ids): every hint
    and order variant of the ctr tile gives the default launch's bits."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

    tables = tuple(TableWorkload(rows=100_000, dim=128, mean_pooling=5.0 + 5 * t, alpha=1.1) for t in range(8))
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables], device="cuda")
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets, _ = generate_batch(Workload("hints", tables, batch_size=16384), seed=3, device="cuda")
    with torch.no_grad():
        plain = run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1))
        for evict, order in [(1, 0), (2, 0), (0, 1), (2, 1)]:
            assert torch.equal(run(emb, indices, offsets, None, (16, 2, 128, 1, 1, 1, 0, evict, order)), plain)
