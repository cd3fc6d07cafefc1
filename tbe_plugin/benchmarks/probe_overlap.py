"""Whether the device runs our TBE work beside dense layers, or only after them:
``python -m tbe_plugin.benchmarks.probe_overlap --out DIR`` (CUDA).

A design probe. The end to end's timeline (``pipelines.bench.timeline``) found no TBE kernel
running beside a dense one in a profiled step; a profiled step is host-bound, though (2.3 ms
of idle device a step), so it cannot say whether the device *would* run them together when
both are queued. This queues both ahead of the device and times, with CUDA events (median
of ``--iters``), on one production-shaped batch (``--config``, ctr-dlrm by default):

- ``dense_ms``: a DLRM-sized dense step on the current stream (the interaction's batched
  product and the over arch's fp32 MLP, forward and backward, at the batch's B);
- ``plan_ms``: the batch's backward plan (``module._plan_backward``: positions, sort, sorted
  operands, marks) on its side stream;
- ``update_ms``: the fused backward from that plan (the pieces kernels and the update) on a
  stream of its own (what a stale pipeline could run beside the next step's dense layers);
- ``both_*_ms``: each TBE part and the dense step queued together, the side stream at the
  default priority and at high priority.

Before each timed window the current stream sleeps (``torch.cuda._sleep``) until the host has
queued all of it; the sleep alone is timed and taken off. ``hidden`` = (alone + dense - both)
/ alone: the share of the TBE part's time the dense step absorbed (0: none, 1: all).
Writes DIR/probe_overlap.json with the commit and dirty flag.
"""

import argparse
import json
import os
import statistics

import torch

from tbe_plugin.benchmarks.backward import build_module, lookup
from tbe_plugin.benchmarks.common import generate_batches
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.benchmarks.suite import DEVICE_CONFIGS
from tbe_plugin.ops import training
from tbe_plugin.ops.backward_launch import runs_launch
from tbe_plugin.workloads import Workload


def hidden_share(alone_ms: float, dense_ms: float, both_ms: float) -> float:
    """The share of ``alone_ms`` that running beside the dense step hid (clamped to [0, 1])."""
    if alone_ms <= 0:
        raise ValueError(f"hidden_share: alone_ms must be > 0, got {alone_ms}")
    return min(1.0, max(0.0, (alone_ms + dense_ms - both_ms) / alone_ms))


class DenseStep:
    """The DLRM's dense work that does not depend on the embeddings' backward: the pairwise
    interaction (a batched product of F+1 rows of D) and the over arch, fp32, forward and
    backward, at the batch's B."""

    def __init__(self, batch_size: int, features: int, dim: int, device: torch.device):
        gen = torch.Generator(device).manual_seed(0)
        self.rows = torch.randn(batch_size, features + 1, dim, device=device, generator=gen, requires_grad=True)
        width = dim + (features + 1) * features // 2
        layers, sizes = [], [width, 1024, 1024, 512, 256, 1]
        for a, b in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        self.mlp = torch.nn.Sequential(*layers[:-1]).to(device)
        self.triu = torch.triu_indices(features + 1, features + 1, offset=1, device=device)

    def __call__(self) -> None:
        pairs = torch.bmm(self.rows, self.rows.transpose(1, 2))[:, self.triu[0], self.triu[1]]
        top = self.mlp(torch.cat([self.rows[:, 0], pairs], dim=1))
        top.sum().backward()


def _window(enqueue, sleep_cycles: int) -> float:
    """Device ms from the sleep's start to the end of everything ``enqueue`` queued."""
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    torch.cuda._sleep(sleep_cycles)
    for side in enqueue():
        stream.wait_stream(side)
    end.record(stream)
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _median(fn, iters: int) -> float:
    times = [fn() for _ in range(iters + 2)]
    return statistics.median(times[2:])


def probe(cfg, iters: int, sleep_cycles: int) -> dict:
    device = torch.device("cuda")
    batch = generate_batches(cfg, 1, device)[0][0]
    module = build_module("ours", cfg, "EXACT_ROWWISE_ADAGRAD", device)
    module.backward_launch = runs_launch()  # the plan in the forward, on the side stream
    out = lookup(module, batch)
    grad = torch.randn(out.shape, device=device, generator=torch.Generator(device).manual_seed(1))
    dim = max(t.dim for t in cfg.tables)
    dense = DenseStep(cfg.batch_size, len(cfg.tables), dim, device)
    update_stream = torch.cuda.Stream(device)

    def plan():
        early = module._plan_backward(batch.indices, batch.offsets, None, False, out)
        return [training._side_stream(device)], early

    def update(early):
        update_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(update_stream):
            module._fused_backward(grad, batch.indices, batch.offsets, None, False, early)
        return [update_stream]

    sleep_ms = _median(lambda: _window(lambda: [], sleep_cycles), iters)
    result = {"config": cfg.name, "lookups": batch.indices.numel(), "sleep_ms": sleep_ms}

    def timed(enqueue) -> float:
        return round(_median(lambda: _window(enqueue, sleep_cycles), iters) - sleep_ms, 4)

    result["dense_ms"] = timed(lambda: (dense(), [])[1])
    result["plan_ms"] = timed(lambda: plan()[0])
    prepared = [None]

    def prepare_then(fn):
        def run():
            prepared[0] = plan()[1]
            torch.cuda.synchronize()
            return _window(lambda: fn(prepared[0]), sleep_cycles)
        return round(_median(run, iters) - sleep_ms, 4)

    result["update_ms"] = prepare_then(update)
    for priority in (0, -1):
        key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
        training._SIDE_STREAMS[key] = torch.cuda.Stream(device, priority=priority)
        label = "high" if priority else "default"
        result[f"both_plan_{label}_ms"] = timed(lambda: (plan()[0], dense())[0])
        result[f"both_update_{label}_ms"] = prepare_then(lambda early: (update(early), dense())[0])
    for label in ("default", "high"):
        for part in ("plan", "update"):
            result[f"hidden_{part}_{label}"] = round(hidden_share(result[f"{part}_ms"], result["dense_ms"],
                                                                  result[f"both_{part}_{label}_ms"]), 3)  # fmt: skip
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default="ctr-dlrm")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--sleep-cycles", type=int, default=20_000_000, help="~10 ms at 2 GHz: the host queues all")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_overlap needs CUDA (it times streams on the device)")
    configs = {c.name: c for c in DEVICE_CONFIGS if isinstance(c, Workload)}
    if args.config not in configs:
        raise SystemExit(f"--config {args.config!r}: not a suite config (one of {sorted(configs)})")
    report = {"provenance": git_state(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "result": probe(configs[args.config], args.iters, args.sleep_cycles)}  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_overlap.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["result"], indent=1))
    return report


if __name__ == "__main__":
    main()
