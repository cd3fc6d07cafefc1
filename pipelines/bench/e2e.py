"""End to end, the number that counts: ``python -m pipelines.bench.e2e --out DIR``.

A TorchRec DLRM over issue 14's click-through tables (``tables.workload=ctr_dlrm``: 30
tables, rows 1e5..5e6, Poisson pooling 1..60, Zipf 1.05..1.3, D=128), B=16384, fused rowwise
Adagrad, sharded for each backend (fbgemm, triton) by ``build_model`` (our sharders and
planner, DMP, tables table-wise), trained under TorchRec's ``TrainPipelineSparseDist`` and
``TrainPipelineSemiSync`` and our ``StalenessTrainPipeline`` at k = 0 and 1. Every run
builds its model afresh with the same weights (``device_init``) and trains on the same
batches, drawn once on the device (``WorkloadClickLog``: the project's Zipf generator) and
cycled, enough of them that no step finds the last one's rows in cache.

Per (backend, pipeline): ms per step (windows synchronized at both ends, as
``pipelines.bench.pipeline`` times them: the mean, and the median and spread of the steps),
the median host time of a step (its call's start to its return: near the step's time, the
step is host-bound and host stalls show in it), examples/s and the ratio triton / fbgemm,
the ratio of the median steps (fbgemm / triton: the mean's ratio less the outlier steps),
peak GPU memory (from a reset before the build)
and its ratio, the largest loss difference between backends (same semantics, same
weights and batches: only summation order differs) and within a backend between
pipelines of equal semantics (k = 0 vs SparseDist, k = 1 vs SemiSync). Under SparseDist a
few steps per backend are profiled: device time per step of TBE forward, TBE backward,
dense and other kernels, and the top kernels (on CPU: ops' own CPU time instead); on a GPU
also their timeline (``timeline.py``: what ran alone, what ran at once, and the idle time)
and the host's waits for the device (``host_waits``: synchronizations and blocking copies, by
the ops that made them).

``--backends fbgemm,triton,triton@stack16``: ``triton@NAME`` is the Triton backend under
``profile_backward``'s candidate launch NAME (plain ``triton`` takes ``--backward-launch``):
several launches A/B'd against FBGEMM, and against each other, in one process on the same
batches (each one's ratio to FBGEMM in ``summary["vs_fbgemm"]``).

``--smoke``: four of the tables shrunk, B=64, 2 steps, on CPU (gloo, Triton's interpreter).
Results (JSON + markdown) record the commit and whether the tree was dirty, the device,
the versions and the command line; they are rewritten after every run, so a run cut short
leaves what it measured.
"""

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.autograd import DeviceType

from pipelines.app.config import DataConfig, TableSpec, TablesConfig, TrainConfig
from pipelines.app.data import WorkloadClickLog, table_workloads
from pipelines.bench.pipeline import (
    BALANCES, commit_line, device_init, dlrm_config, make_pipeline, plan_summary, profile_steps, provenance,
    release_memory, time_mode, versions,
)  # fmt: skip
from pipelines.bench.timeline import alone_and_shared, device_intervals, timeline_breakdown
from pipelines.metrics import phase_of
from tbe_plugin.benchmarks.common import markdown_table
from tbe_plugin.workloads import Workload, ctr_tables_dlrm, skew_stats

PIPELINES = ("sparsedist", "semisync", "stale0", "stale1")
BACKENDS = ("fbgemm", "triton")
LAUNCH_MARK = "@"  # triton@NAME: the Triton backend under the candidate launch NAME
# Pipelines whose losses must match, step for step, within one backend.
SAME_SEMANTICS = {"stale0": "sparsedist", "stale1": "semisync"}
PROFILED_PIPELINE = "sparsedist"
# TorchRec's SemiSync record_stream-s each batch on its streams, which do not exist on CPU.
CUDA_ONLY = {"semisync": "TorchRec's TrainPipelineSemiSync needs CUDA streams (its record_stream fails on CPU)"}

