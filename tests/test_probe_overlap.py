"""The overlap probe's arithmetic and its dense step, on the CPU (the timing needs CUDA)."""

import pytest
import torch

from tbe_plugin.benchmarks.probe_overlap import DenseStep, hidden_share, main


def test_hidden_share_reads_the_overlap():
    assert hidden_share(2.0, 10.0, 12.0) == 0.0  # serial: nothing hidden
    assert hidden_share(2.0, 10.0, 10.0) == 1.0  # entirely beside the dense step
    assert hidden_share(2.0, 10.0, 11.5) == pytest.approx(0.25)
    assert hidden_share(2.0, 10.0, 12.7) == 0.0  # slower together: clamped
    with pytest.raises(ValueError, match="alone_ms"):
        hidden_share(0.0, 10.0, 10.0)


def test_dense_step_is_the_interaction_and_over_arch():
    step = DenseStep(batch_size=8, features=3, dim=4, device=torch.device("cpu"))
    assert step.mlp[0].in_features == 4 + 3 * 4 // 2  # dense row + the pairs above the diagonal
    step()
    assert step.rows.grad is not None and step.rows.grad.abs().sum() > 0
    assert all(p.grad is not None for p in step.mlp.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_probe_refuses_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="needs CUDA"):
        main(["--out", str(tmp_path)])
