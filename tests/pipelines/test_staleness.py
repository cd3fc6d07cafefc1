"""The staleness pipeline on CPU ranks (gloo): k = 0 is a plain loop, k >= 1 the reference
loop whose lookups see tables k updates old; iterators short, spent, renewed or failing."""

import pytest

from tests.pipelines import workers
from tests.torchrec.distributed import run_distributed

CASES = [(1, "table_wise"), (2, "row_wise")]
BACKENDS = ["triton", "fbgemm"]


@pytest.fixture(scope="module", params=[(ws, st, b) for ws, st in CASES for b in BACKENDS],
                ids=lambda p: f"ws{p[0]}-{p[1]}-{p[2]}")  # fmt: skip
def results(request):
    world_size, sharding_type, backend = request.param
    return run_distributed(workers.staleness_worker, world_size, backend, sharding_type)


def test_staleness_zero_is_the_plain_loop(results):
    """... and TorchRec's TrainPipelineSparseDist, bit for bit."""
    for r in results:
        assert r["plain~pipe0"] == (0.0, 0.0), r
        assert r["ref0~pipe0"] == (0.0, 0.0), r
        assert r["sparsedist~pipe0"] == (0.0, 0.0), r


def test_staleness_matches_the_reference_loop(results):
    for r in results:
        assert r["ref1~pipe1"] == (0.0, 0.0), r
        assert r["ref2~pipe2"] == (0.0, 0.0), r


def test_dense_gradient_lag_matches_the_reference(results):
    """TorchRec's stash_gradients semantics: the dense step applies the previous batch's
    gradients (and the last ones when the data ends)."""
    for r in results:
        assert r["ref1lag~pipe1lag"] == (0.0, 0.0), r
    assert max(r["pipe1~pipe1lag"][1] for r in results) > 1e-4, results


GPU_TOL = 1e-6  # the same kernels on other streams: expected equal; a race shows as far more


@pytest.fixture(scope="module", params=[(ws, st, b) for ws, st in CASES for b in BACKENDS],
                ids=lambda p: f"ws{p[0]}-{p[1]}-{p[2]}")  # fmt: skip
def gpu_results(request):
    import torch

    world_size, sharding_type, backend = request.param
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, this machine has {torch.cuda.device_count()}")
    return run_distributed(
        workers.staleness_worker, world_size, backend, sharding_type, "cuda", False, backend="nccl"
    )  # fmt: skip


@pytest.mark.gpu
def test_on_cuda_the_streams_keep_the_semantics(gpu_results):
    """On CUDA (data, sparse and current streams; nccl): k = 0 equals the plain loop and
    SparseDist, k = 1, 2 and the lag equal their references."""
    for r in gpu_results:
        print({k: v for k, v in r.items()})
        for pair in ("plain~pipe0", "ref0~pipe0", "sparsedist~pipe0", "ref1~pipe1", "ref2~pipe2", "ref1lag~pipe1lag"):
            assert max(r[pair]) <= GPU_TOL, (pair, r[pair])
    assert max(r["pipe0~pipe1"][1] for r in gpu_results) > 1e-4, gpu_results


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_on_cuda_an_sm_cap_keeps_the_semantics(backend):
    """``tbe_max_sms``: the sparse stream in a green context of 16 SMs, k = 1, against the
    reference (Triton's kernels and FBGEMM's must both run there)."""
    (r,) = run_distributed(workers.capped_worker, 1, backend, 16, backend="nccl")
    assert "error" not in r, r
    assert r["outputs"] <= GPU_TOL and r["state"] <= GPU_TOL, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_collection_model(backend):
    """An EmbeddingCollection (unpooled lookups, JaggedTensor outputs) through the pipeline,
    2 ranks row-wise: k = 0, 1, 2 equal their references, and training moved the tables."""
    for r in run_distributed(workers.ec_staleness_worker, 2, backend):
        for k in (0, 1, 2):
            assert r[k] == (0.0, 0.0), (k, r)
            assert r[f"moved{k}"] > 1e-4, r


def test_staleness_changes_results(results):
    """Not vacuous: lookups one update old train differently."""
    assert max(r["pipe0~pipe1"][1] for r in results) > 1e-4, results


def test_short_iterators(results):
    for r in results:
        for n in (0, 1, 2):
            count, diff = r[f"short{n}"]
            assert count == n and diff == 0.0, (n, r[f"short{n}"])