TBE_FORWARD, TBE_BACKWARD, DENSE, OTHER = "TBE forward", "TBE backward", "dense", "other"
UNATTRIBUTED_TBE = "TBE (no phase op)"
GROUPS = (TBE_FORWARD, TBE_BACKWARD, DENSE, OTHER, UNATTRIBUTED_TBE)
# TorchRec's range around a sharded module's lookup ("[lookup]_[fqn]_[sharding]"): the whole
# TBE forward of either backend, FBGEMM's bounds check included, beside our and FBGEMM's ops.
TBE_FORWARD_OP_MARKS = ("[lookup]_", "fbgemm::bounds_check_indices")
# Ops of the input and output side (copy, all-to-alls, TorchRec's ranges around them): their
# kernels are "other", not dense. Matched in lower case (TorchRec writes both KJT and kjt).
OTHER_OP_MARKS = ("copy_batch_to_gpu", "sparse_data_dist", "input_dist", "[splits_dist]_", "[tensors_dist]_",
                  "[output_dist]_", "kjt", "all2all", "fbgemm::permute", "fbgemm::block_bucketize")  # fmt: skip
OTHER_KERNEL_MARKS = ("memcpy", "memset", "nccl")
# Kernel names of the TBE itself: ours are Triton functions named with a leading '_'.
FBGEMM_KERNEL_MARKS = ("split_embedding", "batched_embedding")


def kernel_group(kernel: str, ops: Sequence[str]) -> str:
    """The group of a kernel (or, on CPU, of an op's own time) launched by ``ops[0]``, whose
    ancestors follow: the innermost op of a TBE phase or of the input side decides; then
    the kernel's name (copies and collectives are "other"; a TBE kernel outside any phase
    op is reported apart, not guessed); the rest is the dense model and its optimizer."""
    for op in ops:
        phase = phase_of(op)
        if phase == "tbe_forward" or any(mark in op for mark in TBE_FORWARD_OP_MARKS):
            return TBE_FORWARD
        if phase == "tbe_backward":
            return TBE_BACKWARD
        if phase == "all_to_all" or any(mark in op.lower() for mark in OTHER_OP_MARKS):
            return OTHER
    if any(mark in kernel.lower() for mark in OTHER_KERNEL_MARKS):
        return OTHER
    if kernel.startswith("_") or any(mark in kernel for mark in FBGEMM_KERNEL_MARKS):
        return UNATTRIBUTED_TBE
    return DENSE


def _op_chain(event: Any) -> List[str]:
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


# CUDA runtime calls in which the host waits for the device (the profiler records them as the
# host's events, inside the op that made them); a copy counts from HOST_WAIT_MIN_US (a copy
# from pinned memory returns at once; one to pageable memory waits for its stream).
HOST_WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                   "cudaMemcpyAsync")  # fmt: skip
HOST_WAIT_MIN_US = 20.0


def host_waits(events: Any, steps: int, top: int = 8) -> Dict[str, Any]:
    """Per step: the host's ms in CUDA calls that wait for the device (``HOST_WAIT_CALLS``),
    all of them and by the ops that made them (the innermost two and outermost two op names
    of the call's chain); calls outside any op (the harness's own synchronize) apart."""
    by_ops: Dict[str, float] = {}
    outside = 0.0
    for event in events:
        if event.name not in HOST_WAIT_CALLS:
            continue
        us = event.cpu_time_total
        if event.name.startswith("cudaMemcpy") and us < HOST_WAIT_MIN_US:
            continue
        chain = _op_chain(event.cpu_parent) if event.cpu_parent is not None else []
        if not chain:
            outside += us
            continue
        key = f"{event.name} in " + " < ".join(chain if len(chain) <= 4 else chain[:2] + ["..."] + chain[-2:])
        by_ops[key] = by_ops.get(key, 0.0) + us
    ranked = sorted(by_ops.items(), key=lambda item: -item[1])[:top]
    return {"ms_per_step": sum(by_ops.values()) / 1e3 / steps, "outside_ops_ms": outside / 1e3 / steps,
            "by_ops": [{"ops": ops, "ms": us / 1e3 / steps} for ops, us in ranked]}  # fmt: skip


