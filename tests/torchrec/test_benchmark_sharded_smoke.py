"""The sharded-EBC benchmark runs end to end on the CPU (tiny tables) and writes its report."""

import json
import os
import subprocess
import sys


def test_sharded_benchmark_smoke(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "tbe_plugin.benchmarks.sharded", "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "sharded.json").read_text())
    assert report["first_step_max_abs_diff"] < 1e-6, report
    assert all(report["results"][b]["median_ms"] > 0 for b in ("triton", "fbgemm")), report
    assert (tmp_path / "sharded.md").read_text().startswith("# Sharded EBC training step")
