"""End-to-end smoke test of the forward A/B benchmark on CPU (Triton interpreter).

Runs ``python -m tbe_plugin.benchmarks.forward --smoke`` in a fresh subprocess (so that
TRITON_INTERPRET is set before triton is first imported) and checks the reports it
writes: every config and provider present (FBGEMM-generated ``TBEConfig``s and a
production-shaped ``Workload``), ours matching FBGEMM's output, skew columns, both geomeans,
the commit measured. Times are recorded, never asserted. Also checks the suite selection,
the per-table byte count and the memory skip in-process.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tbe_plugin.benchmarks import forward, suite
from tbe_plugin.benchmarks.common import InputBatch, TBEConfig, forward_bytes
from tbe_plugin.benchmarks.suite import SMOKE_CONFIGS, SMOKE_PRODUCTION
from tbe_plugin.workloads import TableWorkload, Workload

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
    for key in ("torch", "triton", "fbgemm_gpu", "device_name", "git_commit", "git_dirty"):
        assert key in report["environment"]
    assert report["environment"]["git_dirty"] in (True, False)  # the tests run inside the repository
    assert f"- commit: {report['environment']['git_commit']} (tree " in markdown
    assert report["copy_bandwidth"]["tbps"] > 0
    assert "fbgemm/ours" in report["geomean"] and "fbgemm/ours" in report["geomean_production"]
    for cfg in SMOKE_CONFIGS:
        assert f"| {cfg.name} |" in markdown
    for name in PROVIDERS:
        assert f"{name} ms" in markdown
    assert "| geomean |" in markdown
    assert "| geomean (production: smoke-ctr) |" in markdown
    assert "| distinct | hot1% |" in markdown
    assert "bytes = " in markdown
    assert markdown.strip() in stdout


def test_production_workload_runs_on_the_shared_generator(smoke_run):
    report, _, _ = smoke_run
    by_name = {entry["name"]: entry for entry in report["configs"]}
    for cfg in SMOKE_CONFIGS:
        entry = by_name[cfg.name]
        assert entry["production"] == (cfg in SMOKE_PRODUCTION), cfg.name
        assert entry["config"]["kind"] == type(cfg).__name__
        assert 0 < entry["skew"]["distinct_fraction"] <= 1 and 0 < entry["skew"]["hot1pct_share"] <= 1
        assert entry["skew"]["lookups"] > 0 and entry["elapsed_s"] > 0
    ctr = by_name["smoke-ctr"]
    assert ctr["input_source"].startswith("tbe_plugin.workloads.generate_batch")
    assert ctr["config"]["rows"] == [50, 80, 30] and ctr["config"]["dims"] == [8, 12, 16]
    assert ctr["bytes"]["indices"] == ctr["skew"]["lookups"] * 4  # int32 ids
    assert report["geomean_production"]["fbgemm/ours"] == pytest.approx(ctr["ratios"]["fbgemm/ours"])


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


def test_suites_select_current_production_and_named_configs():
    current, production = suite.suite_configs(False, "current"), suite.suite_configs(False, "production")
    names = {cfg.name for cfg in production}
    assert {"fbgemm-standard", "ctr-mix", "ctr-mix-fp16", "user-id", "long-bags", "wide-d512-fp16", "ctr-dlrm"} <= names
    assert all(isinstance(cfg, TBEConfig) for cfg in current) and "fbgemm-standard" in {c.name for c in current}
    every = [cfg.name for cfg in suite.suite_configs(False, "all")]
    assert len(every) == len(set(every)) == len(current) + len(production) - 1  # fbgemm-standard in both
    assert all(suite.is_production(cfg) for cfg in production)
    assert not any(suite.is_production(cfg) for cfg in current if cfg.name != "fbgemm-standard")
    args = forward.parse_args(["--smoke", "--suite", "production"])
    assert [cfg.name for cfg in suite.select_configs(args)] == [cfg.name for cfg in SMOKE_PRODUCTION]
    with pytest.raises(SystemExit, match="smoke-sum"):
        suite.select_configs(forward.parse_args(["--smoke", "--suite", "production", "--configs", "smoke-sum"]))


def test_every_device_config_fits_an_h200_with_both_providers():
    """What the memory check would plan for each config, against the H200's 141 GB."""
    for cfg in suite.suite_configs(False, "all"):
        needed = suite.device_bytes_needed(cfg, num_batches=4, state_bytes_per_row=[4] * cfg.num_tables, providers=2)
        assert 0 < needed < 0.9 * 141e9, (cfg.name, needed / 1e9)


def test_a_config_that_does_not_fit_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(forward, "memory_shortfall", lambda device, needed: f"skipped: needs {needed} bytes")
    report = forward.main(["--smoke", "--configs", "smoke-ctr", "--iters", "1", "--copy-gib", "0.001",
                           "--out", str(tmp_path)])
    entry = report["configs"][0]
    assert entry["skipped"].startswith("skipped: needs ") and entry["ratios"] == {}
    assert {result["status"] for result in entry["providers"].values()} == {"n/a"}
    markdown = (tmp_path / "forward.md").read_text()
    assert "| smoke-ctr |" in markdown and f"- smoke-ctr / ours: {entry['skipped']}" in markdown


def test_forward_bytes_count_per_table_lookups_and_dims():
    workload = Workload("bytes", (TableWorkload(rows=10, dim=4, mean_pooling=1), TableWorkload(rows=5, dim=8, mean_pooling=1)),
                        batch_size=2, weights_precision="fp16", index_dtype="int32")
    # table 0: bags of 3 and 0 ids; table 1: bags of 1 and 2 ids.
    batch = InputBatch(torch.tensor([1, 1, 2, 0, 4, 4], dtype=torch.int32), torch.tensor([0, 3, 3, 4, 6], dtype=torch.int32), None)
    moved = forward_bytes(workload, batch)
    assert moved["rows"] == (3 * 4 + 3 * 8) * 2
    assert moved["indices"] == 6 * 4 and moved["offsets"] == 5 * 4 and moved["per_sample_weights"] == 0
    assert moved["output"] == 2 * 12 * 4
    assert moved["fbgemm_formula_bytes"] == moved["rows"] + moved["output"]


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