def kernel_records(events: Any, device_time: bool) -> List[Tuple[str, str, float]]:
    """(kernel, group, microseconds) from a profiler's events: every kernel a CPU op
    launched (CUDA), or every op's own CPU time (``device_time=False``)."""
    records = []
    for event in events:
        if device_time:
            for kernel in getattr(event, "kernels", ()):
                if kernel.name != event.name:  # an annotation's own GPU range, not a kernel
                    records.append((kernel.name, kernel_group(kernel.name, _op_chain(event)), kernel.duration))
        elif event.self_cpu_time_total > 0 and getattr(event, "device_type", None) in (None, DeviceType.CPU):
            records.append((event.name, kernel_group(event.name, _op_chain(event)), event.self_cpu_time_total))
    return records


def kernel_breakdown(records: List[Tuple[str, str, float]], steps: int, top: int) -> Dict[str, Any]:
    """Per step: ms of each group and of the ``top`` kernels (by total time), with shares."""
    groups = {group: 0.0 for group in GROUPS}
    kernels: Dict[Tuple[str, str], float] = {}
    for name, group, us in records:
        groups[group] += us
        kernels[(group, name)] = kernels.get((group, name), 0.0) + us
    total = sum(groups.values())
    ranked = sorted(kernels.items(), key=lambda item: -item[1])[:top]
    return {"steps": steps, "total_ms": total / 1e3 / steps,
            "groups_ms": {group: us / 1e3 / steps for group, us in groups.items()},
            "top": [{"kernel": name, "group": group, "ms": us / 1e3 / steps, "share": us / total if total else 0.0}
                    for (group, name), us in ranked]}  # fmt: skip


def device_timeline(events: Any, steps: int) -> Dict[str, Any]:
    """``timeline.timeline_breakdown`` of the profiled steps, kernels grouped as in the sums
    (an error is recorded, not raised: the timing it comes after stands without it)."""
    def group_of(name: str, host: Any) -> str:
        return kernel_group(name, _op_chain(host) if host is not None else [])

    try:
        return timeline_breakdown(device_intervals(events, group_of), steps)
    except Exception as error:  # noqa: BLE001 - a profiler whose events lack a field: say so
        return {"error": f"{type(error).__name__}: {error}"[:300]}


# The interpreter's backward takes milliseconds per lookup: ~1 id a bag keeps the smoke run short.
SMOKE_MAX_POOLING = 1.0


