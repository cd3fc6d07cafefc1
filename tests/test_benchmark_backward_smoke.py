"""End-to-end smoke test of the backward + fused-optimizer A/B benchmark on CPU.

Runs ``python -m tbe_plugin.benchmarks.backward --smoke`` in a fresh subprocess (so that
TRITON_INTERPRET is set before triton is first imported) and checks the reports: every
config, optimizer, mode and provider present, and ours matching FBGEMM's updated weights
and optimizer states wherever FBGEMM's CPU TBE runs (a torch fp32 reference elsewhere).
The smoke configs include a production-shaped ``Workload`` (Poisson bags, mixed rows and
D, int32 ids), counted in the production geomean. Times are recorded, never asserted. Also
checks the backward byte count, the memory skip and the untimed-setup variant of
``common.time_alternating`` directly.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tbe_plugin.benchmarks import backward
from tbe_plugin.benchmarks.backward import (
    MODES, OPTIMIZERS, REFERENCE_CONFIG, SORT_BYTES_PER_LOOKUP, SUITE_OPTIMIZER, backward_bytes,
)
from tbe_plugin.benchmarks.common import InputBatch, TBEConfig, backward_host_and_wall_ms, time_alternating
from tbe_plugin.benchmarks.suite import SMOKE_CONFIGS, SMOKE_PRODUCTION

REPO_ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["ours", "fbgemm"]
# What FBGEMM 1.8's CPU TBE trains; the Adam family is CUDA-only there.
FBGEMM_CPU_OPTIMIZERS = {"EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD"}


def expected_entries() -> list[tuple[str, str]]:
    reference = REFERENCE_CONFIG["smoke"]
    return [(cfg.name, optimizer) for cfg in SMOKE_CONFIGS
            for optimizer in (OPTIMIZERS if cfg.name == reference else [SUITE_OPTIMIZER])]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench-out")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "tbe_plugin.benchmarks.backward", "--smoke",
               "--iters", "2", "--warmup", "1", "--out", str(out_dir)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"benchmark failed:\n{done.stdout}\n{done.stderr}"
    report = json.loads((out_dir / "backward.json").read_text())
    return report, (out_dir / "backward.md").read_text(), done.stdout


def test_every_config_optimizer_mode_and_provider_is_reported(smoke_run):
    report, markdown, stdout = smoke_run
    assert report["providers"] == PROVIDERS and report["modes"] == list(MODES)
    assert [(e["name"], e["optimizer"]) for e in report["entries"]] == expected_entries()
    for entry in report["entries"]:
        assert set(entry["providers"]) == set(PROVIDERS), entry["name"]
        for name, result in entry["providers"].items():
            if result["status"] != "ok":
                assert result["reason"], (entry["name"], entry["optimizer"], name)
                continue
            assert set(result["modes"]) == set(MODES)
            for stats in result["modes"].values():
                assert all(math.isfinite(stats[k]) for k in ("median_ms", "p10_ms", "p90_ms", "tbps"))
        assert entry["bytes"]["bwd"]["total"] > 0 and entry["bytes"]["fwd"]["total"] > 0
    assert report["copy_bandwidth"]["tbps"] > 0
    assert set(report["geomean"]) == set(report["geomean_production"]) == set(MODES)
    production = [e for e in report["entries"] if e["production"]]
    assert [e["name"] for e in production] == [cfg.name for cfg in SMOKE_PRODUCTION]
    for mode in MODES:
        assert report["geomean_production"][mode] == pytest.approx(production[0]["ratios"][mode])
        assert f"## {mode}\n" in markdown
    assert markdown.count("| geomean (production: smoke-ctr) |") == len(MODES)
    assert markdown.count("| distinct | hot1% |") == len(MODES)
    for entry in report["entries"]:
        assert 0 < entry["skew"]["distinct_fraction"] <= 1 and len(entry["skew"]["distinct_per_table"]) == len(
            entry["config"]["rows"])
        assert entry["bytes"]["bwd"]["distinct_rows"] == sum(entry["skew"]["distinct_per_table"])
    assert all(c["elapsed_s"] > 0 for c in report["configs"])
    assert f"- commit: {report['environment']['git_commit']} (tree " in markdown
    for name, optimizer in expected_entries():
        assert f"| {name} | {optimizer} |" in markdown
    for name in PROVIDERS:
        assert f"{name} ms" in markdown
    assert markdown.count("| geomean |") == len(MODES)
    assert "bwd bytes: bytes = " in markdown
    assert markdown.strip() in stdout


def test_ours_matches_fbgemm_after_one_step(smoke_run):
    report, markdown, _ = smoke_run
    for entry in report["entries"]:
        key = (entry["name"], entry["optimizer"])
        ours, fbgemm = entry["providers"]["ours"], entry["providers"]["fbgemm"]
        assert ours["status"] == "ok", (key, ours.get("reason"))
        fbgemm_runs = (entry["config"]["weights_precision"] != "bf16"
                       and entry["optimizer"] in FBGEMM_CPU_OPTIMIZERS)
        assert (fbgemm["status"] == "ok") == fbgemm_runs, (key, fbgemm.get("reason"))
        assert entry["reference"] == ("fbgemm" if fbgemm_runs else "torch-fp32"), key
        assert set(entry["ratios"]) == (set(MODES) if fbgemm_runs else set()), key
        assert set(entry["round_ratios"]) == set(entry["ratios"]), key
        for mode, spread in entry["round_ratios"].items():
            assert spread["p10"] <= spread["median"] <= spread["p90"] and 0.0 <= spread["below_1"] <= 1.0, key
            assert spread["rounds"] == ours["modes"][mode]["n"], key
        assert ours["matches"], (key, ours["weights_max_abs_diff"], ours["states_max_abs_diff"])
        if entry["config"]["weights_precision"] == "fp32":
            assert ours["weights_max_abs_diff"] < 1e-6, key
    assert report["mismatches"] == []
    assert "MISMATCH" not in markdown


def test_backward_bytes_counts_distinct_rows_and_state():
    cfg = TBEConfig("bytes", T=2, B=3, L=2, E=10, D=(4, 8), weighted=True)
    indices = torch.zeros(cfg.T * cfg.B * cfg.L, dtype=torch.int64)
    offsets = torch.arange(0, indices.numel() + 1, cfg.L, dtype=torch.int64)
    batch = InputBatch(indices, offsets, torch.ones(indices.numel()))
    moved = backward_bytes(cfg, batch, distinct=[1, 2], state_bytes=[4, 8 * 4])
    assert moved["grad_output"] == 3 * 12 * 4
    assert moved["rows"] == 2 * (1 * 4 + 2 * 8) * 4
    assert moved["optimizer_state"] == 2 * (1 * 4 + 2 * 32)
    assert moved["indices"] == 12 * 8 + 7 * 8 + 12 * 4
    assert moved["sort"] == 12 * SORT_BYTES_PER_LOOKUP
    assert moved["total"] == sum(moved[k] for k in ("grad_output", "rows", "optimizer_state", "indices", "sort"))


def test_a_config_that_does_not_fit_is_skipped_for_every_optimizer(tmp_path, monkeypatch):
    needs = []
    monkeypatch.setattr(backward, "memory_shortfall", lambda device, needed: needs.append(needed) or "skipped: test")
    report = backward.main(["--smoke", "--configs", "smoke-ctr", "--optimizers", "exact_sgd,adam",
                            "--copy-gib", "0.001", "--out", str(tmp_path)])
    assert [(e["name"], e["optimizer"], e["skipped"]) for e in report["entries"]] == [
        ("smoke-ctr", "EXACT_SGD", "skipped: test"), ("smoke-ctr", "ADAM", "skipped: test")]
    assert report["geomean"] == {mode: None for mode in MODES}
    sgd_only = backward.memory_check(SMOKE_PRODUCTION[0], ["EXACT_SGD"], backward.parse_args(["--smoke"]),
                                     torch.device("cpu"))
    assert sgd_only == "skipped: test" and needs[-1] < needs[0]  # the check sized for Adam's two moments
    markdown = (tmp_path / "backward.md").read_text()
    assert "- smoke-ctr / ADAM / ours: skipped: test" in markdown


def test_time_alternating_passes_the_untimed_setup_result():
    seen = {"a": [], "b": []}
    calls = {name: (lambda arg, name=name: seen[name].append(arg)) for name in seen}
    prepare = {name: (lambda i, name=name: (name, i)) for name in seen}
    samples = time_alternating(calls, iters=3, warmup=2, device=torch.device("cpu"), prepare=prepare)
    assert {name: len(s) for name, s in samples.items()} == {"a": 3, "b": 3}
    for name in seen:
        assert seen[name] == [(name, 0), (name, 1), (name, 0), (name, 1), (name, 2)]


def test_time_alternating_gives_short_calls_more_rounds_alike_for_every_provider(monkeypatch):
    """The rounds follow the slowest provider's warm-up call: on a clock that only the calls
    move (a real sleep of 2 ms took 5 on a busy 2-core machine), exactly ceil(20 / 2) = 10."""
    from tbe_plugin.benchmarks import common

    class Clock:  # time.perf_counter and time.sleep, as common's timing sees them
        now = 0.0

        def perf_counter(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(common, "time", clock)
    calls = {"fast": lambda _i: None, "slow": lambda _i: clock.sleep(0.002)}
    cpu = torch.device("cpu")
    samples = time_alternating(calls, iters=3, warmup=1, device=cpu, min_ms=20.0, max_iters=30)
    assert {name: len(s) for name, s in samples.items()} == {"fast": 10, "slow": 10}
    assert all(ms == pytest.approx(2.0) for ms in samples["slow"]) and samples["fast"] == [0.0] * 10
    capped = time_alternating(calls, iters=3, warmup=1, device=cpu, min_ms=1000.0, max_iters=12)
    assert {name: len(s) for name, s in capped.items()} == {"fast": 12, "slow": 12}
    long_calls = {"a": lambda _i: clock.sleep(0.01)}
    assert len(time_alternating(long_calls, iters=4, warmup=1, device=cpu, min_ms=20.0)["a"]) == 4
    assert len(time_alternating(calls, iters=3, warmup=0, device=cpu, min_ms=20.0)["slow"]) == 3  # no warm-up: iters


def test_backward_host_and_wall_ms_time_each_call_after_its_own_forward():
    """One untimed forward per timed backward (two per call: wall, then host), each backward
    timed in ms (a 5 ms sleep in it shows in both medians)."""
    import time

    forwards = []

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            time.sleep(0.005)
            return grad * 2

    def forward():
        forwards.append(1)
        return Slow.apply(torch.ones(3, requires_grad=True))

    host, wall = backward_host_and_wall_ms(forward, torch.ones(3), 3, torch.device("cpu"))
    assert len(forwards) == 6 and host >= 4.5 and wall >= 4.5


def test_paired_ratios_read_the_rounds_in_pairs():
    """Round r's reference call over round r's own call: ratios 2, 0.5, 1, 4 (not the ratio
    of medians, 1.6); a mismatch of rounds raises."""
    from tbe_plugin.benchmarks.common import paired_ratios

    spread = paired_ratios([2.0, 1.0, 3.0, 8.0], [1.0, 2.0, 3.0, 2.0])
    assert spread["median"] == pytest.approx(1.5) and spread["rounds"] == 4
    assert spread["below_1"] == pytest.approx(0.25)
    assert spread["p10"] == pytest.approx(0.65) and spread["p90"] == pytest.approx(3.4)
    with pytest.raises(ValueError, match="rounds"):
        paired_ratios([1.0], [1.0, 2.0])
