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
    for r in results:
        assert r["plain~pipe0"] == (0.0, 0.0), r
        assert r["ref0~pipe0"] == (0.0, 0.0), r


def test_staleness_matches_the_reference_loop(results):
    for r in results:
        assert r["ref1~pipe1"] == (0.0, 0.0), r
        assert r["ref2~pipe2"] == (0.0, 0.0), r


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
    with pytest.raises(NotImplementedError, match="dense_grad_lag"):
        StalenessTrainPipeline(None, None, "cpu", dense_grad_lag=True)
    with pytest.raises(NotImplementedError, match="tbe_max_sms"):
        StalenessTrainPipeline(None, None, "cpu", tbe_max_sms=32)
