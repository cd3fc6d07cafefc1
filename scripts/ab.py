"""A/B of the training app: the same experiment under backend=fbgemm and backend=triton.

    python scripts/ab.py [--out DIR] [--nproc N] [--repeats R] [--skip S] [--profile-steps P] [-- overrides...]
    python scripts/ab.py --report-only [--out DIR] [--skip S]

Runs ``pipelines.app.train`` under torchrun R times per backend (at least 2), interleaved
A B B A (then A B again, ...), with the same seed and overrides and no checkpoints, each in
DIR/runN_<backend>/ with its metrics file; then writes DIR/report.md, DIR/summary.json and
PNG plots:

- a header: commit and dirty flag, device, package versions, the command line;
- throughput: per run examples/s over the wall span of its timed steps (the metrics
  records' own ``time``: from the end of the last warm-up step to the last step, less the
  loop's pauses that are not training, which the records time: evaluations, the profiler's
  start and stop, checkpoints, re-plans), beside it what the sum of the host step times
  (``step_ms``, which leaves out the host syncs and the ranks' agreement) would say; a
  metrics file without ``time`` (an older app's) falls back to the step times, and the
  report says which each run used; the spread of single steps; per backend the median
  over its runs and their range; the ratio, and a sentence saying whether the difference
  is larger than the run-to-run noise;
- time per phase measured on the device (profiler kernel time of TBE forward, TBE
  backward, all-to-all, the rest; without a GPU, host CPU time the same way);
- quality: AUC and log loss against the planted click log's Bayes-optimal predictor on
  the same held-out examples;
- loss curves: the largest divergence between backends and between runs of one backend;
- per run, where its wall time went, from the records' ``time`` and the app's durations:
  the subprocess's wall seconds, the sum of its step times, the start-up until the first
  step (launch, imports, config, process group, model build and sharding, resume, data
  set-up), the loop outside the step times (pauses: evaluations, profiler, checkpoints;
  the rest: host syncs, agreement, drains) and the end after the last step (final drain,
  checkpoint and evaluation in the app; exit). Run folders of an older A/B, whose records
  carry no time, use the times at which the records appeared (timing.json's, polled).

The report and summary are rewritten after every finished run, from the runs finished so
far: a device call cut short keeps them. While runs are missing the report says so at its
top ("partial: 3 of 4 runs (run4_fbgemm missing: ...)") and each comparison that needs a
missing run says it cannot be made. ``--report-only`` rebuilds them from the run folders
already in DIR (their metrics files; a run without the app's ``final`` record counts as cut)
without running anything.

On a machine without CUDA it runs Triton's interpreter on gloo (slow: keep the default
tiny tables); on GPUs, one process per GPU.
"""

import argparse
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipelines.bench.ab_runs import (  # noqa: E402  (after the path insert)
    BACKENDS, PHASE_ROWS, compare_backends, divergences, median_phases, noise_sentence, throughput, time_breakdown,
    timed_steps,
)

QUALITY_KEYS = ("auc", "optimal_auc", "auc_gap", "log_loss", "optimal_log_loss", "excess_log_loss")
RUN_DIR = re.compile(r"run(\d+)_(fbgemm|triton)")
SETUP_FILE = "ab_setup.json"  # the header's record of the runs (environment, command, overrides), for --report-only


def run_order(repeats: int) -> List[str]:
    """Backends in the order they run: A B B A A B ..., so that drift (clocks, heat, other
    load) hits both alike."""
    if repeats < 2:
        raise ValueError(f"repeats: each backend runs at least twice (for its noise), got {repeats}")
    order: List[str] = []
    for r in range(repeats):
        order += list(BACKENDS if r % 2 == 0 else reversed(BACKENDS))
    return order


def run_name(i: int, backend: str) -> str:
    return f"run{i + 1}_{backend}"


