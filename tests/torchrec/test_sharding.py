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


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return run_distributed(workers.checkpoint_worker, 2, str(tmp_path_factory.mktemp("dcp")))


@pytest.mark.parametrize("case", ["row_wise:fbgemm->triton", "row_wise:triton->fbgemm",
                                  "column_wise:fbgemm->triton", "column_wise:triton->fbgemm"])  # fmt: skip
def test_checkpoint_crosses_backends(checkpoints, case):
    """A checkpoint written with one backend (torch.distributed.checkpoint, model and
    fused optimizer) loads into the other, and training continues identically."""
    for rank, results in enumerate(checkpoints):
        r = results[case]
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
        for what in ("output", "weights", "states"):
            assert r[what] < 1e-5, (what, r)
        assert r["lr"][0] == r["lr"][1], r


GPU_SHARDING_TYPES = ["table_wise", "column_wise", "row_wise"]


@pytest.fixture(scope="module")
def gpu_parity():
    return run_distributed(workers.parity_worker, 1, "cuda", GPU_SHARDING_TYPES, backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("sharding_type", GPU_SHARDING_TYPES)
def test_triton_matches_fbgemm_fused_on_cuda(gpu_parity, sharding_type):
    """World size 1 on the GPU (the device has one): DMP with our kernel against FUSED."""
    r = gpu_parity[0][sharding_type]
    assert "error" not in r, r.get("error")
    assert "TritonFusedEmbeddingBag" in r["kernels"], r["kernels"]
    assert r["trained"] > 1e-3
    assert r["unsharded"] < 1e-5, r
    for what in ("output", "loss", "weights", "states"):
        assert r[what] < 1e-5, (what, r)


@pytest.fixture(scope="module")
def unpooled_parity():
    return run_distributed(workers.unpooled_parity_worker, 2)


@pytest.mark.parametrize("sharding_type", workers.UNPOOLED_SHARDING_TYPES)
def test_embedding_collection_matches_fbgemm_fused(unpooled_parity, sharding_type):
    """EmbeddingCollection (one embedding per id) through our unpooled kernel."""
    for rank, results in enumerate(unpooled_parity):
        r = results[sharding_type]
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
        assert "TritonFusedEmbedding" in r["kernels"], r["kernels"]
        assert r["trained"] > 1e-3
        assert r["unsharded"] < 1e-5, r
        for what in ("output", "weights", "states"):
            assert r[what] < 1e-5, (what, r)
