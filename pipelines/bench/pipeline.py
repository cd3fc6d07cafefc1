"""Step time of the training pipelines on a DLRM: ``python -m pipelines.bench.pipeline`` (one
process per GPU under torchrun; world size 1 without it).

For each model balance (sparse-heavy, balanced, dense-heavy) and backend (fbgemm,
triton) it times, in one process on the same batches:

- ``plain``: a loop of forward, backward, optimizer step;
- ``sparsedist`` / ``semisync``: TorchRec's ``TrainPipelineSparseDist`` and
  ``TrainPipelineSemiSync`` (one step stale, ``start_batch=0``);
- ``stale0`` / ``stale1`` / ``stale2``: ours (``StalenessTrainPipeline``); ``stale1@66`` adds
  ``tbe_max_sms=66`` (any k and count);
- ``sparse_only``: host-to-device copy, sharded lookup and its backward with a fixed
  gradient; ``dense_only``: the model's step with the lookup replaced by a fixed tensor;
  so that ``max(sparse_only, dense_only)`` is the bound a perfect overlap reaches;
- ``concurrent``: the two of them on two streams with no dependency between them (two
  models): how much this GPU overlaps them at all, the ceiling of any pipeline's overlap.

Every timed mode builds its model afresh with the same weights (seeded per table shard on
the device), so the losses of modes with the same semantics can be compared: ``stale0``
against ``plain``, ``stale1`` against ``semisync``; their largest difference is reported.
Step time: wall time of ``--steps`` steps after ``--warmup`` steps, CUDA-synchronized at
both ends, so that a pipeline's overlap across steps counts. ``--trace`` adds a
profiler summary of ``stale1`` and ``sparsedist`` on the balanced model: per CUDA stream
the busy time, and the time two or more streams were busy at once.
"""

import argparse
import gc
import dataclasses
import inspect
import itertools
import json
import logging
import os
import shlex
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from pipelines.app.config import DataConfig, ModelConfig, OptimizerConfig, ShardingConfig, TablesConfig, TrainConfig
from pipelines.app.model import init_tables
from pipelines.bench.timeline import JOIN, segments
from tbe_plugin.benchmarks.compiles import compiles
from tbe_plugin.benchmarks.report import git_state

# Per balance: tables, pooling factor, dense MLP and over MLP. The costs they aim at
# (H200, B=8192, fp32): sparse-heavy ~ lookup-bound, balanced ~ lookup ~ MLPs, dense-heavy
# ~ MLP-bound; the benchmark measures what they are.
BALANCES: Dict[str, Dict[str, Any]] = {
    "sparse_heavy": dict(num_tables=26, pooling_factor=60, dense=[512, 256, 128], over=[512, 256, 1]),
    "balanced": dict(num_tables=26, pooling_factor=20, dense=[512, 256, 128], over=[1024, 1024, 512, 256, 1]),
    "dense_heavy": dict(num_tables=8, pooling_factor=8, dense=[1024, 512, 128], over=[2048, 2048, 2048, 1]),
}
MODES = ("plain", "plain2", "sparsedist", "semisync", "stale0", "stale1", "stale2", "sparse_only", "dense_only",
         "concurrent")
# Pairs whose losses should agree; plain2 (the plain loop again) shows the run-to-run noise floor.
SAME_SEMANTICS = {"plain2": "plain", "stale0": "plain", "stale1": "semisync"}


def make_config(
    balance: str, backend: str, batch_size: int, rows: int, dim: int, zipf: float, sharding: str = "table_wise"
) -> TrainConfig:
    """The balance's DLRM over tables alike (``dlrm_config``)."""
    b = BALANCES[balance]
    tables = TablesConfig(num_tables=b["num_tables"], rows=rows, dim=dim, pooling_factor=b["pooling_factor"],
                          zipf_alpha=zipf)  # fmt: skip
    return dlrm_config(tables, b["dense"], b["over"], backend, batch_size, sharding)


def dlrm_config(
    tables: TablesConfig, dense: List[int], over: List[int], backend: str, batch_size: int, sharding: str = "table_wise"
) -> TrainConfig:
    """A DLRM over ``tables`` whose bottom MLP ``dense`` ends in the tables' dim, fused rowwise
    Adagrad and dense Adagrad; every table limited to ``sharding`` (empty: the planner's
    choice, which reads free GPU memory and may change from one build to the next)."""
    return TrainConfig(
        sharding=ShardingConfig(sharding_types=[t for t in sharding.split(",") if t]),
        model=ModelConfig(name="dlrm", dense_in_features=13, dense_arch_layer_sizes=[*dense[:-1], tables.dim],
                          over_arch_layer_sizes=list(over)),
        tables=tables,
        data=DataConfig(batch_size=batch_size, seed=0),
        optimizer=OptimizerConfig(sparse="EXACT_ROWWISE_ADAGRAD", sparse_lr=0.01, dense="adagrad", dense_lr=1e-3),
        backend=dataclasses.replace(TrainConfig().backend, name=backend),
    )  # fmt: skip


