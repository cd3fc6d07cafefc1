"""A/B of the training app: the same experiment under backend=fbgemm and backend=triton.

    python scripts/ab.py [--out DIR] [--nproc N] [--repeats R] [--skip S] [--profile-steps P] [-- overrides...]

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
- loss curves: the largest divergence between backends and between runs of one backend.

On a machine without CUDA it runs Triton's interpreter on gloo (slow: keep the default
tiny tables); on GPUs, one process per GPU.
"""

import argparse
import json
import os
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


def run_order(repeats: int) -> List[str]:
    """Backends in the order they run: A B B A A B ..., so that drift (clocks, heat, other
    load) hits both alike."""
    if repeats < 2:
        raise ValueError(f"repeats: each backend runs at least twice (for its noise), got {repeats}")
    order: List[str] = []
    for r in range(repeats):
        order += list(BACKENDS if r % 2 == 0 else reversed(BACKENDS))
    return order


def run_training(name: str, backend: str, out: Path, nproc: int, overrides: List[str], cuda: bool) -> Path:
    """One training run in DIR/<name>/; returns its metrics file (its output: train.log)."""
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pipelines.app.train", f"backend={backend}", f"logging.metrics_file={metrics}",
               "logging.progress_bar=false", "checkpoint=none", f"logging.tensorboard_dir={run_dir / 'tensorboard'}",
               *overrides]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    with open(run_dir / "train.log", "w") as log:
        done = subprocess.run(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (run_dir / "train.log").read_text()[-3000:]
        raise SystemExit(f"{name} failed (exit {done.returncode}); {run_dir / 'train.log'} ends:\n{tail}")
    return metrics


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


def compare_backends(per_run: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per backend the median examples/s over its runs and their range; the ratio
    triton / fbgemm; the noise: the larger relative range of one backend's runs."""
    backends: Dict[str, Any] = {}
    for backend in BACKENDS:
        rates = [r["throughput"]["examples_per_s"] for r in per_run if r["backend"] == backend]
        rates = [x for x in rates if x is not None]
        if not rates:
            return {"backends": backends, "ratio": None, "noise": None, "inside_noise": None}
        median = statistics.median(rates)
        backends[backend] = {"runs": len(rates), "median_examples_per_s": median, "min": min(rates), "max": max(rates),
                             "relative_range": (max(rates) - min(rates)) / median}  # fmt: skip
    ratio = backends["triton"]["median_examples_per_s"] / backends["fbgemm"]["median_examples_per_s"]
    noise = max(b["relative_range"] for b in backends.values())
    return {"backends": backends, "ratio": ratio, "noise": noise, "inside_noise": abs(ratio - 1) <= noise}


def noise_sentence(comparison: Dict[str, Any]) -> str:
    ratio, noise = comparison["ratio"], comparison["noise"]
    if ratio is None:
        return "No timed steps: no throughput to compare."
    difference = f"{abs(ratio - 1):.1%}"
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
    """Between the first run of each backend, and between each backend's first two runs."""
    first = {b: [n for n in names if runs[n]["backend"] == b] for b in BACKENDS}
    out = {"fbgemm vs triton": divergence(runs[first["fbgemm"][0]], runs[first["triton"][0]])}
    for backend, own in first.items():
        out[f"{backend} run to run"] = divergence(runs[own[0]], runs[own[1]])
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


def _table(headers: List[str], rows: List[List[str]]) -> List[str]:
    from tbe_plugin.benchmarks.common import markdown_table

    return [markdown_table(headers, rows), ""]


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
    rows = [[str(i + 1), r["backend"], str(r["throughput"]["steps_timed"]), _cell(r["throughput"]["mean_ms"]),
             f"{_cell(r['throughput']['p10_ms'])} / {_cell(r['throughput']['p50_ms'])} / "
             f"{_cell(r['throughput']['p90_ms'])}", _cell(r["throughput"]["examples_per_s"], ".0f")]
            for i, r in enumerate(per_run)]  # fmt: skip
    lines = ["## Throughput", "", f"Steps after the first {skip}; host step times, whose mean is the wall time per "
             "step.", ""]  # fmt: skip
    lines += _table(["run", "backend", "timed steps", "mean ms", "step ms p10 / p50 / p90", "examples/s"], rows)
    per_backend = [[b, str(s["runs"]), _cell(s["median_examples_per_s"], ".0f"),
                    f"{_cell(s['min'], '.0f')} - {_cell(s['max'], '.0f')}", f"{s['relative_range']:.1%}"]
                   for b, s in comparison["backends"].items()]  # fmt: skip
    lines += _table(["backend", "runs", "examples/s (median of runs)", "range of runs", "range / median"], per_backend)
    if comparison["ratio"] is not None:
        lines += [f"triton / fbgemm throughput: **{comparison['ratio']:.3f}**. {noise_sentence(comparison)}", ""]
    if not cuda:
        lines += ["On CPU, Triton's kernels run in its interpreter: these times say nothing about the kernels' "
                  "speed; the runs check that both backends train alike.", ""]
    return lines


def phase_lines(phases: Dict[str, Optional[Dict[str, Any]]]) -> List[str]:
    if not all(phases.values()):
        return []
    timing = {p["timing"] for p in phases.values()}
    rows = [[key] + [_cell(phases[b].get(key), ".3f") for b in BACKENDS] for key in PHASE_ROWS]
    return ["## Time per phase", "", f"ms per step, measured: {' / '.join(sorted(timing))} per phase (each "
            "kernel or op credited to the phase op enclosing it), median over the runs' profiled steps. `total_ms` "
            "sums the phases (streams overlap, so on a GPU it may exceed the step); `step_ms` is the host's median "
            "step time.", ""] + _table(["phase"] + list(BACKENDS), rows)  # fmt: skip


def quality_lines(per_run: List[Dict[str, Any]]) -> List[str]:
    rows = [[str(i + 1), r["backend"]] + [_cell(r["final"].get(k), ".5f") for k in ("first_loss", "last_loss")] +
            [_cell(r["final"].get(k), ".4f") for k in QUALITY_KEYS] for i, r in enumerate(per_run)]  # fmt: skip
    lines = ["## Quality against the optimum", "", "Held-out evaluation at the end. `optimal_*`: the planted click "
             "log's Bayes-optimal predictor on the same examples (n/a on other data); `auc_gap` = optimal AUC - AUC, "
             "`excess_log_loss` = log loss - optimal log loss.", ""]  # fmt: skip
    return lines + _table(["run", "backend", "first loss", "last loss (mean of 10)", *QUALITY_KEYS], rows)


def divergence_lines(div: Dict[str, Any]) -> List[str]:
    rows = [[k, _cell(d["max_abs"], ".3g"), str(d["at_step"]), str(d["steps"])] for k, d in div.items()]
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
           command: str) -> Dict[str, Any]:  # fmt: skip
    """Writes DIR/report.md and DIR/summary.json from the runs' metrics; returns the summary."""
    names = list(runs)
    cuda = env["device"].startswith("cuda")
    per_run = [{"name": n, "backend": runs[n]["backend"], "throughput": throughput(runs[n], skip),
                "final": runs[n].get("final", {}), "phases": runs[n].get("phases"),
                "run_commit": runs[n].get("config", {}).get("git_commit")} for n in names]  # fmt: skip
    comparison = compare_backends(per_run)
    phases = {b: median_phases([runs[n] for n in names if runs[n]["backend"] == b]) for b in BACKENDS}
    div = divergences(runs, names)
    lines = header_lines(env, command, runs[names[0]].get("config", {}), overrides)
    lines += throughput_lines(per_run, comparison, skip, cuda) + phase_lines(phases)
    lines += quality_lines(per_run) + divergence_lines(div)
    lines += [f"![{name[:-4]}]({name})" for name in plot(runs, out, skip)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    summary = {"provenance": {"commit": env["git_commit"], "dirty": env["git_dirty"],
                              "changed_files": env.get("git_changed", []), "command": command},
               "environment": env, "order": names, "runs": per_run, "comparison": comparison,
               "noise_sentence": noise_sentence(comparison), "phases": phases, "divergence": div}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="ab-report")
    parser.add_argument("--nproc", type=int, default=None, help="processes (default: GPUs, else 2)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per backend, interleaved A B B A (>= 2)")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the step times")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    order = run_order(args.repeats)
    import torch

    from pipelines.metrics import read_metrics

    cuda = torch.cuda.is_available()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 2)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = environment(cuda)  # before the runs: the tree they ran from
    command = shlex.join([os.path.basename(sys.executable), "scripts/ab.py", *argv])
    overrides = [f"logging.profile_steps={args.profile_steps}", f"logging.profile_after={args.skip}",
                 "logging.tensorboard=true", *args.overrides]  # fmt: skip
    runs: Dict[str, Dict[str, Any]] = {}
    for i, backend in enumerate(order):
        name = f"run{i + 1}_{backend}"
        began = time.perf_counter()
        runs[name] = read_metrics(str(run_training(name, backend, out, nproc, overrides, cuda)))
        runs[name]["backend"] = backend
        print(f"{name}: {time.perf_counter() - began:.0f} s", flush=True)
    summary = report(runs, out, args.skip, args.overrides, env, command)
    print((out / "report.md").read_text())
    return summary


if __name__ == "__main__":
    main()
