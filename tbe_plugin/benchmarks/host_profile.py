"""Where a small training step's host time goes: ``python -m tbe_plugin.benchmarks.host_profile --out DIR``.

Small batches are host-bound (H200 at d488ab2: user-id's backward kernels take 0.21 ms of a
1.6 ms backward). For each workload this runs our module's forward + backward on the device
(no FBGEMM needed: torch and Triton only) and writes DIR/host_profile.json and
DIR/host_profile.txt:

- ``backward_wall_ms``: ``out.backward(grad)`` from a synchronized start to a synchronized end;
- ``backward_host_ms``: the same call until it returns, without waiting for the device (the
  host's launch path; when it exceeds the device time the step is host-bound);
- the device kernels one backward launches (count and total device ms, torch.profiler);
- the host functions that take the time (cProfile over ``--calls`` backward calls, by own
  time and by cumulative time), and torch.profiler's CPU ops by self time.

``--step``: instead, a training step's TBE part as the end to end runs it (forward with the
plan made in it, then backward; ``--candidates`` as launches, ``default`` the module's own),
FBGEMM's module beside it on the same batch when fbgemm_gpu is there: ``step_host_ms``
(the forward's call to the backward's return, from an idle device) and ``step_wall_ms``
(to the device's end), their cProfile over ``--calls`` steps (the training thread's).

Workloads: ``standard`` (FBGEMM's benchmark shape: 32 tables of 100k rows, D=128, B=512,
L=20, uniform ids) and ``user-id`` (the suite's: 4 tables of 1e7 rows, one Zipf id a bag,
B=65536); each under the ``--candidates`` launches (``profile_backward.CANDIDATES``: by
default the default launch and ``graphs``, the backward as a captured CUDA graph). The
results record the commit and whether the tree was dirty. Measured on the H200 at 66ab55a
(default launch): standard 1.83 ms a backward, 1.81 of it host time, 31 kernels.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

from tbe_plugin.benchmarks.common import backward_host_and_wall_ms, free_device_memory, plan_in_backward
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.benchmarks.suite import DEVICE_PRODUCTION
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

WORKLOADS = {
    "standard": Workload("standard", tuple(TableWorkload(rows=100_000, dim=128, mean_pooling=20, pooling="fixed")
                                           for _ in range(32)), batch_size=512),  # fmt: skip
    "user-id": Workload("user-id", tuple(TableWorkload(rows=10_000_000, dim=128, mean_pooling=1, pooling="fixed",
                                                       alpha=a) for a in (1.2, 1.2, 1.25, 1.3)), batch_size=65536),
    # Larger than the graphs' limit (RunsLaunch.graph_max_ids): launched eagerly.
    "uniform-b8192": Workload("uniform-b8192", tuple(TableWorkload(rows=1_000_000, dim=128, mean_pooling=20,
                                                                   pooling="fixed") for _ in range(32)),
                              batch_size=8192),
    # The end to end's tables (30 of D=128, 16.1 GB in fp32), B=16384: 15.4M ids a batch.
    "ctr-dlrm": next(w for w in DEVICE_PRODUCTION if isinstance(w, Workload) and w.name == "ctr-dlrm"),
    # The kernel suite's D=512 tables (built in fp32 here: the host path does not depend on it).
    "wide-d512": next(w for w in DEVICE_PRODUCTION if isinstance(w, Workload) and w.name == "wide-d512-fp16"),
}  # fmt: skip


def build(workload: Workload, device: torch.device, candidate: str, as_trained: bool = False):
    """Ours under ``candidate``, rowwise Adagrad, lr 0.01: its plan in the backward (the whole
    backward is timed), or (``as_trained``) as the end to end trains it, its plan in the
    forward (``default``: the module's own launch)."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags
    from tbe_plugin.benchmarks.profile_backward import CANDIDATES

    specs = [(t.rows, t.dim) for t in workload.tables]
    module = TritonTableBatchedEmbeddingBags(specs, optimizer="EXACT_ROWWISE_ADAGRAD", learning_rate=0.01,
                                             device=device)  # fmt: skip
    if not as_trained:
        module.backward_launch = plan_in_backward(CANDIDATES[candidate]())
    elif candidate != "default":
        module.backward_launch = CANDIDATES[candidate]()
    return module


def build_step(workload: Workload, device: torch.device, candidate: str) -> torch.nn.Module:
    """Ours under ``candidate`` as the end to end trains it (its plan in the forward), or
    FBGEMM's module (``candidate`` ``fbgemm``), rowwise Adagrad, lr 0.01."""
    if candidate != "fbgemm":
        return build(workload, device, candidate, as_trained=True)
    from tbe_plugin.benchmarks.common import fbgemm_api

    api = fbgemm_api()
    specs = [(t.rows, t.dim, api.EmbeddingLocation.DEVICE, api.ComputeDevice.CUDA) for t in workload.tables]
    return api.SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=api.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                     learning_rate=0.01, device=device)  # fmt: skip