def run_training(name: str, backend: str, out: Path, nproc: int, overrides: List[str], cuda: bool
                 ) -> Dict[str, Any]:  # fmt: skip
    """One training run in DIR/<name>/ (its output: train.log, its metrics: metrics.jsonl);
    returns, and writes to timing.json, its wall seconds, exit status and when it was
    launched (wall clock: the records' ``time`` is measured from it)."""
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    for stale in (metrics, run_dir / "timing.json"):  # an earlier A/B's, in a reused folder
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pipelines.app.train", f"backend={backend}", f"logging.metrics_file={metrics}",
               "logging.progress_bar=false", "checkpoint=none", f"logging.tensorboard_dir={run_dir / 'tensorboard'}",
               *overrides]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    launched_at, began = time.time(), time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        process = subprocess.run(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - began
    timing = {"wall_s": round(wall, 3), "returncode": process.returncode, "launched_at": launched_at}
    (run_dir / "timing.json").write_text(json.dumps(timing))
    return timing


def load_run(run_dir: Path, backend: str) -> Dict[str, Any]:
    """A run's metrics file in the shape ``pipelines.metrics.read_metrics`` gives (lists of
    ``step`` and ``eval`` records, the last record of each other kind), skipping a line that
    does not parse (a cut run's last may be half written; and no torch import), with its
    backend, ``pauses`` (kind, step, time and pause_s of every record that paused the loop)
    and, where timing.json exists, its timing."""
    run: Dict[str, Any] = {"step": [], "eval": [], "pauses": []}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        kind = record.pop("kind", None)
        if record.get("pause_s") is not None and record.get("time") is not None:
            run["pauses"].append({"kind": kind, "step": record.get("step"), "time": record["time"],
                                  "pause_s": record["pause_s"]})  # fmt: skip
        if kind in ("step", "eval"):
            run[kind].append(record)
        elif kind:
            run[kind] = record
    run["backend"] = backend
    timing = run_dir / "timing.json"
    if timing.exists():
        run["timing"] = json.loads(timing.read_text())
    return run


def missing_reason(run: Dict[str, Any]) -> Optional[str]:
    """Why a loaded run does not count as finished (None: it does)."""
    code = (run.get("timing") or {}).get("returncode")
    if "final" in run and not code:
        return None
    steps = run["step"][-1]["step"] if run["step"] else 0
    where = f"after step {steps} of {run.get('config', {}).get('steps', '?')}"
    return f"failed (exit {code}) {where}" if code else f"cut {where} (no final record)"


def runs_in(out: Path, expected: List[str]) -> Any:
    """The finished runs in DIR (by run number) and the missing ones of ``expected`` and of
    what DIR holds, each with why."""
    found: Dict[int, Any] = {}
    for path in out.iterdir() if out.is_dir() else ():
        match = RUN_DIR.fullmatch(path.name)
        if match and (path / "metrics.jsonl").exists():
            found[int(match.group(1))] = (path.name, match.group(2))
    runs: Dict[str, Dict[str, Any]] = {}
    missing: Dict[str, str] = {}
    for number in sorted(found):
        name, backend = found[number]
        run = load_run(out / name, backend)
        reason = missing_reason(run)
        if reason is None:
            runs[name] = run
        else:
            missing[name] = reason
    for name in expected:
        if name not in runs and name not in missing:
            missing[name] = "not run"
    order = {name: i for i, name in enumerate(expected)}
    missing = dict(sorted(missing.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    return runs, missing


def environment(cuda: bool) -> Dict[str, Any]:
    """Commit, dirty flag, device and package versions (the benchmarks' record)."""
    import torch

    from tbe_plugin.benchmarks.common import collect_environment
    from tbe_plugin.torchrec._compat import TORCHREC_VERSION

    return {**collect_environment(torch.device("cuda" if cuda else "cpu")), "torchrec": TORCHREC_VERSION}


def _cell(value: Optional[float], spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


@functools.lru_cache(maxsize=None)
def _markdown_table() -> Any:
    """``tbe_plugin.benchmarks.report.markdown_table``; that module imports nothing of the
    project, so where tbe_plugin (and with it torch) is not imported yet it is loaded from its
    file: a report (--report-only, the tests) then needs no torch."""
    if "tbe_plugin" in sys.modules:
        from tbe_plugin.benchmarks.report import markdown_table

        return markdown_table
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ab_report", ROOT / "tbe_plugin" / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.markdown_table


def _table(headers: List[str], rows: List[List[str]]) -> List[str]:
    return [_markdown_table()(headers, rows), ""]


def partial_line(done: List[str], missing: Dict[str, str]) -> Optional[str]:
    """The report's first words while runs are missing (None when none is)."""
    if not missing:
        return None
    which = "; ".join(f"{name} missing: {why}" for name, why in missing.items())
    return (f"**partial: {len(done)} of {len(done) + len(missing)} runs** ({which}). Done: "
            f"{', '.join(done) or 'none'}. Comparisons that need a missing run say so.")


def header_lines(env: Dict[str, Any], command: str, first: Dict[str, Any], overrides: List[str]) -> List[str]:
    changed = env.get("git_changed", [])
    listed = ", ".join(changed[:8]) + (f", ... ({len(changed)} in all, in summary.json)" if len(changed) > 8 else "")
    dirty = {True: f"dirty: {listed}", False: "clean", None: "unknown"}
    return [
        "# A/B: backend=fbgemm vs backend=triton", "",
        f"- commit: {env['git_commit']} (tree {dirty[env['git_dirty']]})",
        f"- device: {env['device_name']} ({env['device']}, cuda {env.get('cuda', 'n/a')}); torch {env['torch']}, "
        f"triton {env['triton']}, fbgemm_gpu {env['fbgemm_gpu']}, torchrec {env['torchrec']}, "
        f"python {env['python']}, TRITON_INTERPRET={env['triton_interpret']}",
        f"- command: `{command}`",
        f"- runs: world size {first.get('world_size')}, batch {first.get('batch_size')} per rank, staleness "
        f"{first.get('staleness')}, {first.get('steps')} steps; overrides `{' '.join(overrides) or '(none)'}`", "",
    ]  # fmt: skip


def throughput_lines(per_run: List[Dict[str, Any]], comparison: Dict[str, Any], skip: int, cuda: bool) -> List[str]:
    def rate_row(i: int, r: Dict[str, Any]) -> List[str]:
        t, span = r["throughput"], r["throughput"]["span"]
        spanned = "n/a" if span is None else f"{span['span_s']:.1f} ({span['paused_s']:.1f})"
        return [str(i + 1), r["backend"], t["source"] or "n/a", str(t["steps_timed"]), spanned, _cell(t["mean_ms"]),
                f"{_cell(t['p10_ms'])} / {_cell(t['p50_ms'])} / {_cell(t['p90_ms'])}",
                _cell(t["examples_per_s"], ".0f"), _cell(t["step_ms_examples_per_s"], ".0f"),
                _cell(r["time"]["profiled_extra_s"], ".2f")]  # fmt: skip

    def seconds_row(i: int, r: Dict[str, Any]) -> List[str]:
        t = r["time"]
        cells = lambda d, keys: "n/a" if d is None else " / ".join(_cell(d[k], ".1f") for k in keys)  # noqa: E731
        return [str(i + 1), r["backend"], t["source"] or "n/a", _cell(t["wall_s"], ".1f"),
                f"{_cell(t['steps_s'], '.1f')} ({_cell(t['warmup_s'], '.1f')})", _cell(t["other_s"], ".1f"),
                cells(t, ("startup_s", "loop_outside_steps_s", "end_s")), cells(t, ("paused_s", "loop_other_s")),
                cells(t["startup"], ("launch_s", "imports_s", "config_s", "process_group_s", "build_s", "restore_s",
                                     "data_setup_s")), cells(t["end"], ("in_app_s", "exit_s"))]  # fmt: skip

    sources = {r["throughput"]["source"] for r in per_run if r["throughput"]["source"]}
    lines = ["## Throughput", "", f"Steps after the first {skip}. `wall span`: examples/s over the wall time from the "
             f"end of step {skip} to the end of the last step, taken from the metrics records' own `time` (it holds "
             "the periodic host syncs, the ranks' agreement each step and drains, which the host step times leave "
             "out), less the pauses in it that are not training (evaluations, the profiler's start and stop, "
             "checkpoints: `span s (paused)`); the timed steps are the steps in the span, by number. `sum of "
             "step_ms` (metrics without `time`, an older app's): from the mean host step time. `examples/s from "
             "step_ms` is what the host step times alone say, for comparison. The profiled steps are in the span "
             "with their profiling cost (estimated: their step times less as many median steps).", ""]  # fmt: skip
    if len(sources) > 1:
        lines += [f"**The runs' throughputs come from different sources ({', '.join(sorted(sources))}): the "
                  "comparison below mixes them.**", ""]  # fmt: skip
    lines += _table(["run", "backend", "throughput from", "timed steps", "span s (paused)", "ms per step",
                     "host step ms p10 / p50 / p90", "examples/s", "examples/s from step_ms",
                     "profiled steps' extra s (est.)"], [rate_row(i, r) for i, r in enumerate(per_run)])  # fmt: skip
    lines += [f"Each run's wall time (s, the subprocess's): `steps` sums all its host step times (in brackets the "
              f"first {skip}, warm-up and compilation), `wall - steps` is the rest, which splits into start-up "
              "(launch until the first step), in loop outside the step times (up to the end of the last step) and "
              "end. From the records' time (`records' time`): in loop splits into paused (evaluations, profiler, "
              "checkpoints) and other (host syncs, agreement, drains); start-up into launch (torchrun until the "
              "process started), imports, config (Hydra), process group, build (model, planning, sharding, table "
              "init), restore (a resume) and data (pipeline, batches, metrics log); end into in app (final drain, "
              "checkpoint, evaluation) and exit. An older A/B's run folders (`arrival of records (polled)`) have "
              "only when the records appeared: start-up until the config record.", ""]  # fmt: skip
    lines += _table(["run", "backend", "timing from", "wall s", "steps s (warm-up)", "wall - steps s",
                     "start-up / in loop / end s", "in loop: paused / other s",
                     "start-up: launch / imports / config / process group / build / restore / data s",
                     "end: in app / exit s"], [seconds_row(i, r) for i, r in enumerate(per_run)])  # fmt: skip
    per_backend = [[b, str(s["runs"]), _cell(s["median_examples_per_s"], ".0f"),
                    f"{_cell(s['min'], '.0f')} - {_cell(s['max'], '.0f')}",
                    "n/a (1 run)" if s["relative_range"] is None else f"{s['relative_range']:.1%}"]
                   for b, s in comparison["backends"].items()]  # fmt: skip
    lines += _table(["backend", "runs", "examples/s (median of runs)", "range of runs", "range / median"], per_backend)
    if comparison["ratio"] is not None:
        lines += [f"triton / fbgemm throughput: **{comparison['ratio']:.3f}**. {noise_sentence(comparison)}", ""]
    else:
        lines += [noise_sentence(comparison), ""]
    if not cuda:
        lines += ["On CPU, Triton's kernels run in its interpreter: these times say nothing about the kernels' "
                  "speed; the runs check that both backends train alike.", ""]
    return lines


def phase_lines(phases: Dict[str, Optional[Dict[str, Any]]]) -> List[str]:
    if not any(phases.values()):
        return []
    timing = {p["timing"] for p in phases.values() if p}
    rows = [[key] + [_cell((phases[b] or {}).get(key), ".3f") for b in BACKENDS] for key in PHASE_ROWS]
    absent = [b for b in BACKENDS if not phases[b]]
    note = [f"No profiled run of {' or '.join(absent)}: its column cannot be filled.", ""] if absent else []
    return ["## Time per phase", "", f"ms per step, measured: {' / '.join(sorted(timing))} per phase (each "
            "kernel or op credited to the phase op enclosing it), median over the runs' profiled steps. `total_ms` "
            "sums the phases (streams overlap, so on a GPU it may exceed the step); `step_ms` is the host's median "
            "step time.", ""] + note + _table(["phase"] + list(BACKENDS), rows)  # fmt: skip


def quality_lines(per_run: List[Dict[str, Any]]) -> List[str]:
    rows = [[str(i + 1), r["backend"]] + [_cell(r["final"].get(k), ".5f") for k in ("first_loss", "last_loss")] +
            [_cell(r["final"].get(k), ".4f") for k in QUALITY_KEYS] for i, r in enumerate(per_run)]  # fmt: skip
    lines = ["## Quality against the optimum", "", "Held-out evaluation at the end. `optimal_*`: the planted click "
             "log's Bayes-optimal predictor on the same examples (n/a on other data); `auc_gap` = optimal AUC - AUC, "
             "`excess_log_loss` = log loss - optimal log loss.", ""]  # fmt: skip
    return lines + _table(["run", "backend", "first loss", "last loss (mean of 10)", *QUALITY_KEYS], rows)


def divergence_lines(div: Dict[str, Any]) -> List[str]:
    rows = [[k, f"cannot be made: {d['cannot']}", "n/a", "0"] if "cannot" in d else
            [k, _cell(d["max_abs"], ".3g"), str(d["at_step"]), str(d["steps"])] for k, d in div.items()]  # fmt: skip
    return ["## Training-loss divergence", ""] + _table(["runs", "largest |difference|", "at step", "steps"], rows)


def plot(runs: Dict[str, Dict[str, Any]], out: Path, skip: int) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"fbgemm": "-", "triton": "--"}
    names = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in runs.items():
        ax.plot([r["step"] for r in run["step"]], [r["loss"] for r in run["step"]], styles[run["backend"]],
                label=name, alpha=0.7)  # fmt: skip
    ax.set(xlabel="step", ylabel="training loss", title="Loss")
    ax.legend()
    names.append(_save(fig, out, "loss.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([timed_steps(run, skip) or [float("nan")] for run in runs.values()], showfliers=True)
    ax.set_xticks(range(1, len(runs) + 1), list(runs), rotation=20)
    ax.set(ylabel="ms per step", title=f"Step time (after {skip} warm-up steps)")
    names.append(_save(fig, out, "step_time.png"))

    if all(run["eval"] for run in runs.values()):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for name, run in runs.items():
            steps = [r["step"] for r in run["eval"]]
            axes[0].plot(steps, [r["auc"] for r in run["eval"]], marker="o", label=name)
            axes[1].plot(steps, [r["log_loss"] for r in run["eval"]], marker="o", label=name)
        optimum = runs[next(iter(runs))]["eval"][-1]
        if "optimal_auc" in optimum:
            axes[0].axhline(optimum["optimal_auc"], color="grey", linestyle=":", label="optimum")
            axes[1].axhline(optimum["optimal_log_loss"], color="grey", linestyle=":", label="optimum")
        axes[0].set(xlabel="step", ylabel="AUC", title="Evaluation AUC")
        axes[1].set(xlabel="step", ylabel="log loss", title="Evaluation log loss")
        axes[0].legend(fontsize=7)
        names.append(_save(fig, out, "eval.png"))
    return names


def _save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def report(runs: Dict[str, Dict[str, Any]], out: Path, skip: int, overrides: List[str], env: Dict[str, Any],
           command: str, missing: Optional[Dict[str, str]] = None) -> Dict[str, Any]:  # fmt: skip
    """Writes DIR/report.md and DIR/summary.json from the finished runs' metrics (``missing``:
    the runs not finished, each with why: the report then says it is partial); returns the
    summary."""
    names = list(runs)
    missing = dict(missing or {})
    cuda = env["device"].startswith("cuda")
    per_run = [{"name": n, "backend": runs[n]["backend"], "throughput": throughput(runs[n], skip),
                "time": time_breakdown(runs[n], skip), "final": runs[n].get("final", {}),
                "phases": runs[n].get("phases"), "run_commit": runs[n].get("config", {}).get("git_commit")}
               for n in names]  # fmt: skip
    comparison = compare_backends(per_run)
    phases = {b: median_phases([runs[n] for n in names if runs[n]["backend"] == b]) for b in BACKENDS}
    div = divergences(runs, names)
    lines = header_lines(env, command, runs[names[0]].get("config", {}) if names else {}, overrides)
    partial = partial_line(names, missing)
    if partial:
        lines[1:1] = ["", partial]  # under the title
    if names:
        lines += throughput_lines(per_run, comparison, skip, cuda) + phase_lines(phases)
        lines += quality_lines(per_run) + divergence_lines(div)
        lines += [f"![{name[:-4]}]({name})" for name in plot(runs, out, skip)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    summary = {"provenance": {"commit": env["git_commit"], "dirty": env["git_dirty"],
                              "changed_files": env.get("git_changed", []), "command": command},
               "environment": env, "order": names, "missing": missing, "partial": partial, "runs": per_run,
               "comparison": comparison, "noise_sentence": noise_sentence(comparison), "phases": phases,
               "divergence": div}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="ab-report")
    parser.add_argument("--nproc", type=int, default=None, help="processes (default: GPUs, else 2)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per backend, interleaved A B B A (>= 2)")
    parser.add_argument("--skip", type=int, default=None, help="warm-up steps left out of the step times (default 5; "
                        "with --report-only the runs' own)")  # fmt: skip
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--report-only", action="store_true", help="rebuild report.md and summary.json from the "
                        "run folders already in --out (a cut A/B's); run nothing")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    order = run_order(args.repeats)
    out = Path(args.out).resolve()
    if args.report_only:
        return report_only(out, args, argv, order)
    skip = 5 if args.skip is None else args.skip
    import torch

    cuda = torch.cuda.is_available()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 2)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(cuda)  # before the runs: the tree they ran from
    command = shlex.join([os.path.basename(sys.executable), "scripts/ab.py", *argv])
    overrides = [f"logging.profile_steps={args.profile_steps}", f"logging.profile_after={skip}",
                 "logging.tensorboard=true", *args.overrides]  # fmt: skip
    names = [run_name(i, backend) for i, backend in enumerate(order)]
    setup = {"env": env, "command": command, "overrides": args.overrides, "skip": skip, "order": names}
    (out / SETUP_FILE).write_text(json.dumps(setup, indent=1, default=str))
    runs: Dict[str, Dict[str, Any]] = {}
    summary: Dict[str, Any] = {}
    for name, backend in zip(names, order):
        timing = run_training(name, backend, out, nproc, overrides, cuda)
        if timing["returncode"] != 0:
            missing = {n: "not run" for n in names if n not in runs}
            missing[name] = f"failed (exit {timing['returncode']}, see {name}/train.log)"
            report(runs, out, skip, args.overrides, env, command, missing)
            tail = (out / name / "train.log").read_text()[-3000:]
            raise SystemExit(f"{name} failed (exit {timing['returncode']}); {out / name / 'train.log'} ends:\n{tail}")
        runs[name] = load_run(out / name, backend)
        summary = report(runs, out, skip, args.overrides, env, command, {n: "not run yet" for n in names
                                                                          if n not in runs})  # fmt: skip
        t, rate = summary["runs"][-1]["time"], summary["runs"][-1]["throughput"]
        print(f"{name}: {_cell(rate['examples_per_s'], '.0f')} examples/s ({rate['source']}); {t['wall_s']:.0f} s "
              f"(steps {_cell(t['steps_s'], '.1f')} s, start-up "
              f"{_cell(t['startup_s'], '.1f')} s, in loop outside the steps "
              f"{_cell(t['loop_outside_steps_s'], '.1f')} s, end {_cell(t['end_s'], '.1f')} s); report of "
              f"{len(runs)} of {len(names)} runs written", flush=True)  # fmt: skip
    print((out / "report.md").read_text())
    return summary


def report_only(out: Path, args: argparse.Namespace, argv: List[str], order: List[str]) -> Dict[str, Any]:
    """The report and summary of the runs already in ``out``, from the setup the A/B wrote
    there before its runs (else from this command line and this machine)."""
    if not out.is_dir():
        raise SystemExit(f"--report-only: no folder {out}")
    setup_path = out / SETUP_FILE
    if setup_path.exists():
        setup = json.loads(setup_path.read_text())
    else:
        import torch

        setup = {"env": environment(torch.cuda.is_available()), "overrides": args.overrides,
                 "command": shlex.join([os.path.basename(sys.executable), "scripts/ab.py", *argv]),
                 "order": [run_name(i, b) for i, b in enumerate(order)]}  # fmt: skip
    skip = args.skip if args.skip is not None else setup.get("skip", 5)
    runs, missing = runs_in(out, setup["order"])
    summary = report(runs, out, skip, setup["overrides"], setup["env"], setup["command"], missing)
    print((out / "report.md").read_text())
    return summary


if __name__ == "__main__":
    main()
