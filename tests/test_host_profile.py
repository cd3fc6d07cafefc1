"""``benchmarks.host_profile``: it refuses to run without CUDA (it measures a device step's host
path), and its ``--step`` measurement runs a training step (forward with its plan, then backward)
under a candidate launch and reports its host and wall time and a cProfile of it (here on the
CPU, with the device synchronization a no-op)."""

import pytest
import torch

from tbe_plugin.benchmarks import host_profile
from tbe_plugin.workloads import TableWorkload, Workload

TINY = Workload("tiny", tuple(TableWorkload(rows=500, dim=16, mean_pooling=4, pooling="poisson", alpha=1.1)
                              for _ in range(3)), batch_size=8)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_it_needs_cuda(tmp_path):
    with pytest.raises(SystemExit, match="needs CUDA"):
        host_profile.main(["--out", str(tmp_path), "--step"])


@pytest.mark.parametrize("candidate", ["default", "no_thread"])
def test_a_step_is_measured_and_trains(monkeypatch, candidate):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    built = []
    original = host_profile.build_step

    def keep(*args):
        built.append(original(*args))
        return built[-1]

    monkeypatch.setattr(host_profile, "build_step", keep)
    result = host_profile.profile_step(TINY, 2, torch.device("cpu"), 5, candidate)
    assert result["candidate"] == candidate and result["calls"] == 2 and result["lookups"] > 0
    assert result["step_host_ms"] > 0 and result["step_wall_ms"] > 0
    assert "function calls" in result["cprofile_own"]  # the profile of the timed steps
    module = built[0]
    assert module.backward_launch is None if candidate == "default" else not module.backward_launch.plan_thread
    assert int(module.rounding_seed) == 5 + 2 * 2 + 2  # warm-up, timed (wall and host) and profiled steps
