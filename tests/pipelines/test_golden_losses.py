"""Golden losses: a fixed-seed CPU run of the training app per backend must reproduce the
per-step training losses checked in beside this file (``golden_losses.json``) within its
stated tolerance. Every other training test compares a backend with a backend or a run
with a run; this one catches a change that moves both.

The golden file changes only deliberately, with a note saying why:

    python -m tests.pipelines.test_golden_losses --why "the planted click log's bags are Poisson now"

reruns both backends, writes the file (losses, the overrides, commit, versions) and keeps
the notes of earlier versions.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden_losses.json")
BACKENDS = ("fbgemm", "triton")
# One process, the default tables and model (conf/), 12 steps of 16 examples of the planted
# click log: small, because Triton's interpreter pays per program and both backends together
# should stay within about a minute of the suite.
STEPS = 12
OVERRIDES = [f"steps={STEPS}", "data.batch_size=16", "eval_batches=0", "checkpoint=none", "logging.progress_bar=false",
             "logging.every_steps=4"]  # fmt: skip
# Absolute, per step. Run to run on one machine the losses are bitwise equal; the two
# backends' differed by at most one float32 ulp (1.2e-7) when the file was written (our
# forward adds a bag's rows in another order than FBGEMM's); another CPU's BLAS may sum in
# another order (1e-7 per op, growing over the steps). A 1% change of the sparse learning rate moves the curve by
# more than this (the file's "sensitivity"), a wrong update formula by far more.
TOLERANCE = 1e-4


def _start(backend: str, workdir: Path, extra: List[str]) -> subprocess.Popen:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    env.pop("RANK", None)  # one local process
    command = [sys.executable, "-m", "pipelines.app.train", f"backend={backend}",
               f"logging.metrics_file={workdir / 'metrics.jsonl'}", *OVERRIDES, *extra]  # fmt: skip
    return subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_losses(workdir: Path, extra: List[str] = ()) -> Dict[str, List[float]]:
    """Per backend the per-step training losses of the app with ``extra`` overrides (the
    two backends run at once: 2 cores)."""
    jobs = {}
    for backend in BACKENDS:
        (workdir / backend).mkdir(parents=True, exist_ok=True)
        jobs[backend] = _start(backend, workdir / backend, list(extra))
    losses = {}
    for backend, job in jobs.items():
        output, _ = job.communicate(timeout=600)
        assert job.returncode == 0, output[-3000:]
        records = [json.loads(line) for line in (workdir / backend / "metrics.jsonl").read_text().splitlines()]
        steps = sorted((r for r in records if r["kind"] == "step"), key=lambda r: r["step"])
        losses[backend] = [r["loss"] for r in steps]
    return losses


@pytest.fixture(scope="module")
def golden() -> Dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def losses(tmp_path_factory) -> Dict[str, List[float]]:
    return run_losses(tmp_path_factory.mktemp("golden"))


def test_golden_file_describes_this_run(golden):
    assert golden["overrides"] == OVERRIDES, "the test's run changed: regenerate the golden file (module docstring)"
    assert golden["tolerance"] == TOLERANCE
    assert golden["note"], "every golden file says why it changed"
    assert golden["sensitivity"]["max_abs"] > TOLERANCE, golden["sensitivity"]  # the tolerance can see a change


@pytest.mark.parametrize("backend", BACKENDS)
def test_losses_match_the_golden_curve(golden, losses, backend):
    expected, got = golden["losses"][backend], losses[backend]
    assert len(got) == len(expected) == STEPS
    off = [(step + 1, e, g) for step, (e, g) in enumerate(zip(expected, got)) if abs(e - g) > TOLERANCE]
    assert not off, f"{backend}: steps (step, golden, now) beyond {TOLERANCE}: {off}"


def main() -> None:
    parser = argparse.ArgumentParser(description="Regenerate golden_losses.json")
    parser.add_argument("--why", required=True, help="why the golden curve changes (kept in the file)")
    args = parser.parse_args()
    from tbe_plugin.benchmarks.report import git_state

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        losses = run_losses(Path(tmp) / "golden")
        # 1% more sparse learning rate: how far a small real change moves the curve.
        nudged = run_losses(Path(tmp) / "nudged", ["optimizer.sparse_lr=0.0101"])
    sensitivity = max(abs(a - b) for backend in BACKENDS for a, b in zip(losses[backend], nudged[backend]))
    history = json.loads(GOLDEN.read_text())["history"] if GOLDEN.exists() else []
    state = git_state()
    entry = {"note": args.why, "commit": state["git_commit"], "dirty": state["git_dirty"]}
    golden = {"note": args.why, "history": [*history, entry], "overrides": OVERRIDES, "tolerance": TOLERANCE,
              "sensitivity": {"change": "optimizer.sparse_lr=0.0101", "max_abs": sensitivity},
              "versions": {"torch": torch.__version__, "python": sys.version.split()[0]}, "losses": losses}  # fmt: skip
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN}: sensitivity {sensitivity:.2e}, tolerance {TOLERANCE}")


if __name__ == "__main__":
    main()