def test_exhaustion_and_a_new_iterator(results):
    for r in results:
        first, again, second, out_diff, state_diff = r["epochs"]
        assert (first, again, second) == (3, 0, 3), r["epochs"]
        assert out_diff == 0.0 and state_diff == 0.0, r["epochs"]


def test_raising_loader_leaves_the_model_consistent(results):
    for r in results:
        error, count, out_diff, state_diff = r["raising"]
        assert error == "loader failed" and count == 3, r["raising"]
        assert out_diff == 0.0 and state_diff == 0.0, r["raising"]


def test_bad_settings_are_named():
    from pipelines import StalenessTrainPipeline

    with pytest.raises(ValueError, match="staleness must be an int >= 0"):
        StalenessTrainPipeline(None, None, "cpu", staleness=-1)
    with pytest.raises(ValueError, match="tbe_max_sms=32: SM caps are CUDA green contexts"):
        StalenessTrainPipeline(None, None, "cpu", tbe_max_sms=32)
    with pytest.raises(ValueError, match="tbe_max_sms must be an int >= 1"):
        StalenessTrainPipeline(None, None, "cpu", tbe_max_sms=0)


def test_tables_that_cannot_run_ahead_are_named():
    import types

    from torchrec.distributed.types import ParameterSharding, ShardingPlan

    from pipelines import StalenessTrainPipeline

    plan = {"t0": ParameterSharding(sharding_type="table_wise", compute_kernel="fused", ranks=[0]),
            "t1": ParameterSharding(sharding_type="data_parallel", compute_kernel="dense", ranks=[0])}  # fmt: skip
    model = types.SimpleNamespace(plan=ShardingPlan({"ebc": plan}))
    StalenessTrainPipeline(model, None, "cpu", staleness=0)._check_kernels()  # k = 0: anything goes
    with pytest.raises(ValueError, match="table 't1' .* kernel 'dense'"):
        StalenessTrainPipeline(model, None, "cpu", staleness=1)._check_kernels()


@pytest.mark.parametrize("backend", BACKENDS)
def test_drain_then_checkpoint_resumes_identically(tmp_path, backend):
    """A checkpoint boundary: drain() trains the batch in flight, the saved model and fused
    optimizer restore into a fresh model, and both continue identically."""
    for r in run_distributed(workers.checkpoint_worker, 2, backend, "row_wise", str(tmp_path)):
        assert r["counts"] == (2, 1, 3, 3), r
        assert r["outputs"] == 0.0 and r["state"] == 0.0, r
        assert r["moved"] > 1e-4, r


def test_eval_needs_a_drain_and_detach_restores_the_model():
    for r in run_distributed(workers.detach_worker, 2, "triton"):
        assert r["eval_error"] and "drain() or detach()" in r["eval_error"], r
        assert r["detached"] == 0.0, r
        assert r["after"] == 2 and r["state"] == 0.0, r


def test_schedule_order():
    """The host-side order the stream design relies on (k = 1): per step, finish the batch
    about to be looked up (its input all-to-all), start the next one (copy, splits), look
    up, train the oldest; a loader error waits for the step under way."""
    from pipelines import StalenessTrainPipeline
    from pipelines.staleness import _Staged

    events = []

    class Recorded(StalenessTrainPipeline):
        def _check_training(self):
            pass

        def _start(self, raw):
            events.append(f"start {raw}")
            return _Staged(raw, raw, None)

        def _finish_input_dist(self, staged):
            events.append(f"finish {staged.raw}")

        def _look_up(self, staged):
            events.append(f"lookup {staged.raw}")
            self._in_flight.append(staged)

        def _train_oldest(self):
            staged = self._in_flight.popleft()
            events.append(f"train {staged.raw}")
            return staged.raw

    def loader():
        yield from range(4)
        raise RuntimeError("loader failed")

    pipeline, iterator = Recorded(None, None, "cpu", staleness=1), loader()
    assert [pipeline.progress(iterator) for _ in range(3)] == [0, 1, 2]
    assert events == [
        "start 0", "finish 0", "start 1", "lookup 0", "finish 1", "start 2", "lookup 1", "train 0",
        "finish 2", "start 3", "lookup 2", "train 1",
        "finish 3", "lookup 3", "train 2",  # the loader raised when asked for a 5th batch
    ]
    with pytest.raises(RuntimeError, match="loader failed"):
        pipeline.progress(iterator)
    assert pipeline.drain() == [3]
