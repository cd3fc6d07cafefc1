"""What a small batch's backward costs the host, piece by piece, ours and FBGEMM's, on the device.

``python -m tbe_plugin.benchmarks.probe_graph_launch --out DIR [--configs user-id,fbgemm-standard]``

Small batches are host-bound on both backends (user-id at 90fa92d: our backward's kernels take
~0.21 ms, the call 0.45-0.57 ms; FBGEMM's 0.42-0.54), so who wins is whose host path is
shorter. Each timing below starts from an idle device (``torch.cuda.synchronize()`` first)
and stops when the call returns (host time only); medians over ``--calls`` calls:

- ``replay_us[n]``: ``CUDAGraph.replay()`` of a graph of n launches of an empty Triton kernel
  (how the launch's host cost grows with the graph's nodes);
- per config, ours: the whole ``out.backward(grad)`` (``backward_host_us``; and
  ``backward_wall_us``, to the device's end), the replay of its captured graph alone
  (``replay_us``), the step vector (``step_vector_us``: pack, pin, the non-blocking copy) and
  the graph's kernel count (torch.profiler); FBGEMM's ``backward_host_us`` and
  ``backward_wall_us`` on the same batch and gradient.

Writes DIR/probe_graph_launch.json with the commit and whether the tree was dirty.
"""

import argparse
import json
import os
import statistics
import time

import torch
import triton
import triton.language as tl

from tbe_plugin.benchmarks.backward import build_module, lookup
from tbe_plugin.benchmarks.common import (
    backward_host_and_wall_ms,
    generate_batches,
    silence_fbgemm_logging,
    timed_ms,
)
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.benchmarks.suite import DEVICE_CONFIGS


@triton.jit
def _empty_kernel(x_ptr, n):
    if tl.program_id(0) >= n:  # never: a kernel with one argument read and nothing done
        tl.store(x_ptr, 1)


CUDA = torch.device("cuda")


def _median_us(fn, calls: int) -> float:
    """Median host µs of ``fn()`` from an idle device."""
    return statistics.median(timed_ms(fn, CUDA, wait=False) for _ in range(calls)) * 1e3


def _backward_us(module, batch, grad, calls: int) -> dict:
    """``module``'s backward from an idle device after an untimed forward: host and wall µs."""
    host, wall = backward_host_and_wall_ms(lambda: lookup(module, batch), grad, calls, CUDA)
    return {"backward_host_us": host * 1e3, "backward_wall_us": wall * 1e3}


def replay_costs(nodes: list[int], calls: int) -> dict:
    """Host µs of replaying a graph of n empty Triton launches, for each n."""
    x = torch.zeros(1, device="cuda")
    _empty_kernel[(1,)](x, 1)  # compiled outside the capture
    out = {}
    for n in nodes:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                _empty_kernel[(1,)](x, 1)
        graph.replay()
        out[n] = _median_us(graph.replay, calls)
    return out


def _kernel_count(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name)


class _Stopwatch:
    """Wraps functions (by module attribute) to add up their host µs per name while on."""

    def __init__(self, targets: list[tuple[object, str]]):
        self.totals: dict[str, float] = {}
        self.saved = []
        for owner, name in targets:
            original = getattr(owner, name)
            label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
            self.saved.append((owner, name, original))
            setattr(owner, name, self._wrap(original, label))

    def _wrap(self, fn, label: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[label] = self.totals.get(label, 0.0) + (time.perf_counter() - start) * 1e6

        return staticmethod(timed) if isinstance(fn, staticmethod) else timed

    def restore(self) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)


def split_host(backward, forward, calls: int) -> dict:
    """Host µs a backward call spends in each layer of ours (medians over ``calls`` calls from
    an idle device): the autograd Function's backward, ``fused_update``, the graphs' backward,
    the step vector, the replay; the whole call's too."""
    import tbe_plugin.module as module_file
    import tbe_plugin.ops.backward_graphs as graphs_file

    watch = _Stopwatch([(module_file._FusedLookup, "backward"), (module_file, "fused_update"),
                        (graphs_file.BackwardGraphs, "backward"), (graphs_file, "step_vector"),
                        (torch.cuda.CUDAGraph, "replay")])  # fmt: skip
    samples: dict[str, list[float]] = {}
    try:
        for _ in range(calls):
            forward()
            watch.totals.clear()
            total = timed_ms(backward, CUDA, wait=False) * 1e3
            for label, us in [("call", total), *watch.totals.items()]:
                samples.setdefault(label, []).append(us)
    finally:
        watch.restore()
    return {label: statistics.median(values) for label, values in samples.items()}


def probe_config(cfg, calls: int, with_fbgemm: bool) -> dict:
    from tbe_plugin.ops.backward_graphs import step_vector
    from tbe_plugin.ops.optimizers import OptimizerArgs

    device = torch.device("cuda")
    batch = generate_batches(cfg, 1, device)[0][0]
    entry = {"config": cfg.name, "lookups": batch.indices.numel()}
    ours = build_module("ours", cfg, "EXACT_ROWWISE_ADAGRAD", device)
    out = lookup(ours, batch)
    grad = torch.randn(out.shape, device=device, generator=torch.Generator(device).manual_seed(0))
    outputs = []

    def forward():
        outputs.append(lookup(ours, batch))

    def backward():
        outputs.pop().backward(grad)

    for _ in range(4):  # compile, capture, replay
        forward()
        backward()
    entry["ours"] = _backward_us(ours, batch, grad, calls)
    entry["ours"]["host_split_us"] = split_host(backward, forward, calls)
    captured = [e for e in ours.backward_graphs._entries.values() if e.graph]
    if captured:
        graph = captured[-1].graph
        entry["ours"]["replay_us"] = _median_us(graph.replay, calls)
        entry["ours"]["graph_kernels"] = _kernel_count(graph.replay)
    args = OptimizerArgs(optimizer=0, learning_rate=0.01, eps=1e-8, beta1=0.9, beta2=0.999, weight_decay=0.0,
                         weight_decay_mode=0, stochastic_rounding=False, seed=0)  # fmt: skip
    target = torch.empty(64, dtype=torch.int64, device=device)

    def vector():
        v = step_vector(batch.indices, batch.offsets, None, grad, args)
        target[: v.numel()].copy_(v, non_blocking=True)

    entry["ours"]["step_vector_us"] = _median_us(vector, calls)
    del ours, outputs[:]
    if with_fbgemm:
        fbgemm = build_module("fbgemm", cfg, "EXACT_ROWWISE_ADAGRAD", device)
        for _ in range(3):
            lookup(fbgemm, batch).backward(grad)
        entry["fbgemm"] = _backward_us(fbgemm, batch, grad, calls)
        del fbgemm
    torch.cuda.empty_cache()
    return entry


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--configs", default="user-id,fbgemm-standard")
    parser.add_argument("--nodes", default="1,4,16,32,64")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--no-fbgemm", action="store_true")
    args = parser.parse_args(argv)
    silence_fbgemm_logging()
    configs = {cfg.name: cfg for cfg in DEVICE_CONFIGS}
    unknown = [name for name in args.configs.split(",") if name not in configs]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; configs: {', '.join(configs)}")
    report = {"git": git_state(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "replay_us": replay_costs([int(n) for n in args.nodes.split(",")], args.calls), "entries": []}
    for name in args.configs.split(","):
        report["entries"].append(probe_config(configs[name], args.calls, not args.no_fbgemm))
        print(json.dumps(report["entries"][-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_graph_launch.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["replay_us"]))
    return report


if __name__ == "__main__":
    main()
