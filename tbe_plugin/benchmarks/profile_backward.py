"""Where the fused backward's time goes, and how its launch sizes trade off, on the device.

``python -m tbe_plugin.benchmarks.profile_backward --out DIR`` runs forward + backward on
the reference shape (T=32, B=8192, L=20, D=128, E=1e6, fp32; uniform and Zipf ids; other B,
L with ``--shapes``) for
each optimizer asked, under ``torch.profiler``, and writes DIR/profile_backward.json with
the CUDA time of every kernel (ours: positions, sort, chunk, crossing; plus torch's), and
the backward's median time for each candidate launch size (``CANDIDATES``). Nothing reads
it at run time: it tells the next change what to work on.
"""

import argparse
import json
import os
import statistics

import numpy

import torch
from torch.profiler import ProfilerActivity, profile

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops import embedding_backward

# Launch sizes tried, each a set of embedding_backward attributes over the defaults.
CANDIDATES = [
    {},
    {"CROSSING_WARPS": 4},
    {"SEGMENTS_PER_PROGRAM": 1},
    {"SEGMENTS_PER_PROGRAM": 16},
    {"CROSSING_CHUNKS_PER_PROGRAM": 256},
]


def make_batch(T, B, L, E, zipf, device):
    if zipf:  # Zipf(1.15) ranks below E (rejecting the rest), shuffled over the rows
        rng = numpy.random.default_rng(0)
        ranks = rng.zipf(1.15, size=T * B * L)
        while (too_big := ranks > E).any():
            ranks[too_big] = rng.zipf(1.15, size=int(too_big.sum()))
        ids = torch.randperm(E, device=device)[torch.from_numpy(ranks - 1).to(device)]
    else:
        ids = torch.randint(0, E, (T * B * L,), device=device)
    return ids, torch.arange(0, T * B * L + 1, L, device=device)


def time_backward(emb, indices, offsets, grad, iters=10):
    """Median ms of ``out.backward(grad)`` after an untimed forward (FBGEMM's bwd-only)."""
    times = []
    for _ in range(iters + 2):
        out = emb(indices, offsets)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out.backward(grad)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def kernel_breakdown(emb, indices, offsets, grad):
    out = emb(indices, offsets)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        cuda_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if cuda_us:
            rows.append({"name": event.key[:120], "cuda_ms": cuda_us / 1e3, "calls": event.count})
    return sorted(rows, key=lambda r: -r["cuda_ms"])[:15]


def host_breakdown(emb, indices, offsets, grad, iters=20):
    """Host time of ``out.backward(grad)`` (launches only: the device is idle when it
    starts, and nothing waits for it), median over ``iters``, and the host-side ops under
    torch.profiler by self CPU time."""
    import time

    times = []
    for _ in range(iters):
        out = emb(indices, offsets)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out.backward(grad)
        times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    out = emb(indices, offsets)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out.backward(grad)
    torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]
    return {
        "host_ms_median": statistics.median(times),
        "ops": [{"name": e.key[:100], "self_cpu_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in ops],
    }


def fbgemm_breakdown(optimizer, rows, T, D, indices, offsets, grad):
    """FBGEMM's kernels on the same batch, for comparison ([] when fbgemm_gpu is absent)."""
    try:
        from tbe_plugin.benchmarks.common import fbgemm_api

        api = fbgemm_api()
        emb = api.SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, D, api.EmbeddingLocation.DEVICE, api.ComputeDevice.CUDA)] * T,
            optimizer=api.EmbOptimType[optimizer],
        )
    except Exception as error:  # noqa: BLE001 - reported, not fatal
        return [{"error": f"{type(error).__name__}: {error}"[:200]}]
    entry = kernel_breakdown(emb, indices, offsets, grad)
    entry.append({"name": "bwd median ms", "cuda_ms": time_backward(emb, indices, offsets, grad)})
    return entry


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--optimizers", default="EXACT_ROWWISE_ADAGRAD,ADAM")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-fbgemm", action="store_true", help="skip FBGEMM's kernel breakdown")
    parser.add_argument(
        "--shapes", default="8192x20:uniform,8192x20:zipf",
        help="BxL:ids items (ids uniform or zipf); e.g. 65536x20:uniform, 8192x100:uniform",
    )  # fmt: skip
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    T, D = 32, 128
    report = []
    for optimizer in args.optimizers.split(","):
        for shape in args.shapes.split(","):
            batch_len, ids = shape.split(":")
            B, L = (int(x) for x in batch_len.split("x"))
            zipf = ids == "zipf"
            emb = TritonTableBatchedEmbeddingBags([(args.rows, D)] * T, optimizer=optimizer, device="cuda")
            indices, offsets = make_batch(T, B, L, args.rows, zipf, "cuda")
            grad = torch.randn(B, T * D, device="cuda")
            fbgemm = [] if args.no_fbgemm else fbgemm_breakdown(optimizer, args.rows, T, D, indices, offsets, grad)
            entry = {"optimizer": optimizer, "B": B, "L": L, "zipf": zipf, "candidates": [], "fbgemm_kernels": fbgemm,
                     "kernels": kernel_breakdown(emb, indices, offsets, grad),
                     "host": host_breakdown(emb, indices, offsets, grad) if B * L <= 16384 else None}  # fmt: skip
            for overrides in CANDIDATES:
                saved = {name: getattr(embedding_backward, name) for name in overrides}
                for name, value in overrides.items():
                    setattr(embedding_backward, name, value)
                ms = time_backward(emb, indices, offsets, grad)
                for name, value in saved.items():
                    setattr(embedding_backward, name, value)
                entry["candidates"].append({"overrides": overrides, "bwd_ms": ms})
                print(optimizer, shape, overrides or "defaults", f"{ms:.3f} ms", flush=True)
            report.append(entry)
            del emb
            torch.cuda.empty_cache()
            with open(os.path.join(args.out, "profile_backward.json"), "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
