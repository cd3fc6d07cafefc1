"""backend=triton against backend=fbgemm through TorchRec's sharding: 2 CPU ranks (gloo),
and world size 1 on the GPU (nccl)."""

import pytest

from tests.torchrec import workers
from tests.torchrec.distributed import run_distributed

TOL = 1e-5
GPU_SHARDING_TYPES = ["table_wise", "column_wise", "row_wise"]


def assert_parity(per_rank, key, kernel, compared):
    """Every rank ran ``key`` without error on our ``kernel``, training moved the outputs,
    step 0 equals the unsharded collection, and ``compared`` differ from FBGEMM's by < TOL."""
    for rank, results in enumerate(per_rank):
        r = results[key]
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
        assert kernel in r["kernels"], r["kernels"]
        assert not any(k.startswith("Batched") for k in r["kernels"]), r["kernels"]  # no FBGEMM kernel
        assert r["trained"] > 1e-3, "the steps did not change the outputs"
        assert r["unsharded"] < TOL, r
        for what in compared:
            assert r[what] < TOL, (what, r)


@pytest.fixture(scope="module")
def parity():
    return run_distributed(workers.parity_worker, 2)


@pytest.mark.parametrize("sharding_type", workers.SHARDING_TYPES)
def test_triton_matches_fbgemm_fused(parity, sharding_type):
    """EmbeddingBagCollection: outputs, losses, weights and optimizer states over 3 steps
    (the learning rate halved through param_groups before the last)."""
    assert_parity(parity, sharding_type, "TritonFusedEmbeddingBag", ("output", "loss", "weights", "states"))
    assert all(results[sharding_type]["state_keys"] for results in parity)


@pytest.fixture(scope="module")
def unpooled_parity():
    return run_distributed(workers.unpooled_parity_worker, 2)


@pytest.mark.parametrize("sharding_type", workers.UNPOOLED_SHARDING_TYPES)
def test_embedding_collection_matches_fbgemm_fused(unpooled_parity, sharding_type):
    """EmbeddingCollection (one embedding per id) through our unpooled kernel."""
    assert_parity(unpooled_parity, sharding_type, "TritonFusedEmbedding", ("output", "weights", "states"))


@pytest.fixture(scope="module")
def gpu_parity():
    return run_distributed(workers.parity_worker, 1, "cuda", GPU_SHARDING_TYPES, backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("sharding_type", GPU_SHARDING_TYPES)
def test_triton_matches_fbgemm_fused_on_cuda(gpu_parity, sharding_type):
    """World size 1 on the GPU (the device has one): DMP with our kernel against FUSED."""
    assert_parity(gpu_parity, sharding_type, "TritonFusedEmbeddingBag", ("output", "loss", "weights", "states"))


def _all_gpus() -> int:
    """The GPU count when there are 2 or more (the multi-GPU tests), else skip."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"needs 2 or more GPUs, this machine has {count}")
    return count


@pytest.fixture(scope="module")
def multi_gpu_parity():
    return run_distributed(workers.parity_worker, _all_gpus(), "cuda", workers.SHARDING_TYPES, backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("sharding_type", workers.SHARDING_TYPES)
def test_triton_matches_fbgemm_fused_across_gpus(multi_gpu_parity, sharding_type):
    """Every sharding type across all the machine's GPUs (nccl): outputs, losses, weights
    and optimizer states over 3 steps, against FUSED."""
    assert_parity(multi_gpu_parity, sharding_type, "TritonFusedEmbeddingBag", ("output", "loss", "weights", "states"))


@pytest.fixture(scope="module")
def multi_gpu_unpooled_parity():
    return run_distributed(workers.unpooled_parity_worker, _all_gpus(), "cuda", backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("sharding_type", workers.UNPOOLED_SHARDING_TYPES)
def test_embedding_collection_matches_fbgemm_fused_across_gpus(multi_gpu_unpooled_parity, sharding_type):
    assert_parity(multi_gpu_unpooled_parity, sharding_type, "TritonFusedEmbedding", ("output", "weights", "states"))


@pytest.fixture(scope="module")
def gpu_unpooled_parity():
    return run_distributed(workers.unpooled_parity_worker, 1, "cuda", backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("sharding_type", workers.UNPOOLED_SHARDING_TYPES)
def test_embedding_collection_matches_fbgemm_fused_on_cuda(gpu_unpooled_parity, sharding_type):
    assert_parity(gpu_unpooled_parity, sharding_type, "TritonFusedEmbedding", ("output", "weights", "states"))


@pytest.fixture(scope="module")
def multi_gpu_checkpoints(tmp_path_factory):
    return run_distributed(workers.checkpoint_worker, _all_gpus(), str(tmp_path_factory.mktemp("dcp_gpu")), "cuda",
                           backend="nccl")  # fmt: skip


@pytest.mark.gpu
def test_checkpoint_crosses_backends_across_gpus(multi_gpu_checkpoints):
    for rank, results in enumerate(multi_gpu_checkpoints):
        for case, r in results.items():
            assert "error" not in r, f"rank {rank} {case}:\n{r.get('error')}"
            for what in ("output", "weights", "states"):
                assert r[what] < TOL, (case, what, r)


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
            assert r[what] < TOL, (what, r)
        assert r["lr"][0] == r["lr"][1], r