def device_init(dmp, seed: int, bounds: List[float]) -> None:
    """The app's ``init_tables`` in blocks of 65536 rows (fewer generators for big tables):
    the same weights whatever the backend and the plan (the planner may shard differently
    from one build to the next), drawn on the shards' device."""
    init_tables(dmp, seed, bounds, block_rows=65536)


def plan_summary(dmp) -> Dict[str, int]:
    """How many tables each (sharding type, kernel) holds."""
    counts: Dict[str, int] = {}
    for module_plan in dmp.plan.plan.values():
        for sharding in module_plan.values():
            key = f"{sharding.sharding_type}/{sharding.compute_kernel}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def make_batches(cfg: TrainConfig, rank: int, distinct: int) -> List[Any]:
    """``distinct`` synthetic batches for this rank, in pinned host memory (on CUDA machines)."""
    from pipelines.app.data import SyntheticClickLog

    log = SyntheticClickLog(cfg.tables, cfg.data, cfg.model.dense_in_features, rank, distinct)
    return [batch.pin_memory() if torch.cuda.is_available() else batch for batch in log]


def _kwargs_known(cls: Any, **kwargs: Any) -> Dict[str, Any]:
    """The keyword arguments ``cls`` takes in this TorchRec version (1.6.1 and 1.8.0 differ)."""
    known = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in kwargs.items() if k in known}


def make_pipeline(mode: str, dmp, optimizer, device: torch.device):
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync, TrainPipelineSparseDist

    from pipelines.staleness import StalenessTrainPipeline

    if mode == "sparsedist":
        return TrainPipelineSparseDist(dmp, optimizer, device, **_kwargs_known(TrainPipelineSparseDist,
                                                                               execute_all_batches=True))
    if mode == "semisync":
        return TrainPipelineSemiSync(dmp, optimizer, device, **_kwargs_known(
            TrainPipelineSemiSync, execute_all_batches=True, start_batch=0, stash_gradients=False))
    staleness, _, sms = mode[len("stale"):].partition("@")  # "stale1@66": k = 1, tbe_max_sms = 66
    return StalenessTrainPipeline(dmp, optimizer, device, staleness=int(staleness),
                                  tbe_max_sms=int(sms) if sms else None)  # fmt: skip


class PlainLoop:
    """forward, backward, step: the baseline (and the pipelines' interface)."""

    def __init__(self, dmp, optimizer, device: torch.device) -> None:
        self.dmp, self.optimizer, self.device = dmp, optimizer, device

    def progress(self, iterator: Iterator[Any]) -> Any:
        batch = next(iterator).to(self.device, non_blocking=True)
        self.optimizer.zero_grad()
        loss, output = self.dmp(batch)
        loss.backward()
        self.optimizer.step()
        return output


def _dlrm(dmp):
    return dmp.module.model  # DMP -> DLRMTrain -> DLRM


class SparseOnly:
    """The sparse unit alone: copy, input all-to-all, lookup, output all-to-all, and the
    backward (fused update) with a fixed output gradient."""

    def __init__(self, dmp, optimizer, device: torch.device) -> None:
        self.ebc, self.device, self.grad = _dlrm(dmp).sparse_arch.embedding_bag_collection, device, None

    def progress(self, iterator: Iterator[Any]) -> Any:
        batch = next(iterator).to(self.device, non_blocking=True)
        values = self.ebc(batch.sparse_features).wait().values()
        if self.grad is None:
            self.grad = torch.full_like(values, 1e-3)
        values.backward(self.grad)
        return (values.detach().sum(),)


class DenseOnly(PlainLoop):
    """The dense unit alone: the model's step with the sparse arch returning a fixed tensor."""

    def __init__(self, dmp, optimizer, device: torch.device) -> None:
        super().__init__(dmp, optimizer, device)
        sparse_arch = _dlrm(dmp).sparse_arch
        self.fixed: Optional[torch.Tensor] = None
        sparse_arch.forward = self._fixed_embeddings
        self.shape = (sparse_arch.F, sparse_arch.D)

    def _fixed_embeddings(self, features: Any) -> torch.Tensor:
        if self.fixed is None:
            self.fixed = torch.rand(features.stride(), *self.shape, device=self.device) * 1e-2
        return self.fixed