def profile_step(workload: Workload, calls: int, device: torch.device, top: int, candidate: str) -> dict:
    """Host and wall time of forward + backward (see the module's docstring, ``--step``)."""
    module = build_step(workload, device, candidate)
    indices, offsets, psw = generate_batch(workload, 0, device)
    grad = torch.randn(module(indices, offsets).shape, device=device, generator=torch.Generator(device).manual_seed(0))

    def step():
        module(indices, offsets, per_sample_weights=psw).backward(grad)

    for _ in range(5):  # compiles every kernel variant this batch needs
        step()
    hosts, walls = [], []
    for _ in range(calls):
        for times, wait in ((walls, True), (hosts, False)):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            step()
            if wait:
                torch.cuda.synchronize(device)
            times.append(1e3 * (time.perf_counter() - start))
    torch.cuda.synchronize(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize(device)
    by_own = io.StringIO()
    pstats.Stats(profiler, stream=by_own).sort_stats("tottime").print_stats(top)
    return {"workload": workload.describe(), "candidate": candidate, "lookups": indices.numel(), "calls": calls,
            "step_host_ms": statistics.median(hosts), "step_wall_ms": statistics.median(walls),
            "cprofile_own": by_own.getvalue()}  # fmt: skip


def profile_workload(workload: Workload, calls: int, device: torch.device, top: int, candidate: str) -> dict:
    module = build(workload, device, candidate)
    indices, offsets, psw = generate_batch(workload, 0, device)
    grad = torch.randn(module(indices, offsets).shape, device=device, generator=torch.Generator(device).manual_seed(0))

    def forward():
        return module(indices, offsets, per_sample_weights=psw)

    for _ in range(5):  # compiles every kernel variant this batch needs
        forward().backward(grad)
    host_ms, wall_ms = backward_host_and_wall_ms(forward, grad, calls, device)
    outs = [forward() for _ in range(calls)]
    torch.cuda.synchronize(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for out in outs:
        out.backward(grad)
    profiler.disable()
    torch.cuda.synchronize(device)
    by_own, by_cumulative = io.StringIO(), io.StringIO()
    pstats.Stats(profiler, stream=by_own).sort_stats("tottime").print_stats(top)
    pstats.Stats(profiler, stream=by_cumulative).sort_stats("cumulative").print_stats(top)
    out = forward()
    torch.cuda.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        out.backward(grad)
        torch.cuda.synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "workload": workload.describe(), "candidate": candidate, "lookups": indices.numel(), "calls": calls,
        "backward_wall_ms": wall_ms, "backward_host_ms": host_ms,
        "kernels_per_backward": len(kernels),
        "kernel_device_ms": sum(e.device_time for e in kernels) / 1e3,
        "kernels": sorted({e.name for e in kernels}),
        "cpu_ops": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top),
        "cprofile_own": by_own.getvalue(), "cprofile_cumulative": by_cumulative.getvalue(),
    }  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--candidates", default="default,graphs", help="profile_backward candidates (launches)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--step", action="store_true",
                        help="forward + backward as the end to end trains them, FBGEMM's beside (candidate fbgemm)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host_profile measures the host path of a device step: it needs CUDA")
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; workloads: {', '.join(WORKLOADS)}")
    device = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    report = {"git": git_state(), "torch": torch.__version__, "device": torch.cuda.get_device_name(device),
              "results": {}}  # fmt: skip
    text = [f"host profile; {report['git']}; {report['device']}, torch {report['torch']}"]
    candidates = args.candidates.split(",")
    if args.step:
        candidates += [] if "fbgemm" in candidates or not fbgemm_available() else ["fbgemm"]
        for name, candidate in [(w, c) for w in args.workloads.split(",") for c in candidates]:
            result = profile_step(WORKLOADS[name], args.calls, device, args.top, candidate)
            free_device_memory()  # the module (16 GB on ctr-dlrm) before the next one
            report["results"][f"{name}/{candidate}/step"] = result
            text += [f"\n===== step of {name} under {candidate}: {result['workload']}, {result['lookups']} lookups",
                     f"forward + backward: host until the backward returns {result['step_host_ms']:.3f} ms, "
                     f"wall {result['step_wall_ms']:.3f} ms", "", result["cprofile_own"]]  # fmt: skip
            print("\n".join(text[-4:-2]), flush=True)
            _write(args.out, report, text)
        return report
    for name, candidate in [(w, c) for w in args.workloads.split(",") for c in candidates]:
        result = profile_workload(WORKLOADS[name], args.calls, device, args.top, candidate)
        report["results"][f"{name}/{candidate}"] = result
        text += [f"\n===== {name} under {candidate}: {result['workload']}, {result['lookups']} lookups",
                 f"backward wall {result['backward_wall_ms']:.3f} ms, host until return "
                 f"{result['backward_host_ms']:.3f} ms, {result['kernels_per_backward']} kernels "
                 f"{result['kernel_device_ms']:.3f} device ms", "", result["cpu_ops"], result["cprofile_own"],
                 result["cprofile_cumulative"]]  # fmt: skip
        print("\n".join(text[-5:-3]), flush=True)
        _write(args.out, report, text)
    return report


def fbgemm_available() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError:
        return False
    return True


def _write(out: str, report: dict, text: list) -> None:
    with open(os.path.join(out, "host_profile.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "host_profile.txt"), "w") as f:
        f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
