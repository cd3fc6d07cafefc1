"""End-to-end smoke test of the forward A/B benchmark on CPU (Triton interpreter).

Runs ``python -m tbe_plugin.benchmarks.forward --smoke`` in a fresh subprocess (so that
TRITON_INTERPRET is set before triton is first imported) and checks the reports it
writes: every config and provider present, ours matching FBGEMM's output. Times are
recorded, never asserted.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tbe_plugin.benchmarks.common import InputBatch, TBEConfig, forward_bytes
from tbe_plugin.benchmarks.forward import SMOKE_CONFIGS

REPO_ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["ours", "fbgemm", "torch"]


def run_benchmark(out_dir: Path, *extra: str) -> tuple[dict, str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "tbe_plugin.benchmarks.forward", "--smoke",
               "--iters", "2", "--warmup", "1", "--out", str(out_dir), *extra]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"benchmark failed:\n{done.stdout}\n{done.stderr}"
    report = json.loads((out_dir / "forward.json").read_text())
    markdown = (out_dir / "forward.md").read_text()
    return report, markdown, done.stdout


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return run_benchmark(tmp_path_factory.mktemp("bench-out"))


def test_every_config_and_provider_is_reported(smoke_run):
    report, markdown, stdout = smoke_run
    assert report["providers"] == PROVIDERS
    assert [entry["name"] for entry in report["configs"]] == [cfg.name for cfg in SMOKE_CONFIGS]
    for entry in report["configs"]:
        assert set(entry["providers"]) == set(PROVIDERS), entry["name"]
        for name, result in entry["providers"].items():
            if result["status"] == "ok":
                assert all(math.isfinite(result[k]) for k in ("median_ms", "p10_ms", "p90_ms", "tbps"))
            else:
                assert result["reason"], (entry["name"], name)
        assert entry["bytes"]["total"] > 0
    for key in ("torch", "triton", "fbgemm_gpu", "device_name"):
        assert key in report["environment"]
    assert report["copy_bandwidth"]["tbps"] > 0
    assert "fbgemm/ours" in report["geomean"]
    for cfg in SMOKE_CONFIGS:
        assert f"| {cfg.name} |" in markdown
    for name in PROVIDERS:
        assert f"{name} ms" in markdown
    assert "| geomean |" in markdown
    assert "bytes = " in markdown
    assert markdown.strip() in stdout


def test_ours_matches_fbgemm(smoke_run):
    report, markdown, _ = smoke_run
    for entry in report["configs"]:
        ours, fbgemm = entry["providers"]["ours"], entry["providers"]["fbgemm"]
        assert ours["status"] == "ok", (entry["name"], ours.get("reason"))
        # FBGEMM's CPU forward has no bf16 kernel; everywhere else it is the reference.
        if entry["config"]["weights_precision"] != "bf16":
            assert fbgemm["status"] == "ok", (entry["name"], fbgemm.get("reason"))
        if fbgemm["status"] == "ok":
            assert entry["reference"] == "fbgemm"
            assert "fbgemm/ours" in entry["ratios"]
        assert ours["matches"], (entry["name"], ours["max_abs_diff"])
        assert entry["providers"]["torch"]["matches"], entry["name"]
    assert report["mismatches"] == []
    assert "MISMATCH" not in markdown


def test_self_check_pairs_each_provider_with_its_twin(tmp_path):
    report, markdown, _ = run_benchmark(tmp_path, "--self-check", "--configs", "smoke-sum,smoke-mixed-d")
    assert report["providers"] == ["fbgemm", "fbgemm-twin", "ours", "ours-twin"]
    assert [entry["name"] for entry in report["configs"]] == ["smoke-sum", "smoke-mixed-d"]
    for entry in report["configs"]:
        assert set(entry["ratios"]) == {"fbgemm/fbgemm-twin", "ours/ours-twin"}
        for name in ("fbgemm-twin", "ours", "ours-twin"):
            assert entry["providers"][name]["matches"], (entry["name"], name)
    assert "ours/ours-twin" in markdown


def test_forward_bytes_counts_every_lookup():
    cfg = TBEConfig("bytes", T=2, B=3, L=2, E=10, D=(4, 8), weighted=True)
    indices = torch.zeros(cfg.T * cfg.B * cfg.L, dtype=torch.int64)  # repeated ids count too
    offsets = torch.arange(0, indices.numel() + 1, cfg.L, dtype=torch.int64)
    batch = InputBatch(indices, offsets, torch.ones(indices.numel()))
    moved = forward_bytes(cfg, batch)
    assert moved["rows"] == (6 * 4 + 6 * 8) * 4
    assert moved["indices"] == 12 * 8 and moved["offsets"] == 7 * 8
    assert moved["per_sample_weights"] == 12 * 4 and moved["output"] == 3 * 12 * 4
    assert moved["total"] == sum(moved[k] for k in ("rows", "indices", "offsets", "per_sample_weights", "output"))