class Concurrent:
    """A sparse unit (``SparseOnly``) and a dense unit (``DenseOnly``, another model) of each
    batch, each on its own stream, neither waiting for the other: the dense step is
    launched first, then the lookups; the step ends when both have."""

    def __init__(self, sparse: SparseOnly, dense: DenseOnly, device: torch.device) -> None:
        self.sparse, self.dense, self.device = sparse, dense, device
        self.streams = [torch.cuda.Stream(device), torch.cuda.Stream(device)] if device.type == "cuda" else []

    def progress(self, iterator: Iterator[Any]) -> Any:
        batch = next(iterator)
        if not self.streams:
            self.sparse.progress(iter([batch]))
            return self.dense.progress(iter([batch]))
        current = torch.cuda.current_stream(self.device)
        dense_stream, sparse_stream = self.streams
        for stream in self.streams:
            stream.wait_stream(current)
        with torch.cuda.stream(dense_stream):
            output = self.dense.progress(iter([batch]))
        with torch.cuda.stream(sparse_stream):
            self.sparse.progress(iter([batch]))
        for stream in self.streams:
            current.wait_stream(stream)
        return output


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mark(device: torch.device) -> Any:
    """A point between steps: a CUDA event on the current stream (no sync), or the host's
    clock on CPU, where every step runs synchronously."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _elapsed_ms(start: Any, end: Any) -> float:
    return start.elapsed_time(end) if isinstance(start, torch.cuda.Event) else 1e3 * (end - start)


def time_mode(
    runner, batches: List[Any], warmup: int, steps: int, device: torch.device, windows: int = 1
) -> Dict[str, Any]:
    """Wall time of ``steps`` progress calls after ``warmup``, in ``windows`` windows each
    synchronized at both ends (so a pipeline's overlap across steps counts inside them);
    every step's time between marks; the host's time in every call (``host_ms``: from its
    start to its return; a step whose host time nears its step time is host-bound, and
    host stalls show in it); the losses of all calls; the Triton kernels compiled or loaded
    during the timed steps (``compiles_timed``: each stalls its step)."""
    iterator = itertools.cycle(batches)
    losses = []
    for _ in range(warmup):
        losses.append(runner.progress(iterator)[0])
    if not 1 <= windows <= steps:
        raise ValueError(f"windows must be in 1..steps ({steps}), got {windows}")
    counts = [steps // windows + (w < steps % windows) for w in range(windows)]
    window_ms, step_ms, host_ms = [], [], []
    with compiles() as compiled:
        for count in counts:
            _synchronize(device)
            start, marks = time.perf_counter(), []
            for _ in range(count):
                marks.append(_mark(device))
                called = time.perf_counter()
                losses.append(runner.progress(iterator)[0])
                host_ms.append(round(1e3 * (time.perf_counter() - called), 3))
            marks.append(_mark(device))
            _synchronize(device)
            window_ms.append(1e3 * (time.perf_counter() - start) / count)
            step_ms += [round(_elapsed_ms(a, b), 3) for a, b in zip(marks, marks[1:])]
    if hasattr(runner, "drain"):
        runner.drain()
    return {"ms": sum(ms * n for ms, n in zip(window_ms, counts)) / steps, "window_ms": window_ms,
            "losses": [float(x) for x in torch.stack(losses).float().cpu()], "step_ms": step_ms,
            "host_ms": host_ms, "compiles_timed": compiled}  # fmt: skip


def stream_summary(trace_path: str) -> Dict[str, Any]:
    """From a Chrome trace: per CUDA stream the busy time (union of its kernels and copies),
    the time two or more streams were busy at once, and the window, all in ms
    (``timeline.segments``, streams as the groups)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    intervals = [(e["ts"], e["ts"] + e["dur"], str(e.get("args", {}).get("stream", e.get("tid"))))
                 for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    found, window = segments(intervals)
    streams = {stream for _, _, stream in intervals}
    busy = {s: sum(us for key, us in found.items() if s in key.split(JOIN)) / 1e3 for s in streams}
    overlap = sum(us for key, us in found.items() if JOIN in key)
    return {"busy_ms_per_stream": busy, "overlap_ms": overlap / 1e3, "window_ms": window / 1e3}


def profile_steps(runner, batches: List[Any], steps: int, device: torch.device, warmup: int = 3):
    """The profiler over ``steps`` progress calls, after ``warmup`` that fill the pipeline
    again (CPU ops; and CUDA kernels on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    iterator = itertools.cycle(batches)
    for _ in range(warmup):
        runner.progress(iterator)
    _synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            runner.progress(iterator)
        _synchronize(device)
    return prof


def trace_mode(runner, batches: List[Any], steps: int, device: torch.device, path: str, keep: bool) -> Dict[str, Any]:
    profile_steps(runner, batches, steps, device).export_chrome_trace(path)
    summary = stream_summary(path)
    if not keep:
        os.remove(path)
    summary["steps"] = steps
    return summary


def release_memory() -> None:
    """Frees what the last model held: the pipelines' rewritten forwards hold it in cycles."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


RUNNERS: Dict[str, Callable[..., Any]] = {"plain": PlainLoop, "plain2": PlainLoop, "sparse_only": SparseOnly,
                                          "dense_only": DenseOnly}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import torch.distributed as dist

    from pipelines.app.model import build_model
    from tbe_plugin.torchrec.process_group import init_process_group

    rank, world_size, device = init_process_group()
    environment = versions(device)
    results: Dict[str, Any] = {"world_size": world_size, "batch_size_per_rank": args.batch_size, "rows": args.rows,
                               "dim": args.dim, "zipf": args.zipf, "steps": args.steps, "warmup": args.warmup,
                               "versions": environment, "runs": {},
                               "provenance": provenance(environment, ["-m", "pipelines.bench.pipeline", *args.argv])}  # fmt: skip
    try:
        for balance in args.balances.split(","):
            batches = None
            for backend in args.backends.split(","):
                cfg = make_config(balance, backend, args.batch_size, args.rows * world_size, args.dim, args.zipf,
                                  args.sharding)  # fmt: skip
                if batches is None:
                    batches = make_batches(cfg, rank, args.distinct_batches)
                torch.manual_seed(cfg.data.seed)  # one-time costs (kernel compiles) before any timing
                dmp, optimizer = build_model(cfg, device, world_size, init=device_init)
                results.setdefault("plans", {})[f"{balance}/{backend}"] = plan_summary(dmp)
                warm = time_mode(PlainLoop(dmp, optimizer, device), batches, args.warmup, args.steps, device)
                results.setdefault("warmup_runs", {})[f"{balance}/{backend}"] = {"ms": warm["ms"],
                                                                                  "step_ms": warm["step_ms"]}
                del dmp, optimizer
                release_memory()
                for mode in args.modes.split(","):
                    torch.manual_seed(cfg.data.seed)  # the same dense weights for every mode
                    dmp, optimizer = build_model(cfg, device, world_size, init=device_init)
                    if mode == "concurrent":
                        runner = Concurrent(SparseOnly(*build_model(cfg, device, world_size, init=device_init), device),
                                            DenseOnly(dmp, optimizer, device), device)  # fmt: skip
                    elif mode in RUNNERS:
                        runner = RUNNERS[mode](dmp, optimizer, device)
                    else:
                        runner = make_pipeline(mode, dmp, optimizer, device)
                    key = f"{balance}/{backend}/{mode}"
                    results["runs"][key] = time_mode(runner, batches, args.warmup, args.steps, device)
                    results["runs"][key]["plan"] = plan_summary(dmp)
                    if args.trace and balance == "balanced" and mode in ("stale1", "sparsedist"):
                        path = os.path.join(args.out, f"trace_{backend}_{mode}_rank{rank}.json")
                        runner = make_pipeline(mode, *build_model(cfg, device, world_size, init=device_init), device)
                        results["runs"][key]["trace"] = trace_mode(runner, batches, 5, device, path, args.keep_traces)
                    if rank == 0:
                        print(f"{key}: {results['runs'][key]['ms']:.3f} ms/step", flush=True)
                    del dmp, optimizer, runner
                    release_memory()
        results["examples_per_step"] = args.batch_size * world_size
        if rank == 0:
            summarize(results)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"pipeline_ws{world_size}.json"), "w") as f:
                json.dump(results, f, indent=1)
            with open(os.path.join(args.out, f"pipeline_ws{world_size}.md"), "w") as f:
                f.write(report(results))
            print(report(results), flush=True)
    finally:
        dist.destroy_process_group()
    return results


