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
    check_timing_records(records, summary["runs"][0])


def check_timing_records(records, run):
    """The app's metrics records of a run carry their wall-clock time and the durations of
    the start-up, evaluations, profiling and the end; the A/B took its throughput and the
    run's time split from them."""
    assert all(isinstance(r["time"], float) for r in records), records
    by_kind = {}
    for r in records:
        by_kind.setdefault(r["kind"], []).append(r)
    assert sorted(by_kind) == ["checkpoint", "config", "eval", "final", "phases", "startup", "step"], list(by_kind)
    (startup,) = by_kind["startup"]
    parts = ("imports_s", "config_s", "process_group_s", "build_s", "restore_s", "data_setup_s")
    assert all(startup[k] >= 0 for k in parts) and startup["build_s"] > 0 and startup["imports_s"] > 0, startup
    assert startup["process_start"] < startup["time"] and sum(startup[k] for k in parts) <= startup["startup_s"] + 0.05
    steps = by_kind["step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and steps[0]["time"] > startup["time"]
    assert all(a["time"] <= b["time"] for a, b in zip(steps, steps[1:]))
    # every_steps 10: the losses were read by the drains, before the evaluation after step 2 and at the end
    assert [r["step"] for r in steps if "sync_ms" in r] == [2, 4] and steps[-1]["sync_ms"] >= 0
    (phases,) = by_kind["phases"]  # one profiled step, after the warm-up one
    assert phases["profiled_steps"] == [2, 2] and phases["profiled_steps_ms"] == steps[1]["step_ms"]
    assert phases["pause_s"] == pytest.approx(phases["profiler_start_s"] + phases["profiler_stop_s"])
    assert phases["pause_s"] > 0
    in_loop, final_eval = by_kind["eval"]
    assert in_loop["pause_s"] == in_loop["eval_s"] > 0 and final_eval["eval_s"] > 0 and "pause_s" not in final_eval
    assert steps[1]["time"] < in_loop["time"] < steps[2]["time"]  # evaluated after step 2, before step 3 ended
    (end,) = by_kind["checkpoint"]
    assert end["path"] is None and end["drain_s"] >= 0 and end["time"] >= steps[-1]["time"]  # checkpoint=none
    (final,) = by_kind["final"]
    assert final["loop_s"] > 0 and final["end_s"] >= end["check_s"] + final_eval["eval_s"]
    assert run["throughput"]["source"] == "wall span" and run["throughput"]["steps_timed"] == 3
    span = run["throughput"]["span"]
    assert span["span_s"] == pytest.approx(steps[-1]["time"] - steps[0]["time"])
    assert span["paused_s"] == pytest.approx(phases["pause_s"] + in_loop["pause_s"])
    time = run["time"]
    assert time["source"] == "records' time" and time["startup_s"] > startup["startup_s"]  # the launch before it
    assert time["loop_s"] == pytest.approx(steps[-1]["time"] - startup["time"])
    assert time["end"]["in_app_s"] == pytest.approx(final["time"] - steps[-1]["time"]) and time["end"]["exit_s"] > 0
    assert time["startup_s"] + time["loop_s"] + time["end_s"] == pytest.approx(time["wall_s"], abs=0.01)


# The report of a cut A/B (synthetic metrics, no training): written from the runs finished so
# far, saying which are missing; each comparison that needs a missing run says it cannot be made.

ENV = {"git_commit": "abc123", "git_dirty": False, "git_changed": [], "device": "cuda:0", "device_name": "H200",
       "cuda": "12.4", "torch": "2.5", "triton": "3.1", "fbgemm_gpu": "1.0", "torchrec": "1.0", "python": "3.11",
       "triton_interpret": None}  # fmt: skip


def _fake_run(backend, ms=10.0, steps=6, loss_shift=0.0, timing=True):
    """A finished run as ``load_run`` gives it: 6 steps of ``ms`` (the first 10x: warm-up),
    an evaluation, profiled phases, the final metrics; timing as ``run_training`` records it."""
    step_ms = [10 * ms] + [ms] * (steps - 1)
    run = {"backend": backend, "config": {"world_size": 1, "batch_size": 100, "staleness": 0, "steps": steps},
           "step": [{"step": i + 1, "loss": 1.0 - 0.1 * i + loss_shift, "step_ms": t, "examples_per_s": 1e5 / t}
                    for i, t in enumerate(step_ms)],
           "eval": [{"step": steps, "auc": 0.7, "log_loss": 0.5, "optimal_auc": 0.8, "optimal_log_loss": 0.4}],
           "phases": {"tbe_forward": 1.0, "tbe_backward": 2.0, "all_to_all": 0.0, "dense_and_other": 3.0,
                      "total_ms": 6.0, "step_ms": ms, "timing": "device kernels"},
           "final": {"first_loss": 1.0, "last_loss": 0.6, "auc": 0.7, "optimal_auc": 0.8, "auc_gap": 0.1,
                     "log_loss": 0.5, "optimal_log_loss": 0.4, "excess_log_loss": 0.1}}  # fmt: skip
    if timing:
        run["timing"] = {"wall_s": 60.0, "returncode": 0, "config_at_s": 20.0, "first_step_at_s": 21.0,
                         "last_step_at_s": 50.0, "phases_at_s": 30.0, "eval_at_s": [[steps, 55.0]],
                         "final_at_s": 55.0}  # fmt: skip
    return run


def _timed_records(ms=10.0, gap_ms=5.0, steps=6):
    """A metrics file's records as the app writes them, with ``time``: the loop starts at
    1000.0 s; each step ends ``ms`` (the first 10x) + ``gap_ms`` (host syncs, the ranks'
    agreement: outside step_ms) after the previous one; step 2 is profiled (3x its step time),
    the profiler's stop pausing the loop 0.5 s before step 3; an evaluation after step 3
    pauses it 2 s; the final drain and evaluation after the last step pause nothing timed."""
    step_ms = [10 * ms, 3 * ms] + [ms] * (steps - 2)
    records = [{"kind": "config", "step": None, "time": 999.9, "world_size": 1, "batch_size": 100, "staleness": 0,
                "steps": steps},
               {"kind": "startup", "step": 0, "time": 1000.0, "process_start": 982.0, "imports_s": 10.0,
                "config_s": 1.0, "process_group_s": 2.0, "build_s": 4.0, "restore_s": 0.0, "data_setup_s": 1.0,
                "startup_s": 18.0}]  # fmt: skip
    now = 1000.0
    for i, t in enumerate(step_ms):
        now += (t + gap_ms) / 1e3
        records.append({"kind": "step", "step": i + 1, "time": now, "loss": 1.0 - 0.1 * i, "step_ms": t,
                        "examples_per_s": 1e5 / t})
        if i + 1 == 2:
            now += 0.5
            records.append({"kind": "phases", "step": 2, "time": now, "tbe_forward": 1.0, "tbe_backward": 2.0,
                            "all_to_all": 0.0, "dense_and_other": 3.0, "total_ms": 6.0, "step_ms": 3 * ms,
                            "timing": "device kernels", "profiled_steps": [2, 2], "profiled_steps_ms": 3 * ms,
                            "profiler_start_s": 0.1, "profiler_stop_s": 0.4, "pause_s": 0.5})
        if i + 1 == 3:
            now += 2.0
            records.append({"kind": "eval", "step": 3, "time": now, "auc": 0.7, "log_loss": 0.5, "eval_s": 2.0,
                            "pause_s": 2.0})
    records += [{"kind": "checkpoint", "step": steps, "time": now + 0.2, "path": None, "drain_s": 0.0, "check_s": 0.2,
                 "save_s": 0.0, "pause_s": 0.2},
                {"kind": "eval", "step": steps, "time": now + 1.5, "auc": 0.7, "log_loss": 0.5, "optimal_auc": 0.8,
                 "optimal_log_loss": 0.4, "eval_s": 1.3},
                {"kind": "final", "step": steps, "time": now + 1.5, "first_loss": 1.0, "last_loss": 0.6, "auc": 0.7,
                 "log_loss": 0.5, "loop_s": now - 1000.0, "end_s": 1.5}]  # fmt: skip
    return records, step_ms, now


def test_throughput_from_the_wall_span_of_the_records_not_the_step_times(tmp_path, monkeypatch):
    """Steps end 5 ms apart beyond their step_ms (host syncs, agreement): examples/s come
    from the wall span between the records' times less the loop's timed pauses inside it;
    the step times alone would say 1.5x more. The run's time split comes from the records."""
    ab = _ab_module()
    records, step_ms, last_at = _timed_records()
    folder = tmp_path / "run1_fbgemm"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    wall = last_at + 2.0 - 980.0  # launched at 980 s; the process exits 0.5 s after its final record
    (folder / "timing.json").write_text(json.dumps({"wall_s": wall, "returncode": 0, "launched_at": 980.0}))
    run = ab.load_run(folder, "fbgemm")
    assert [p["kind"] for p in run["pauses"]] == ["phases", "eval", "checkpoint"]
    rate = ab.throughput(run, skip=1)  # steps 2..6: 30 + 4 x 10 ms of step_ms, 5 x 5 ms more between them
    assert rate["source"] == "wall span" and rate["steps_timed"] == 5
    assert rate["span"]["paused_s"] == pytest.approx(2.5)  # the profiler and the evaluation; not the end's
    assert rate["span"]["train_s"] == pytest.approx((30 + 40 + 25) / 1e3)
    assert rate["examples_per_s"] == pytest.approx(100 * 5 / 0.095) and rate["mean_ms"] == pytest.approx(19.0)
    assert rate["step_ms_examples_per_s"] == pytest.approx(100 / 0.014)  # what step_ms would say: 1.47x more
    assert rate["p50_ms"] == 10.0
    whole = ab.throughput(run, skip=0)  # from the loop's start (the startup record): all 6 steps
    assert whole["steps_timed"] == 6 and whole["span"]["train_s"] == pytest.approx((100 + 30 + 40 + 30) / 1e3)
    time = ab.time_breakdown(run, skip=1)
    assert time["source"] == "records' time" and time["startup_s"] == pytest.approx(20.0)
    assert time["startup"] == {"launch_s": pytest.approx(2.0), "imports_s": 10.0, "config_s": 1.0,
                               "process_group_s": 2.0, "build_s": 4.0, "restore_s": 0.0, "data_setup_s": 1.0}
    assert time["loop_s"] == pytest.approx(last_at - 1000.0) and time["steps_s"] == pytest.approx(0.17)
    assert time["paused_s"] == pytest.approx(2.5) and time["loop_other_s"] == pytest.approx(0.03)  # 6 x 5 ms
    assert time["end_s"] == pytest.approx(2.0) and time["end"] == {"in_app_s": pytest.approx(1.5),
                                                                   "exit_s": pytest.approx(0.5)}  # fmt: skip
    assert time["profiled_extra_s"] == pytest.approx(0.02)  # 30 ms against a median step of 10
    runs = {"run1_fbgemm": run, "run2_triton": ab.load_run(folder, "triton")}
    text, summary, _ = _report(ab, tmp_path, runs, {}, monkeypatch)
    assert summary["runs"][0]["throughput"]["examples_per_s"] == pytest.approx(5263.16, rel=1e-5)
    assert "| 1 | fbgemm | wall span | 5 | 2.6 (2.5) | 19.00 | 10.00 / 10.00 / 30.00 | 5263 | 7143 | 0.02 |" in text
    assert ("| 1 | fbgemm | records' time | 24.7 | 0.2 (0.1) | 24.5 | 20.0 / 2.5 / 2.0 | 2.5 / 0.0 | "
            "2.0 / 10.0 / 1.0 / 2.0 / 4.0 / 0.0 / 1.0 | 1.5 / 0.5 |") in text  # fmt: skip
    assert "different sources" not in text


def _report(ab, tmp_path, runs, missing, monkeypatch):
    monkeypatch.setattr(ab, "plot", lambda runs, out, skip: [])  # matplotlib: tested by the --report-only test
    summary = ab.report(runs, tmp_path, 1, ["steps=6"], ENV, "python scripts/ab.py", missing)
    return (tmp_path / "report.md").read_text(), json.loads((tmp_path / "summary.json").read_text()), summary


def test_partial_report_of_three_runs_of_four(tmp_path, monkeypatch):
    ab = _ab_module()
    runs = {"run1_fbgemm": _fake_run("fbgemm"), "run2_triton": _fake_run("triton", 8.0, loss_shift=1e-3),
            "run3_triton": _fake_run("triton", 8.4, loss_shift=1e-3)}  # fmt: skip
    text, summary, _ = _report(ab, tmp_path, runs, {"run4_fbgemm": "not run yet"}, monkeypatch)
    lines = text.splitlines()
    assert lines[0].startswith("# A/B")
    assert lines[2].startswith("**partial: 3 of 4 runs** (run4_fbgemm missing: not run")  # at the top
    assert "Done: run1_fbgemm, run2_triton, run3_triton." in lines[2]
    assert summary["missing"] == {"run4_fbgemm": "not run yet"} and summary["order"] == list(runs)
    comparison = summary["comparison"]
    assert comparison["ratio"] == pytest.approx(10 * (1 / 8 + 1 / 8.4) / 2)  # both backends ran: a ratio ...
    assert comparison["noise"] is None and comparison["inside_noise"] is None  # ... but fbgemm's noise is unknown
    assert comparison["backends"]["fbgemm"]["relative_range"] is None
    assert "| fbgemm | 1 |" in text and "n/a (1 run)" in text
    assert "noise is unknown (fbgemm: a single timed run)" in text and summary["noise_sentence"] in text
    divergence = summary["divergence"]
    assert divergence["fbgemm vs triton"]["max_abs"] == pytest.approx(1e-3)
    assert divergence["triton run to run"]["max_abs"] == 0.0
    assert divergence["fbgemm run to run"]["cannot"] == "only one finished run of fbgemm"
    assert "| fbgemm run to run | cannot be made: only one finished run of fbgemm | n/a | 0 |" in text
    assert "## Time per phase" in text and "## Quality against the optimum" in text


def test_partial_report_of_one_run_of_four(tmp_path, monkeypatch):
    ab = _ab_module()
    missing = {"run2_triton": "not run yet", "run3_triton": "not run yet", "run4_fbgemm": "not run yet"}
    text, summary, _ = _report(ab, tmp_path, {"run1_fbgemm": _fake_run("fbgemm")}, missing, monkeypatch)
    assert "**partial: 1 of 4 runs** (run2_triton missing: not run yet; run3_triton missing" in text
    assert summary["comparison"]["ratio"] is None and summary["comparison"]["noise"] is None
    assert list(summary["comparison"]["backends"]) == ["fbgemm"]
    assert "cannot be compared: no finished run of triton with timed steps" in text
    assert summary["divergence"]["fbgemm vs triton"]["cannot"] == "no finished run of triton"
    assert summary["divergence"]["triton run to run"]["cannot"] == "no finished run of triton"
    assert "No profiled run of triton" in text and "| tbe_forward | 1.000 | n/a |" in text


def test_complete_report_says_nothing_partial_and_where_each_runs_time_went(tmp_path, monkeypatch):
    ab = _ab_module()
    runs = {"run1_fbgemm": _fake_run("fbgemm"), "run2_triton": _fake_run("triton", 8.0),
            "run3_triton": _fake_run("triton", 8.0), "run4_fbgemm": _fake_run("fbgemm", timing=False)}  # fmt: skip
    text, summary, _ = _report(ab, tmp_path, runs, {}, monkeypatch)
    assert "partial" not in text and summary["missing"] == {} and summary["partial"] is None
    assert summary["comparison"]["ratio"] == pytest.approx(1.25) and summary["comparison"]["noise"] == 0.0
    assert "cannot" not in text
    # An older app's records (no time): throughput from the mean step time, time split from when the records appeared.
    assert {r["throughput"]["source"] for r in summary["runs"]} == {"sum of step_ms"}
    assert summary["runs"][0]["throughput"]["examples_per_s"] == pytest.approx(1e4)  # 5 steps of 10 ms after skip 1
    time = summary["runs"][0]["time"]  # 6 steps: 100 ms then 5 of 10 ms; records at 20 s (config) .. 50 s (last step)
    assert time["source"] == "arrival of records (polled)" and time["startup"] is None and time["paused_s"] is None
    assert time["wall_s"] == 60.0 and time["steps_s"] == pytest.approx(0.15) and time["warmup_s"] == pytest.approx(0.1)
    assert time["other_s"] == pytest.approx(59.85) and time["startup_s"] == 20.0 and time["loop_s"] == 30.0
    assert time["loop_outside_steps_s"] == pytest.approx(29.85) and time["end_s"] == 10.0 and time["evals"] == 1
    assert "| wall s | steps s (warm-up) | wall - steps s | start-up / in loop / end s |" in text
    assert "| 1 | fbgemm | sum of step_ms | 5 | n/a | 10.00 | 10.00 / 10.00 / 10.00 | 10000 | 10000 | n/a |" in text
    assert ("| 1 | fbgemm | arrival of records (polled) | 60.0 | 0.1 (0.1) | 59.9 | 20.0 / 29.9 / 10.0 | n/a / n/a | "
            "n/a | n/a |") in text  # fmt: skip
    assert summary["runs"][3]["time"]["wall_s"] is None
    assert "| 4 | fbgemm | n/a | n/a | 0.1 (0.1) | n/a | n/a / n/a / n/a | n/a / n/a | n/a | n/a |" in text


def _write_run(out, name, run, cut_at=None):
    """``run`` as the app and ``run_training`` write it into out/name; ``cut_at``: the metrics
    file ends after that many step records, the last line half written (a run cut short)."""
    folder = out / name
    folder.mkdir(parents=True)
    lines = [{"kind": "config", "step": None, **run["config"]}] + [{"kind": "step", **r} for r in run["step"]]
    if cut_at is None:
        lines += [{"kind": "phases", "step": 3, **run["phases"]}] + [{"kind": "eval", **r} for r in run["eval"]]
        lines += [{"kind": "final", "step": 6, **run["final"]}]
        (folder / "timing.json").write_text(json.dumps(run["timing"]))
        text = "".join(json.dumps(r) + "\n" for r in lines)
    else:
        text = "".join(json.dumps(r) + "\n" for r in lines[: 1 + cut_at]) + '{"kind": "step", "st'
    (folder / "metrics.jsonl").write_text(text)


def test_report_only_rebuilds_a_cut_ab_from_its_folders(tmp_path):
    ab = _ab_module()
    out = tmp_path / "ab"
    out.mkdir()
    setup = {"env": ENV, "command": "python scripts/ab.py --out ab -- steps=6", "overrides": ["steps=6"], "skip": 1,
             "order": ["run1_fbgemm", "run2_triton", "run3_triton", "run4_fbgemm"]}  # fmt: skip
    (out / "ab_setup.json").write_text(json.dumps(setup))
    _write_run(out, "run1_fbgemm", _fake_run("fbgemm"))
    _write_run(out, "run2_triton", _fake_run("triton", 8.0))
    _write_run(out, "run3_triton", _fake_run("triton", 8.0), cut_at=3)
    (out / "report.md").write_text("stale")
    summary = ab.main(["--out", str(out), "--report-only"])
    text = (out / "report.md").read_text()
    assert ("**partial: 2 of 4 runs** (run3_triton missing: cut after step 3 of 6 (no final record); run4_fbgemm "
            "missing: not run). Done: run1_fbgemm, run2_triton.") in text  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["missing"] == summary["missing"]
    assert summary["order"] == ["run1_fbgemm", "run2_triton"] and "- command: `python scripts/ab.py --out ab" in text
    assert summary["comparison"]["ratio"] == pytest.approx(1.25) and summary["comparison"]["noise"] is None
    assert summary["runs"][0]["time"]["startup_s"] == 20.0 and summary["runs"][0]["throughput"]["steps_timed"] == 5
    assert "](loss.png)" in text and (out / "step_time.png").read_bytes()[:4] == b"\x89PNG"


def test_the_ab_rewrites_its_report_after_every_run_and_names_a_failed_one(tmp_path, monkeypatch):
    ab = _ab_module()
    out = tmp_path / "ab"
    seen = []  # report.md's partial line when each run starts

    def fake_training(name, backend, out, nproc, overrides, cuda):
        report = out / "report.md"
        seen.append(report.read_text().splitlines()[2] if report.exists() else None)
        if len(seen) == 3:
            (out / name).mkdir()
            (out / name / "train.log").write_text("Traceback: boom\n")
            return {"wall_s": 5.0, "returncode": 1}
        run = _fake_run(backend)
        _write_run(out, name, run)
        return run["timing"]

    monkeypatch.setattr(ab, "run_training", fake_training)
    monkeypatch.setattr(ab, "environment", lambda cuda: ENV)
    monkeypatch.setattr(ab, "plot", lambda runs, out, skip: [])
    with pytest.raises(SystemExit, match=r"(?s)run3_triton failed .exit 1.*boom"):
        ab.main(["--out", str(out), "--skip", "1", "--", "steps=6"])
    assert seen[0] is None
    assert seen[1].startswith("**partial: 1 of 4 runs** (run2_triton missing: not run yet; run3_triton missing")
    assert seen[2].startswith("**partial: 2 of 4 runs** (run3_triton missing: not run yet; run4_fbgemm missing")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["missing"] == {"run3_triton": "failed (exit 1, see run3_triton/train.log)",
                                  "run4_fbgemm": "not run"}  # fmt: skip
    assert summary["order"] == ["run1_fbgemm", "run2_triton"] and summary["runs"][1]["time"]["wall_s"] == 60.0
    assert json.loads((out / "ab_setup.json").read_text())["overrides"] == ["steps=6"]
