"""backend=triton against backend=fbgemm through TorchRec's sharding, on 2 CPU ranks (gloo)."""

import pytest

from tests.torchrec import workers
from tests.torchrec.distributed import run_distributed


@pytest.fixture(scope="module")
def parity():
    return run_distributed(workers.parity_worker, 2)


@pytest.mark.parametrize("sharding_type", workers.SHARDING_TYPES)
def test_triton_matches_fbgemm_fused(parity, sharding_type):
    for rank, results in enumerate(parity):
        r = results[sharding_type]
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
        assert "TritonFusedEmbeddingBag" in r["kernels"], r["kernels"]
        assert "BatchedFusedEmbeddingBag" not in r["kernels"], r["kernels"]
        assert r["trained"] > 1e-3, "the three steps did not change the outputs"
        assert r["unsharded"] < 1e-5, r
        for what in ("output", "loss", "weights", "states"):
            assert r[what] < 1e-5, (what, r)
        assert r["state_keys"], r