def provenance(environment: Dict[str, Any], argv: List[str]) -> Dict[str, Any]:
    """The commit measured and whether the tree differed from it (``git_state``, in
    ``versions``: on the device, where the tree has no repository, ``TBE_PLUGIN_COMMIT`` and
    ``TBE_PLUGIN_DIRTY`` as the caller set them from its checkout), and the command line."""
    return {"commit": environment.get("git_commit", "unknown"), "dirty": environment.get("git_dirty"),
            "changed_files": environment.get("git_changed", []),
            "command": shlex.join([os.path.basename(sys.executable), *argv])}  # fmt: skip


def commit_line(measured: Dict[str, Any]) -> str:
    dirty = {True: " (dirty tree)", False: ""}.get(measured["dirty"], " (tree state unknown)")
    return f"Commit {measured['commit']}{dirty}."


def versions(device: torch.device) -> Dict[str, str]:
    """The benchmarks' environment record, with TorchRec's version."""
    from tbe_plugin.benchmarks.common import collect_environment
    from tbe_plugin.torchrec._compat import TORCHREC_VERSION

    return {**collect_environment(device), "torchrec": TORCHREC_VERSION}


def summarize(results: Dict[str, Any]) -> None:
    """Adds to each (balance, backend): max(sparse_only, dense_only), ratios and the
    largest loss difference between modes of the same semantics."""
    groups: Dict[str, Dict[str, Any]] = {}
    for key, r in results["runs"].items():
        balance, backend, mode = key.split("/")
        groups.setdefault(f"{balance}/{backend}", {})[mode] = r
    summary = {}
    for group, runs in groups.items():
        s: Dict[str, Any] = {}
        if "sparse_only" in runs and "dense_only" in runs:
            s["bound_ms"] = max(runs["sparse_only"]["ms"], runs["dense_only"]["ms"])
            if "stale1" in runs:
                s["stale1_over_bound"] = runs["stale1"]["ms"] / s["bound_ms"]
            if "concurrent" in runs:  # 1: no overlap at all; bound / sum: perfect overlap
                s["concurrent_over_sum"] = runs["concurrent"]["ms"] / (runs["sparse_only"]["ms"] +
                                                                       runs["dense_only"]["ms"])  # fmt: skip
        if "sparsedist" in runs and "stale1" in runs:
            s["sparsedist_over_stale1"] = runs["sparsedist"]["ms"] / runs["stale1"]["ms"]
        for mode, same in SAME_SEMANTICS.items():
            if mode in runs and same in runs:
                a, b = runs[mode]["losses"], runs[same]["losses"]
                s[f"loss_diff_{mode}_vs_{same}"] = max(abs(x - y) for x, y in zip(a, b))
        summary[group] = s
    results["summary"] = summary


