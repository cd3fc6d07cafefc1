"""A/B of the training app: the same experiment under backend=fbgemm and backend=triton.

    python scripts/ab.py [--out DIR] [--nproc N] [--skip S] [-- hydra overrides...]

Runs ``pipelines.train`` under torchrun once per backend (same seed, same overrides, no
checkpoints), each writing its metrics file, then writes DIR/report.md with PNG plots:
loss curves overlaid and their largest divergence, step-time distribution, throughput,
time per phase (profiler: TBE forward, TBE backward, all-to-all, dense and the rest),
evaluation AUC and log loss. On a machine without CUDA it runs Triton's interpreter on
gloo (slow: keep the default tiny tables); on GPUs, one process per GPU.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BACKENDS = ("fbgemm", "triton")


def run_backend(backend: str, out: Path, nproc: int, overrides: List[str], cuda: bool) -> Path:
    """One training run; returns its metrics file. Its output goes to DIR/<backend>.log."""
    metrics = out / f"{backend}.jsonl"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pipelines.train", f"backend={backend}", f"logging.metrics_file={metrics}",
               "logging.progress_bar=false", "checkpoint=none", *overrides]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    with open(out / f"{backend}.log", "w") as log:
        done = subprocess.run(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (out / f"{backend}.log").read_text()[-3000:]
        raise SystemExit(f"backend={backend} failed (exit {done.returncode}); {out / (backend + '.log')} ends:\n{tail}")
    return metrics


def summarize(run: Dict[str, Any], skip: int) -> Dict[str, Any]:
    """Step-time distribution (steps after the first ``skip``, timed ones only) and throughput."""
    from tbe_plugin.benchmarks.common import summarize_ms

    ms = [r["step_ms"] for r in run["step"][skip:] if r["step_ms"] is not None]
    config = run.get("config", {})
    examples = config.get("batch_size", 0) * config.get("world_size", 1)
    if not ms:
        return {"steps_timed": 0, "p10": float("nan"), "p50": float("nan"), "p90": float("nan"),
                "examples_per_s": float("nan")}  # fmt: skip
    stats = summarize_ms(ms)
    return {"steps_timed": stats["n"], "p10": stats["p10_ms"], "p50": stats["median_ms"], "p90": stats["p90_ms"],
            "examples_per_s": examples / (stats["median_ms"] / 1e3)}  # fmt: skip


def divergence(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """The largest |loss_a - loss_b| over the steps both ran, and where."""
    la = {r["step"]: r["loss"] for r in a["step"]}
    lb = {r["step"]: r["loss"] for r in b["step"]}
    common = sorted(set(la) & set(lb))
    if not common:
        return {"max_abs": float("nan"), "at_step": None, "steps": 0}
    worst = max(common, key=lambda s: abs(la[s] - lb[s]))
    return {"max_abs": abs(la[worst] - lb[worst]), "at_step": worst, "steps": len(common)}


def plot(runs: Dict[str, Dict[str, Any]], out: Path, skip: int) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for (backend, run), style in zip(runs.items(), ("-", "--")):
        ax.plot([r["step"] for r in run["step"]], [r["loss"] for r in run["step"]], style, label=backend, alpha=0.8)
    ax.set(xlabel="step", ylabel="training loss", title="Loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    names.append("loss.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    data = [[r["step_ms"] for r in run["step"][skip:] if r["step_ms"] is not None] for run in runs.values()]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(runs) + 1), list(runs))
    ax.set(ylabel="ms per step", title=f"Step time (after {skip} warm-up steps)")
    fig.tight_layout()
    fig.savefig(out / "step_time.png", dpi=100)
    names.append("step_time.png")
    plt.close(fig)

    if all(run["eval"] for run in runs.values()):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for backend, run in runs.items():
            steps = [r["step"] for r in run["eval"]]
            axes[0].plot(steps, [r["auc"] for r in run["eval"]], marker="o", label=backend)
            axes[1].plot(steps, [r["log_loss"] for r in run["eval"]], marker="o", label=backend)
        axes[0].set(xlabel="step", ylabel="AUC", title="Evaluation AUC")
        axes[1].set(xlabel="step", ylabel="log loss", title="Evaluation log loss")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / "eval.png", dpi=100)
        names.append("eval.png")
        plt.close(fig)
    return names


def report(runs: Dict[str, Dict[str, Any]], out: Path, skip: int, overrides: List[str]) -> str:
    summaries = {b: summarize(r, skip) for b, r in runs.items()}
    div = divergence(runs["fbgemm"], runs["triton"])
    images = plot(runs, out, skip)
    config = runs["triton"].get("config", {})
    lines = ["# A/B: backend=fbgemm vs backend=triton", "",
             f"Device: {config.get('device')}; world size {config.get('world_size')}; batch {config.get('batch_size')} "
             f"per rank; staleness {config.get('staleness')}; {config.get('steps')} steps. "
             f"Overrides: `{' '.join(overrides) or '(none)'}`.", "",
             "## Throughput", "",
             "| backend | timed steps | step ms p10 | p50 | p90 | examples/s (p50) |", "|---|---|---|---|---|---|"]
    for backend, s in summaries.items():
        lines.append(f"| {backend} | {s['steps_timed']} | {s['p10']:.2f} | {s['p50']:.2f} | {s['p90']:.2f} | "
                     f"{s['examples_per_s']:.0f} |")
    ratio = summaries["triton"]["examples_per_s"] / summaries["fbgemm"]["examples_per_s"]
    lines += ["", f"triton / fbgemm throughput: **{ratio:.3f}**", ""]
    if config.get("device") != "cuda":
        lines += ["On CPU, Triton's kernels run in its interpreter: these times say nothing about the kernels' "
                  "speed; the run checks that both backends train alike.", ""]
    phases = {b: r.get("phases") for b, r in runs.items()}
    if all(phases.values()):
        keys = ["tbe_forward", "tbe_backward", "all_to_all", "dense_and_other", "step_ms"]
        unit = "device ms per batch" if config.get("device") == "cuda" else "host ms per batch"
        lines += ["## Time per phase (profiler)", "", f"{unit}; from the profiled steps.", "",
                  "| backend | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]  # fmt: skip
        for backend, p in phases.items():
            lines.append(f"| {backend} | " + " | ".join(f"{p[k]:.2f}" for k in keys) + " |")
        lines.append("")
    lines += ["## Quality", "", "| backend | first loss | last loss (mean of 10) | AUC | log loss |",
              "|---|---|---|---|---|"]  # fmt: skip
    for backend, run in runs.items():
        final = run.get("final", {})
        cells = [f"{final.get(k, float('nan')):.5f}" for k in ("first_loss", "last_loss", "auc", "log_loss")]
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    lines += ["", f"Largest training-loss divergence over {div['steps']} steps: **{div['max_abs']:.3g}** "
              f"(step {div['at_step']}).", ""]
    lines += [f"![{name[:-4]}]({name})" for name in images]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"throughput": summaries, "ratio": ratio, "divergence": div,
                                                  "phases": phases}, indent=1))  # fmt: skip
    return text


def main(argv: List[str] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="ab-report")
    parser.add_argument("--nproc", type=int, default=None, help="processes (default: GPUs, else 2)")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the step times")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 2)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    overrides = [f"logging.profile_steps={args.profile_steps}", f"logging.profile_after={args.skip}",
                 "logging.tensorboard=true", *args.overrides]
    from pipelines.metrics import read_metrics

    runs = {
        b: read_metrics(str(run_backend(b, out, nproc, [*overrides, f"logging.tensorboard_dir=tensorboard/{b}"], cuda)))
        for b in BACKENDS
    }
    text = report(runs, out, args.skip, args.overrides)
    print(text)
    return runs


if __name__ == "__main__":
    main()
