"""The A/B command on CPU: four tiny runs (A B B A) of the app, one process each, and a
report with every part a user reads: the header's provenance, throughput per run and per
backend with the noise sentence, measured phase times of both backends, quality against the
planted optimum, loss divergence, PNG plots. Plus the run order and the noise sentence alone."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ab_module():
    spec = importlib.util.spec_from_file_location("ab_script", ROOT / "scripts" / "ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_interleave_and_each_backend_runs_twice():
    ab = _ab_module()
    assert ab.run_order(2) == ["fbgemm", "triton", "triton", "fbgemm"]
    assert ab.run_order(3) == ["fbgemm", "triton", "triton", "fbgemm", "fbgemm", "triton"]
    with pytest.raises(ValueError, match="repeats"):
        ab.run_order(1)


def test_noise_sentence_tells_a_difference_inside_the_noise_from_one_outside():
    ab = _ab_module()

    def comparison(fbgemm, triton):
        runs = [{"backend": b, "throughput": {"examples_per_s": x}} for b, xs in (("fbgemm", fbgemm), ("triton", triton))
                for x in xs]  # fmt: skip
        return ab.compare_backends(runs)

    inside = comparison([100.0, 110.0], [108.0, 110.0])  # medians 3.8% apart, fbgemm's runs 9.5%
    assert inside["inside_noise"] and "inside the run-to-run noise" in ab.noise_sentence(inside)
    outside = comparison([100.0, 101.0], [80.0, 81.0])
    assert not outside["inside_noise"]
    assert ab.noise_sentence(outside).startswith("fbgemm is faster: triton reaches 0.801x its throughput (19.9% less), outside the run-to-run noise")


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_ab_report_on_cpu(tmp_path):
    out = tmp_path / "report"
    command = [sys.executable, str(ROOT / "scripts" / "ab.py"), "--out", str(out), "--nproc", "1", "--skip", "1",
               "--profile-steps", "1", "--", "steps=4", "eval_batches=1", "eval_every_steps=2",
               "data.batch_size=16"]  # fmt: skip
    before = _git("rev-parse", "HEAD").stdout.strip()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    check_report(out, before)


def check_report(out, before):
    """Every part of the report of ``run_order(2)``'s four 4-step runs in ``out``; its commit
    is ``before`` or a later one (a shared checkout may gain commits during the runs)."""
    text = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    commit = summary["provenance"]["commit"]
    assert _git("merge-base", "--is-ancestor", before, commit).returncode == 0, (before, commit)
    assert summary["provenance"]["dirty"] in (True, False)
    for line in (f"- commit: {commit} (tree ", "- device: ", "torch ", "fbgemm_gpu ", "torchrec ",
                 "- command: `python", "scripts/ab.py --out"):  # fmt: skip
        assert line in text, line
    for section in ("## Throughput", "## Time per phase", "## Quality against the optimum",
                    "## Training-loss divergence"):  # fmt: skip
        assert section in text, section
    assert summary["order"] == ["run1_fbgemm", "run2_triton", "run3_triton", "run4_fbgemm"]
    assert summary["noise_sentence"] in text
    assert all(summary["comparison"]["backends"][b]["runs"] == 2 for b in ("fbgemm", "triton"))
    for run in summary["runs"]:
        assert run["throughput"]["steps_timed"] == 3, run  # 4 steps less the warm-up one
        final = run["final"]
        assert 0.5 < final["optimal_auc"] <= 1 and final["optimal_log_loss"] > 0, final
        assert final["excess_log_loss"] == pytest.approx(final["log_loss"] - final["optimal_log_loss"])
    assert "| phase | fbgemm | triton |" in text
    for backend in ("fbgemm", "triton"):
        phases = summary["phases"][backend]
        assert phases["runs"] == 2 and phases["timing"] == "host CPU (ops' own time)", phases
        assert phases["tbe_forward"] > 0 and phases["tbe_backward"] > 0, phases
        assert phases["total_ms"] == pytest.approx(sum(phases[p] for p in ("tbe_forward", "tbe_backward",
                                                                           "all_to_all", "dense_and_other")))
    divergence = summary["divergence"]
    assert divergence["fbgemm vs triton"]["steps"] == 4
    assert divergence["fbgemm vs triton"]["max_abs"] < 1e-4, divergence
    assert divergence["triton run to run"]["max_abs"] == 0.0, divergence  # fixed seed: runs repeat exactly
    for image in ("loss.png", "step_time.png", "eval.png"):
        assert f"]({image})" in text
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    records = [json.loads(line) for line in (out / "run1_fbgemm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]  # every 2 steps and at the end