def report(results: Dict[str, Any]) -> str:
    v = results["versions"]
    ran = {k.rsplit("/", 1)[1] for k in results["runs"]}
    modes = [m for m in MODES if m in ran] + sorted(ran - set(MODES))
    lines = [f"# Pipeline step time, world size {results['world_size']}", "",
             f"{v.get('device_name', v.get('device'))}; torch {v.get('torch')}, triton {v.get('triton')}, "
             f"torchrec {v.get('torchrec')}, fbgemm_gpu {v.get('fbgemm_gpu')}. DLRM, "
             f"B={results['batch_size_per_rank']} per rank, {results['rows']} rows per table per rank, "
             f"D={results['dim']}, Zipf({results['zipf']}) ids, fp32, "
             f"rowwise Adagrad (fused) + dense Adagrad; ms per step = wall time of {results['steps']} steps after "
             f"{results['warmup']}, synchronized at both ends. {commit_line(results['provenance'])}", "",
             "| balance | backend | " + " | ".join(modes) + " | max(sparse, dense) | stale1 / bound | "
             "sparsedist / stale1 | concurrent / (sparse + dense) | examples/s stale1 |",
             "|---" * (len(modes) + 7) + "|"]  # fmt: skip
    groups = sorted({k.rsplit("/", 1)[0] for k in results["runs"]})
    for group in groups:
        runs = {m: results["runs"].get(f"{group}/{m}") for m in modes}
        s = results["summary"].get(group, {})
        cells = [f"{runs[m]['ms']:.2f}" if runs[m] else "" for m in modes]
        rate = results["examples_per_step"] / runs["stale1"]["ms"] * 1e3 if runs.get("stale1") else None
        lines.append("| " + " | ".join(group.split("/")) + " | " + " | ".join(cells) +
                     f" | {s.get('bound_ms', float('nan')):.2f} | {s.get('stale1_over_bound', float('nan')):.2f} | "
                     f"{s.get('sparsedist_over_stale1', float('nan')):.2f} | "
                     f"{s.get('concurrent_over_sum', float('nan')):.2f} | {rate or float('nan'):.0f} |")  # fmt: skip
    lines += ["", "Plans: " + "; ".join(f"{k}: {v}" for k, v in results.get("plans", {}).items())]
    differing = sorted(k for k, r in results["runs"].items()
                       if "plan" in r and r["plan"] != results.get("plans", {}).get(k.rsplit("/", 1)[0]))  # fmt: skip
    if differing:
        lines += ["", f"Runs whose plan differs from their model's first: {differing}"]
    lines += ["", "Loss agreement, largest difference over all steps (same semantics, same weights and batches; "
              "plain2 vs plain is the run-to-run noise floor):", ""]
    for group in groups:
        diffs = {k: f"{v:.2e}" for k, v in results["summary"].get(group, {}).items() if k.startswith("loss_diff")}
        lines.append(f"- {group}: {diffs}")
    traces = {k: r["trace"] for k, r in results["runs"].items() if "trace" in r}
    if traces:
        lines += ["", "Profiler, 5 steps: busy ms per CUDA stream, ms with 2+ streams busy, window ms:", ""]
        for k, t in traces.items():
            busy = ", ".join(f"{s}: {ms:.1f}" for s, ms in sorted(t["busy_ms_per_stream"].items()))
            lines.append(f"- {k}: busy {{{busy}}}; overlap {t['overlap_ms']:.1f}; window {t['window_ms']:.1f}")
    return "\n".join(lines) + "\n"


