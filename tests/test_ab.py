"""The A/B command on CPU: both backends train the tiny default, the report holds its
tables and PNG plots, and the two loss curves agree."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ab_report_on_cpu(tmp_path):
    out = tmp_path / "report"
    command = [sys.executable, str(ROOT / "scripts" / "ab.py"), "--out", str(out), "--skip", "3",
               "--profile-steps", "2", "--", "steps=8", "eval_batches=2", "eval_every_steps=4",
               "data.batch_size=32"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    text = (out / "report.md").read_text()
    for section in ("## Throughput", "## Time per phase (profiler)", "## Quality", "Largest training-loss divergence"):
        assert section in text, section
    for image in ("loss.png", "step_time.png", "eval.png"):
        assert f"]({image})" in text
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    summary = json.loads((out / "summary.json").read_text())
    assert summary["divergence"]["steps"] == 8
    assert summary["divergence"]["max_abs"] < 1e-4, summary["divergence"]
    for backend in ("fbgemm", "triton"):
        assert summary["throughput"][backend]["steps_timed"] == 5
        phases = summary["phases"][backend]
        assert phases["tbe_forward"] > 0 and phases["tbe_backward"] > 0, phases
        assert list((out / "tensorboard" / backend).glob("events.out.tfevents.*")), backend
        records = [json.loads(line) for line in (out / f"{backend}.jsonl").read_text().splitlines()]
        evals = [r["step"] for r in records if r["kind"] == "eval"]
        assert evals == [4, 8], evals  # every 4 steps and at the end
