"""A/B of the training app: the same experiment under backend=fbgemm and backend=triton.

    python scripts/ab.py [--out DIR] [--nproc N] [--repeats R] [--skip S] [--profile-steps P] [-- overrides...]
    python scripts/ab.py --report-only [--out DIR] [--skip S]

Runs ``pipelines.app.train`` under torchrun R times per backend (at least 2), interleaved
A B B A (then A B again, ...), with the same seed and overrides and no checkpoints, each in
DIR/runN_<backend>/ with its metrics file; then writes DIR/report.md, DIR/summary.json and
PNG plots:

- a header: commit and dirty flag, device, package versions, the command line;
- throughput: per run the mean step time (examples/s) and the spread of its steps; per
  backend the median over its runs and their range; the ratio, and a sentence saying
  whether the difference is larger than the run-to-run noise;
- time per phase measured on the device (profiler kernel time of TBE forward, TBE
  backward, all-to-all, the rest; without a GPU, host CPU time the same way);
- quality: AUC and log loss against the planted click log's Bayes-optimal predictor on
  the same held-out examples;
- loss curves: the largest divergence between backends and between runs of one backend;
- per run, where its wall time went: the subprocess's wall seconds, the sum of its step
  times, and (from when each metrics record appeared in the file) the start-up before the
  app's first record, the training loop's span and the end after its last step record.

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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BACKENDS = ("fbgemm", "triton")
PHASE_ROWS = ("tbe_forward", "tbe_backward", "all_to_all", "dense_and_other", "total_ms", "step_ms")
QUALITY_KEYS = ("auc", "optimal_auc", "auc_gap", "log_loss", "optimal_log_loss", "excess_log_loss")
RUN_DIR = re.compile(r"run(\d+)_(fbgemm|triton)")
SETUP_FILE = "ab_setup.json"  # the header's record of the runs (environment, command, overrides), for --report-only
POLL_S = 0.25  # how often a run's metrics file is read for new records (their arrival times)


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


class RecordWatch:
    """The kind and step of each complete line a metrics file gains, with the seconds since
    the run began at which it was seen (the app's records carry no time of their own)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.seen = path, 0, []

    def poll(self, at_s: float) -> None:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # rewritten from the start
                    self.offset = 0
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.seen.append((record.get("kind"), record.get("step"), round(at_s, 3)))


def arrival_marks(seen: List[Any]) -> Dict[str, Any]:
    """When the app's records appeared: its config (the end of its start-up), its first and
    last step records, its evaluations, profiled phases and final metrics."""
    first = lambda kind: next((at for k, _, at in seen if k == kind), None)  # noqa: E731
    steps = [at for k, _, at in seen if k == "step"]
    return {"config_at_s": first("config"), "first_step_at_s": steps[0] if steps else None,
            "last_step_at_s": steps[-1] if steps else None, "phases_at_s": first("phases"),
            "eval_at_s": [[step, at] for k, step, at in seen if k == "eval"], "final_at_s": first("final")}  # fmt: skip


def run_training(name: str, backend: str, out: Path, nproc: int, overrides: List[str], cuda: bool
                 ) -> Dict[str, Any]:  # fmt: skip
    """One training run in DIR/<name>/ (its output: train.log, its metrics: metrics.jsonl);
    returns, and writes to timing.json, its wall seconds, exit status and when its metrics
    records appeared."""
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
    watch = RecordWatch(metrics)
    began = time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                watch.poll(time.perf_counter() - began)
    wall = time.perf_counter() - began
    watch.poll(wall)
    timing = {"wall_s": round(wall, 3), "returncode": process.returncode, **arrival_marks(watch.seen)}
    (run_dir / "timing.json").write_text(json.dumps(timing))
    return timing


def load_run(run_dir: Path, backend: str) -> Dict[str, Any]:
    """A run's metrics file in the shape ``pipelines.metrics.read_metrics`` gives (lists of
    ``step`` and ``eval`` records, the last record of each other kind), skipping a line that
    does not parse (a cut run's last may be half written; and no torch import), with its
    backend and, where timing.json exists, its timing."""
    run: Dict[str, Any] = {"step": [], "eval": []}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        kind = record.pop("kind", None)
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


def timed_steps(run: Dict[str, Any], skip: int) -> List[float]:
    """Host step times after the first ``skip`` steps (drained steps have none)."""
    return [r["step_ms"] for r in run["step"][skip:] if r["step_ms"] is not None]


def throughput(run: Dict[str, Any], skip: int) -> Dict[str, Any]:
    """One run: examples/s from its mean step time (the host's step times add up to the
    wall time, so the mean is the throughput even where a host sync makes one step pay
    for several), and the spread of single steps (p10, p50, p90)."""
    ms = sorted(timed_steps(run, skip))
    config = run.get("config", {})
    examples = config.get("batch_size", 0) * config.get("world_size", 1)
    if not ms:
        return {"steps_timed": 0, "mean_ms": None, "p10_ms": None, "p50_ms": None, "p90_ms": None,
                "examples_per_s": None}  # fmt: skip
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    mean = statistics.fmean(ms)
    return {"steps_timed": len(ms), "mean_ms": mean, "p10_ms": pick(0.1), "p50_ms": statistics.median(ms),
            "p90_ms": pick(0.9), "examples_per_s": examples / (mean / 1e3)}  # fmt: skip


def time_breakdown(run: Dict[str, Any], skip: int) -> Dict[str, Any]:
    """Where a run's wall time went: ``wall_s`` the subprocess's (torchrun and all),
    ``steps_s`` the sum of its host step times (``warmup_s`` of the first ``skip``),
    ``other_s`` = wall - steps; from when its records appeared in the metrics file:
    ``startup_s`` until the app's config record (launch, imports, process group, model,
    sharding), ``loop_s`` from there to the last step record (steps, evaluations during
    training, profiling, the host syncs outside the step times), ``end_s`` after it (final
    evaluation, exit). None where unknown (no timing.json: a run of an older ab.py)."""
    timing = run.get("timing") or {}
    ms = [r["step_ms"] for r in run["step"] if r["step_ms"] is not None]
    warmup = [r["step_ms"] for r in run["step"][:skip] if r["step_ms"] is not None]
    wall, config_at, last_at = timing.get("wall_s"), timing.get("config_at_s"), timing.get("last_step_at_s")
    steps_s = sum(ms) / 1e3 if ms else None
    known = lambda *xs: all(x is not None for x in xs)  # noqa: E731
    loop_s = last_at - config_at if known(last_at, config_at) else None
    return {"wall_s": wall, "steps_s": steps_s, "warmup_s": sum(warmup) / 1e3 if warmup else None,
            "other_s": wall - steps_s if known(wall, steps_s) else None, "startup_s": config_at, "loop_s": loop_s,
            "loop_outside_steps_s": loop_s - steps_s if known(loop_s, steps_s) else None,
            "end_s": wall - last_at if known(wall, last_at) else None, "drained_steps": len(run["step"]) - len(ms),
            "evals": len(run["eval"]), "profiled": "phases" in run, "arrivals": timing or None}  # fmt: skip


def compare_backends(per_run: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per backend the median examples/s over its runs and their range; the ratio
    triton / fbgemm; the noise: the larger relative range of one backend's runs. A backend
    with no timed run is left out (then no ratio); one with a single run has no range (then
    the noise is unknown: None)."""
    backends: Dict[str, Any] = {}
    for backend in BACKENDS:
        rates = [r["throughput"]["examples_per_s"] for r in per_run if r["backend"] == backend]
        rates = [x for x in rates if x is not None]
        if not rates:
            continue
        median = statistics.median(rates)
        spread = (max(rates) - min(rates)) / median if len(rates) > 1 else None
        backends[backend] = {"runs": len(rates), "median_examples_per_s": median, "min": min(rates), "max": max(rates),
                             "relative_range": spread}  # fmt: skip
    if len(backends) < len(BACKENDS):
        return {"backends": backends, "ratio": None, "noise": None, "inside_noise": None}
    ratio = backends["triton"]["median_examples_per_s"] / backends["fbgemm"]["median_examples_per_s"]
    ranges = [b["relative_range"] for b in backends.values()]
    noise = None if None in ranges else max(ranges)
    return {"backends": backends, "ratio": ratio, "noise": noise,
            "inside_noise": None if noise is None else abs(ratio - 1) <= noise}  # fmt: skip


def noise_sentence(comparison: Dict[str, Any]) -> str:
    ratio, noise = comparison["ratio"], comparison["noise"]
    absent = [b for b in BACKENDS if b not in comparison["backends"]]
    if len(absent) == len(BACKENDS):
        return "No timed steps: no throughput to compare."
    if ratio is None:
        return (f"The backends' throughputs cannot be compared: no finished run of {' or '.join(absent)} with "
                "timed steps.")  # fmt: skip
    difference = f"{abs(ratio - 1):.1%}"
    if noise is None:
        single = [b for b, s in comparison["backends"].items() if s["relative_range"] is None]
        return (f"The run-to-run noise is unknown ({' and '.join(single)}: a single timed run), so these runs "
                f"cannot tell whether the difference ({difference}) is more than noise.")  # fmt: skip
    if comparison["inside_noise"]:
        return (f"The difference ({difference}) is inside the run-to-run noise ({noise:.1%}, the widest range of "
                "one backend's runs): these runs do not tell the backends apart in speed.")
    if ratio > 1:
        return f"triton is faster: {ratio:.3f}x fbgemm's throughput, outside the run-to-run noise ({noise:.1%})."
    return (f"fbgemm is faster: triton reaches {ratio:.3f}x its throughput ({difference} less), outside the "
            f"run-to-run noise ({noise:.1%}).")


def divergence(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """The largest |loss_a - loss_b| over the steps both ran, and where."""
    la = {r["step"]: r["loss"] for r in a["step"]}
    lb = {r["step"]: r["loss"] for r in b["step"]}
    common = sorted(set(la) & set(lb))
    if not common:
        return {"max_abs": None, "at_step": None, "steps": 0}
    worst = max(common, key=lambda s: abs(la[s] - lb[s]))
    return {"max_abs": abs(la[worst] - lb[worst]), "at_step": worst, "steps": len(common)}


def divergences(runs: Dict[str, Dict[str, Any]], names: List[str]) -> Dict[str, Any]:
    """Between the first run of each backend, and between each backend's first two runs;
    where a run it needs is missing, why it cannot be made (``cannot``)."""
    first = {b: [n for n in names if runs[n]["backend"] == b] for b in BACKENDS}
    cannot = lambda why: {"max_abs": None, "at_step": None, "steps": 0, "cannot": why}  # noqa: E731
    absent = [b for b in BACKENDS if not first[b]]
    out = {"fbgemm vs triton": cannot(f"no finished run of {' or '.join(absent)}") if absent else
           divergence(runs[first["fbgemm"][0]], runs[first["triton"][0]])}  # fmt: skip
    for backend, own in first.items():
        out[f"{backend} run to run"] = (divergence(runs[own[0]], runs[own[1]]) if len(own) > 1 else
                                        cannot(f"{'only one' if own else 'no'} finished run of {backend}"))  # fmt: skip
    return out


def median_phases(runs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The median over a backend's runs of each phase's ms per step."""
    recorded = [r["phases"] for r in runs if r.get("phases")]
    if not recorded:
        return None
    out: Dict[str, Any] = {k: statistics.median(p[k] for p in recorded) for k in PHASE_ROWS if k in recorded[0]}
    out["timing"], out["runs"] = recorded[0].get("timing", "unknown"), len(recorded)
    return out


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
    def seconds(r: Dict[str, Any]) -> List[str]:
        t = r["time"]
        return [_cell(t["wall_s"], ".1f"), f"{_cell(t['steps_s'], '.1f')} ({_cell(t['warmup_s'], '.1f')})",
                _cell(t["other_s"], ".1f"), " / ".join(_cell(t[k], ".1f") for k in ("startup_s", "loop_outside_steps_s",
                                                                                      "end_s"))]  # fmt: skip

    rows = [[str(i + 1), r["backend"], str(r["throughput"]["steps_timed"]), _cell(r["throughput"]["mean_ms"]),
             f"{_cell(r['throughput']['p10_ms'])} / {_cell(r['throughput']['p50_ms'])} / "
             f"{_cell(r['throughput']['p90_ms'])}", _cell(r["throughput"]["examples_per_s"], ".0f"), *seconds(r)]
            for i, r in enumerate(per_run)]  # fmt: skip
    lines = ["## Throughput", "", f"Steps after the first {skip}; host step times, whose mean is the wall time per "
             "step.", ""]  # fmt: skip
    lines += [f"Each run's wall time (s, the subprocess's): `steps` sums all its host step times (in brackets the "
              f"first {skip}, warm-up and compilation), `wall - steps` is the rest; from when the app's records "
              "appeared in its metrics file, that rest splits into start-up (before its config record: launch, "
              "imports, process group, model, sharding), in loop outside the step times (evaluations during "
              "training, profiling, host syncs; up to the last step record) and end (final evaluation, exit).", ""]
    lines += _table(["run", "backend", "timed steps", "mean ms", "step ms p10 / p50 / p90", "examples/s", "wall s",
                     "steps s (warm-up)", "wall - steps s", "start-up / in loop / end s"], rows)  # fmt: skip
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
        t = summary["runs"][-1]["time"]
        print(f"{name}: {t['wall_s']:.0f} s (steps {_cell(t['steps_s'], '.1f')} s, start-up "
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