def scaling_report(paths: List[str]) -> str:
    """Weak scaling from result files of several world sizes (same balances, modes and
    per-rank sizes): examples/s per (balance, backend, mode) and the efficiency of each
    world size against the smallest, ``rate_N / (rate_1 * N / 1)``."""
    loaded = []
    for path in paths:
        with open(path) as f:
            loaded.append((path, json.load(f)))
    loaded.sort(key=lambda item: item[1]["world_size"])
    results = [r for _, r in loaded]
    base = results[0]
    sizes = [r["world_size"] for r in results]
    measured = "; ".join(f"world size {r['world_size']}: {os.path.basename(path)}, "
                         + (commit_line(r["provenance"]) if "provenance" in r else "commit not recorded.")
                         for path, r in loaded)  # fmt: skip
    lines = ["# Weak scaling", "", f"Per rank: B={base['batch_size_per_rank']}, {base['rows']} rows per table; "
             "examples/s = B x world size / step time; efficiency against world size "
             f"{sizes[0]}. From {measured} Report: {commit_line(provenance(git_state(), []))}", "",
             "| balance/backend/mode | " + " | ".join(f"ws{n} examples/s" for n in sizes) + " | " +
             " | ".join(f"ws{n} efficiency" for n in sizes[1:]) + " |",
             "|---" * (1 + len(sizes) + len(sizes) - 1) + "|"]  # fmt: skip
    for key in sorted(base["runs"]):
        if not all(key in r["runs"] for r in results):
            continue
        rates = [r["batch_size_per_rank"] * r["world_size"] / r["runs"][key]["ms"] * 1e3 for r in results]
        efficiency = [rate / (rates[0] * n / sizes[0]) for rate, n in zip(rates[1:], sizes[1:])]
        lines.append(f"| {key} | " + " | ".join(f"{x:.0f}" for x in rates) + " | " +
                     " | ".join(f"{e:.2f}" for e in efficiency) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipelines.bench.pipeline", description=__doc__.split("\n")[0])
    parser.add_argument("--balances", default=",".join(BALANCES))
    parser.add_argument("--backends", default="fbgemm,triton")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--batch-size", type=int, default=32768,
                        help="per rank (at 8192 the H200 step is launch-bound: streams have nothing to overlap)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="per table, per rank (weak scaling)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--zipf", type=float, default=1.05)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--sharding", default="table_wise",
                        help="sharding types allowed for every table, comma-separated ('' : the planner's choice)")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--keep-traces", action="store_true", help="keep the Chrome traces, not only their summary")
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--scaling", nargs="+", metavar="JSON", help="only report weak scaling from these results")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.scaling:
        print(scaling_report(args.scaling), end="")
        return
    logging.getLogger().setLevel(logging.ERROR)
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.WARNING)
    run(args)


if __name__ == "__main__":
    main()