def smoke_tables(dim: int) -> TablesConfig:
    """The CTR tables' first four, shrunk for the interpreter: rows / 1000, pooling at most
    ``SMOKE_MAX_POOLING``; their Zipf exponents kept."""
    specs = [TableSpec(rows=max(100, t.rows // 1000), pooling_factor=min(t.mean_pooling, SMOKE_MAX_POOLING),
                       zipf_alpha=t.alpha) for t in ctr_tables_dlrm(num_tables=4, dim=dim)]  # fmt: skip
    return TablesConfig(num_tables=len(specs), dim=dim, per_table=specs)


def step_statistics(step_ms: List[float]) -> Dict[str, Optional[float]]:
    if not step_ms:
        return {"median_ms": None, "p10_ms": None, "p90_ms": None}
    ordered = sorted(step_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered), "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


def host_median(run: Dict[str, Any]) -> Optional[float]:
    """The median host time of a step (``time_mode``'s ``host_ms``; None for older results)."""
    host = run.get("host_ms")
    return statistics.median(host) if host else None


def parse_backends(text: str, backward_launch: str = "") -> List[Tuple[str, str, str]]:
    """``--backends`` as (key, backend, launch): ``fbgemm``, ``triton`` (under
    ``backward_launch``; '' the default) and ``triton@NAME`` (under candidate NAME). Unknown
    backends and candidates (``--backward-launch``'s too, where triton takes it) raise,
    naming the entry, before any model is built."""
    from tbe_plugin.benchmarks.profile_backward import CANDIDATES

    parsed, seen = [], set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        backend, mark, launch = entry.partition(LAUNCH_MARK)
        if backend not in BACKENDS:
            raise ValueError(f"--backends: {entry!r}: the backend is one of {', '.join(BACKENDS)}")
        if mark and backend != "triton":
            raise ValueError(f"--backends: {entry!r}: only triton takes a launch ({backend} has none)")
        if entry in seen:
            raise ValueError(f"--backends: {entry!r} is given twice")
        seen.add(entry)
        if not mark:
            launch = backward_launch if backend == "triton" else ""
        if launch and launch not in CANDIDATES:
            where = f"--backends: {entry!r}:" if mark else "--backward-launch"
            raise ValueError(f"{where} {launch!r} is no candidate; candidates: {', '.join(CANDIDATES)}")
        parsed.append((entry, backend, launch))
    if not parsed:
        raise ValueError("--backends: no backend given")
    return parsed


def measure(cfg: TrainConfig, pipeline: str, batches: List[Any], args: argparse.Namespace, device: torch.device,
            world_size: int, launch: str = "") -> Dict[str, Any]:  # fmt: skip
    """One (backend, pipeline) run on a model built afresh (Triton's under ``launch``, a
    candidate of ``profile_backward``; '' the default); its profile under SparseDist."""
    from pipelines.app.model import build_model

    on_cuda = device.type == "cuda"
    release_memory()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(cfg.data.seed)  # the same dense weights for every run
    dmp, optimizer = build_model(cfg, device, world_size, init=device_init)
    # (cfg.backend is a BackendConfig: compared as a string it never matched, and the launch
    # was silently left at the default from e45a0a4 to 8fc26f9.)
    launched = set_backward_launch(dmp, launch) if cfg.backend.name == "triton" and launch else 0
    resident = torch.cuda.memory_allocated(device) if on_cuda else None
    runner = make_pipeline(pipeline, dmp, optimizer, device)
    run = time_mode(runner, batches, args.warmup, args.steps, device, args.windows)
    run.update(step_statistics(run["step_ms"]), plan=plan_summary(dmp), launch_modules=launched)
    run["examples_per_s"] = cfg.data.batch_size * world_size / run["ms"] * 1e3
    run["resident_gib"] = resident / 2**30 if on_cuda else None
    run["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None
    if pipeline == PROFILED_PIPELINE and args.profile_steps:
        events = profile_steps(runner, batches, args.profile_steps, device, warmup=1).events()  # warm: just timed
        run["profile"] = kernel_breakdown(kernel_records(events, on_cuda), args.profile_steps, args.top_kernels)
        run["profile"]["device_time"] = on_cuda
        if on_cuda:
            run["profile"]["timeline"] = device_timeline(events, args.profile_steps)
            run["profile"]["host_waits"] = host_waits(events, args.profile_steps)
    del runner, dmp, optimizer
    return run


def _with_lookups(model: torch.nn.Module) -> List[torch.nn.Module]:
    """Every module of ``model`` and of the lookups TorchRec's sharded collections keep in a
    plain list (``_lookups``: not submodules, so ``model.modules()`` never reaches them)."""
    seen, found, stack = set(), [], [model]
    while stack:
        for module in stack.pop().modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            found.append(module)
            lookups = getattr(module, "_lookups", None)
            if isinstance(lookups, (list, tuple)):
                stack.extend(m for m in lookups if isinstance(m, torch.nn.Module))
    return found


def set_backward_launch(model: torch.nn.Module, name: str) -> int:
    """Puts the named candidate launch (``tbe_plugin.benchmarks.profile_backward.CANDIDATES``,
    checked by ``parse_backends``) on every Triton TBE module inside ``model``; returns how
    many took it (0 raises)."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.benchmarks.profile_backward import CANDIDATES

    modules = [m for m in _with_lookups(model) if isinstance(m, TritonTableBatchedEmbeddingBags)]
    if not modules:
        raise ValueError(f"backward launch {name!r}: the model holds no TritonTableBatchedEmbeddingBags")
    for module in modules:
        module.backward_launch = CANDIDATES[name]()
    return len(modules)


def _backends_run(results: Dict[str, Any]) -> List[str]:
    """The backends' keys in the order given (``settings["backends"]``; older results: BACKENDS)."""
    return list(results.get("settings", {}).get("backends") or BACKENDS)


def summarize(results: Dict[str, Any]) -> None:
    """Per pipeline: triton / fbgemm ratios of examples/s and peak memory, the largest loss
    difference between backends (``summary[pipeline]``; every Triton launch's in
    ``summary["vs_fbgemm"]["KEY/PIPELINE"]``); per backend: the same-semantics loss differences."""
    runs = results["runs"]
    summary: Dict[str, Any] = {"vs_fbgemm": {}}
    for pipeline in PIPELINES:
        a = runs.get(f"fbgemm/{pipeline}")
        for backend in _backends_run(results):
            b = runs.get(f"{backend}/{pipeline}")
            if a is None or b is None or backend == "fbgemm":
                continue
            summary["vs_fbgemm"][f"{backend}/{pipeline}"] = {
                "examples_per_s_ratio": b["examples_per_s"] / a["examples_per_s"],
                "median_ratio": a["median_ms"] / b["median_ms"] if a["median_ms"] and b["median_ms"] else None,
                "peak_ratio": b["peak_gib"] / a["peak_gib"] if a["peak_gib"] else None,
                "loss_diff_backends": max(abs(x - y) for x, y in zip(a["losses"], b["losses"])),
                "first_loss_diff_backends": abs(a["losses"][0] - b["losses"][0]),
            }
        if f"triton/{pipeline}" in summary["vs_fbgemm"]:
            summary[pipeline] = summary["vs_fbgemm"][f"triton/{pipeline}"]
    for backend in _backends_run(results):
        for mode, same in SAME_SEMANTICS.items():
            a, b = runs.get(f"{backend}/{mode}"), runs.get(f"{backend}/{same}")
            if a is not None and b is not None:
                summary.setdefault(backend, {})[f"loss_diff_{mode}_vs_{same}"] = max(
                    abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    results["summary"] = summary


def _fmt(value: Optional[float], spec: str = ".2f") -> str:
    return "" if value is None else format(value, spec)


def report(results: Dict[str, Any]) -> str:
    v, p, s = results["versions"], results["provenance"], results["settings"]
    skew = s["skew"]
    lines = [
        "# End to end: TorchRec DLRM on the CTR tables, both backends, four pipelines", "",
        f"{v.get('device_name', v.get('device'))}; torch {v.get('torch')}, triton {v.get('triton')}, "
        f"torchrec {v.get('torchrec')}, fbgemm_gpu {v.get('fbgemm_gpu')}. {commit_line(p)}", "",
        f"Command: `{p['command']}`", "",
        f"Tables: {s['tables']}; batch 0: {skew['lookups']} lookups, distinct {skew['distinct_fraction']:.0%}, "
        f"hot1% {skew['hot1pct_share']:.0%}, longest run {skew['max_run']}. DLRM bottom MLP {s['dense']}, "
        f"top MLP {s['over']}, B={s['batch_size']} per rank, world size {s['world_size']}, fused rowwise "
        f"Adagrad (fp32) + dense Adagrad, tables {s['sharding'] or 'as planned'}. {s['distinct_batches']} "
        f"distinct batches cycled; {s['warmup']} warm-up steps, then {s['steps']} steps in {s['windows']} "
        "windows synchronized at both ends (ms = their mean; median and p10-p90 of single steps). Triton's "
        f"backward launch: {s.get('backward_launch', 'default')}" + ("; triton@NAME: under candidate NAME"
        if any(LAUNCH_MARK in b for b in _backends_run(results)) else "") + ".", "",
    ]  # fmt: skip
    lines += _timing_lines(results) + _loss_lines(results) + _profile_lines(results)
    return "\n".join(lines) + "\n"


def _timing_lines(results: Dict[str, Any]) -> List[str]:
    rows = []
    for pipeline in PIPELINES:
        for backend in _backends_run(results):
            r = results["runs"].get(f"{backend}/{pipeline}")
            if r is None:
                continue
            ratio = results["summary"].get("vs_fbgemm", {}).get(f"{backend}/{pipeline}", {})
            spread = f"{_fmt(r['p10_ms'])}-{_fmt(r['p90_ms'])}" if r["p10_ms"] is not None else ""
            rows.append([pipeline, backend, _fmt(r["ms"]), _fmt(r["median_ms"]), spread, _fmt(host_median(r)),
                         _fmt(r["examples_per_s"], ".0f"), _fmt(ratio.get("examples_per_s_ratio"), ".3f"),
                         _fmt(ratio.get("median_ratio"), ".3f"), _fmt(r["peak_gib"]),
                         _fmt(ratio.get("peak_ratio"), ".3f")])  # fmt: skip
    headers = ["pipeline", "backend", "ms/step", "median", "p10-p90", "host ms (median)", "examples/s",
               "triton / fbgemm", "median fbgemm / triton", "peak GiB", "peak triton / fbgemm"]  # fmt: skip
    compiled = {key: r["compiles_timed"] for key, r in results["runs"].items() if r.get("compiles_timed")}
    late = (["Triton kernels compiled or loaded during the timed steps (each stalls its step): "
             + "; ".join(f"{key}: {len(names)} ({', '.join(sorted(set(names)))})" for key, names in compiled.items())]
            if compiled else ["No Triton kernel was compiled or loaded during the timed steps."])  # fmt: skip
    return [markdown_table(headers, rows), "", *late, ""] + [f"Not run: {key}: {why}" for key, why in
                                                             results.get("skipped", {}).items()]  # fmt: skip


def _loss_lines(results: Dict[str, Any]) -> List[str]:
    lines = ["", "Loss agreement, largest |difference| over all steps (first step in parentheses): between "
             "backends per pipeline; within a backend, pipelines of equal semantics.", ""]  # fmt: skip
    for key, d in results["summary"].get("vs_fbgemm", {}).items():
        backend, _, pipeline = key.rpartition("/")
        lines.append(f"- {pipeline}, {backend} vs fbgemm: {d['loss_diff_backends']:.2e} "
                     f"({d['first_loss_diff_backends']:.2e})")  # fmt: skip
    for backend in _backends_run(results):
        for key, value in results["summary"].get(backend, {}).items():
            lines.append(f"- {backend}, {key[len('loss_diff_'):].replace('_', ' ')}: {value:.2e}")
    return lines


def _profile_lines(results: Dict[str, Any]) -> List[str]:
    runs = results["runs"]
    profiles = {b: runs.get(f"{b}/{PROFILED_PIPELINE}", {}).get("profile") for b in _backends_run(results)}
    profiles = {b: prof for b, prof in profiles.items() if prof}
    if not profiles:
        return []
    unit = "device ms" if all(prof["device_time"] for prof in profiles.values()) else "CPU ms (no GPU)"
    steps = next(iter(profiles.values()))["steps"]
    names = list(profiles)
    rows = [[group] + [_fmt(profiles[b]["groups_ms"][group], ".3f") for b in names] for group in GROUPS]
    rows.append(["all kernels"] + [_fmt(profiles[b]["total_ms"], ".3f") for b in names])
    lines = ["", f"Profile under {PROFILED_PIPELINE}, {steps} steps: {unit} per step by group", "",
             markdown_table(["group"] + names, rows)]  # fmt: skip
    for backend, prof in profiles.items():
        rows = [[k["kernel"][:100].replace("|", "/"), k["group"], _fmt(k["ms"], ".3f"), _fmt(100 * k["share"], ".1f")]
                for k in prof["top"]]  # fmt: skip
        lines += ["", f"Top kernels, {backend} ({unit} per step):", "",
                  markdown_table(["kernel", "group", "ms", "%"], rows)]  # fmt: skip
    return lines + _timeline_lines(profiles, steps) + _host_wait_lines(profiles)


def _host_wait_lines(profiles: Dict[str, Any]) -> List[str]:
    lines = []
    for backend, prof in profiles.items():
        waits = prof.get("host_waits")
        if waits is None:
            continue
        rows = [[w["ops"][:160].replace("|", "/"), _fmt(w["ms"], ".3f")] for w in waits["by_ops"]]
        lines += ["", f"Host waits for the device, {backend}: {waits['ms_per_step']:.3f} ms a profiled step in ops "
                  f"(+{waits['outside_ops_ms']:.3f} outside any op: the harness's synchronize), by call and ops "
                  f"(innermost first):", "", markdown_table(["call in ops", "ms per step"], rows)]  # fmt: skip
    return lines


def _timeline_lines(profiles: Dict[str, Any], steps: int) -> List[str]:
    timelines = {b: prof["timeline"] for b, prof in profiles.items() if "segments_ms" in prof.get("timeline", {})}
    errors = [f"- {b}: {prof['timeline']['error']}" for b, prof in profiles.items()
              if "error" in prof.get("timeline", {})]  # fmt: skip
    if not timelines:
        return ["", "Device timeline: not measured", *errors] if errors else []
    names = list(timelines)
    keys = sorted({k for t in timelines.values() for k in t["segments_ms"]},
                  key=lambda k: -max(t["segments_ms"].get(k, 0.0) for t in timelines.values()))  # fmt: skip
    rows = [[k] + [_fmt(timelines[b]["segments_ms"].get(k, 0.0), ".3f") for b in names] for k in keys]
    rows.append(["window (first kernel's start to last one's end)"] + [_fmt(timelines[b]["window_ms"], ".3f")
                                                                      for b in names])  # fmt: skip
    alone = [[f"{g}: alone / beside others"] + ["{:.3f} / {:.3f}".format(*alone_and_shared(timelines[b], g))
                                                for b in names] for g in (TBE_FORWARD, TBE_BACKWARD)]  # fmt: skip
    return ["", f"Device timeline under {PROFILED_PIPELINE}, {steps} steps: ms per step by what ran (a group alone, "
            f"groups at once, or nothing)", "", markdown_table(["ran"] + names, rows + alone), *errors]


def write_results(results: Dict[str, Any], out: str) -> None:
    summarize(results)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "e2e.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "e2e.md"), "w") as f:
        f.write(report(results))


def run(args: argparse.Namespace, argv: List[str]) -> Dict[str, Any]:
    import torch.distributed as dist

    from tbe_plugin.torchrec.process_group import init_process_group

    backends = parse_backends(args.backends, args.backward_launch)  # bad names fail before any work
    rank, world_size, device = init_process_group()
    if args.smoke:
        tables = smoke_tables(args.dim)
    else:
        tables = TablesConfig(num_tables=args.num_tables, dim=args.dim, workload="ctr_dlrm",
                              workload_seed=args.workload_seed)  # fmt: skip
    data = DataConfig(batch_size=args.batch_size, seed=0, distinct_batches=args.distinct_batches)
    batches = list(WorkloadClickLog(tables, data, 13, device, rank, args.distinct_batches))
    features = batches[0].sparse_features
    workload = Workload("e2e", table_workloads(tables), args.batch_size)
    environment = versions(device)
    results: Dict[str, Any] = {
        "provenance": provenance(environment, ["-m", "pipelines.bench.e2e", *argv]), "versions": environment,
        "settings": {"tables": workload.describe(), "per_table": [dataclasses.asdict(t) for t in workload.tables],
                     "skew": skew_stats(workload, features.values(), features.offsets()),
                     "batch_size": args.batch_size, "world_size": world_size, "dense": args.dense, "over": args.over,
                     "sharding": args.sharding, "steps": args.steps, "warmup": args.warmup, "windows": args.windows,
                     "distinct_batches": args.distinct_batches,
                     "backward_launch": args.backward_launch or "default",
                     "backends": [key for key, _, _ in backends]},
        "runs": {},
    }  # fmt: skip
    try:
        # Both backends of a pipeline back to back: a run cut short keeps whole comparisons.
        for pipeline in args.pipelines.split(","):
            for name, backend, launch in backends:
                cfg = dlrm_config(tables, args.dense, args.over, backend, args.batch_size, args.sharding)
                key = f"{name}/{pipeline}"
                if device.type != "cuda" and pipeline in CUDA_ONLY:
                    results.setdefault("skipped", {})[key] = CUDA_ONLY[pipeline]
                    continue
                results["runs"][key] = measure(cfg, pipeline, batches, args, device, world_size, launch)
                if rank == 0:
                    r = results["runs"][key]
                    peak = f"peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "no GPU memory"
                    print(f"{key}: {r['ms']:.3f} ms/step, {r['examples_per_s']:.0f} examples/s, {peak}", flush=True)
                    write_results(results, args.out)
        if rank == 0:
            write_results(results, args.out)
            print(report(results), flush=True)
    finally:
        dist.destroy_process_group()
    return results


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    balanced = BALANCES["balanced"]
    parser = argparse.ArgumentParser(prog="python -m pipelines.bench.e2e", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-out/e2e")
    parser.add_argument("--smoke", action="store_true", help="tiny tables on CPU (gloo, interpreter): a test")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated: fbgemm, triton, triton@NAME (under profile_backward's candidate NAME)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--num-tables", type=int, default=30)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--workload-seed", type=int, default=0, help="seed of ctr_tables_dlrm's draw")
    parser.add_argument("--batch-size", type=int, default=16384, help="per rank")
    parser.add_argument("--dense", type=int, nargs="+", default=balanced["dense"],
                        help="bottom MLP; its last size is replaced by --dim (DLRM's interaction joins them)")
    parser.add_argument("--over", type=int, nargs="+", default=balanced["over"], help="top MLP, ending in 1")
    parser.add_argument("--sharding", default="table_wise",
                        help="sharding types allowed for every table, comma-separated ('' : the planner's choice)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--windows", type=int, default=5, help="synchronized windows the steps are timed in")
    parser.add_argument("--warmup", type=int, default=30,
                        help="at least --distinct-batches, so every batch's kernels compile before timing (at "
                             "10 the first timed window still held first-use compiles: H200, d488ab2)")
    parser.add_argument("--distinct-batches", type=int, default=8)
    parser.add_argument("--profile-steps", type=int, default=5, help=f"profiled steps under {PROFILED_PIPELINE}")
    parser.add_argument("--top-kernels", type=int, default=15)
    parser.add_argument("--backward-launch", default="",
                        help="triton: a candidate launch of profile_backward (e.g. pieces); '': the default")
    if "--smoke" in argv:  # its defaults; options given still win
        parser.set_defaults(batch_size=64, dim=16, dense=[16, 16], over=[16, 1], steps=2, windows=1, warmup=1,
                            distinct_batches=2, profile_steps=1)  # fmt: skip
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.WARNING)
    run(args, argv)


if __name__ == "__main__":
    main()
