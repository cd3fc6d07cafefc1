"""The hot-row product probe computes what it claims: each table's hottest rows' summed
output-gradient rows, as the per-lookup gather would (CPU, a tiny skewed batch)."""

import torch

from tbe_plugin.benchmarks import probe_hot_dense
from tbe_plugin.workloads import generate_batch


def test_hot_products_equal_the_gathered_sums(tmp_path):
    workload = probe_hot_dense.SMOKE
    T, B, D = workload.num_tables, workload.batch_size, workload.tables[0].dim
    indices, offsets, _ = generate_batch(workload, 0, "cpu")
    grad = torch.randn(B, T * D, dtype=torch.float64).float()
    hot_rows, counts, where = probe_hot_dense.hot_counts(workload, indices, offsets, 16)
    got = probe_hot_dense.hot_products(counts, grad)
    want = torch.zeros(T, 16, D)
    hot_lookups = 0
    for t in range(T):
        for bag in range(B):
            start, end = int(offsets[t * B + bag]), int(offsets[t * B + bag + 1])
            for row in indices[start:end].tolist():
                slot = (hot_rows[t] == row).nonzero()
                if slot.numel():
                    want[t, int(slot)] += grad[bag, t * D : (t + 1) * D]
                    hot_lookups += 1
    assert hot_lookups == where[0].numel() > 0
    assert (hot_rows >= 0).all()  # every table of the smoke batch has 16 distinct rows or more
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The hottest rows take more than a fair share: 4 and 16 of each table's ~100 distinct rows.
    report = probe_hot_dense.main(["--smoke", "--out", str(tmp_path), "--top", "4,16"])
    shares = [e["share"] for e in report["entries"]]
    assert 0.2 < shares[0] < shares[1] < 1.0
    assert (tmp_path / "probe_hot_dense.json").exists()
    # ops.hot_product ran on the 16-row slots and agreed with the fp64 product (no error entry;
    # on the CPU its times are not kept).
    assert report["entries"][1]["product_triton_ms"] == {}
