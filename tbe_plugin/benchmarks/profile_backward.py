"""Where the fused backward's time goes, and how its launch sizes trade off, on the device.

``python -m tbe_plugin.benchmarks.profile_backward --out DIR`` runs forward + backward on
the reference shape (T=32, B=8192, L=20, D=128, E=1e6, fp32; uniform and Zipf ids) for
each optimizer asked, under ``torch.profiler``, and writes DIR/profile_backward.json with
the CUDA time of every kernel (ours: positions, sort, chunk, crossing; plus torch's), and
the backward's median time for each candidate (CHUNK_ELEMENTS, CHUNK_WARPS). Nothing reads
it at run time: it tells the next change what to work on.
"""

import argparse
import json
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops import embedding_backward

CANDIDATES = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]


def make_batch(T, B, L, E, zipf, device):
    if zipf:
        ranks = torch.empty(T * B * L, device=device).exponential_(1.0 / (1.15 - 1.0))
        ids = (torch.exp(ranks).clamp(max=2.0**40).long() - 1) % E
        ids = torch.randperm(E, device=device)[ids]
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
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    T, B, L, D = 32, 8192, 20, 128
    report = []
    for optimizer in args.optimizers.split(","):
        for zipf in (False, True):
            emb = TritonTableBatchedEmbeddingBags([(args.rows, D)] * T, optimizer=optimizer, device="cuda")
            indices, offsets = make_batch(T, B, L, args.rows, zipf, "cuda")
            grad = torch.randn(B, T * D, device="cuda")
            entry = {"optimizer": optimizer, "zipf": zipf, "kernels": kernel_breakdown(emb, indices, offsets, grad),
                     "candidates": [], "fbgemm_kernels": [] if args.no_fbgemm else fbgemm_breakdown(optimizer, args.rows, T, D, indices, offsets, grad)}  # fmt: skip
            for elements, warps in CANDIDATES:
                embedding_backward.CHUNK_ELEMENTS, embedding_backward.CHUNK_WARPS = elements, warps
                ms = time_backward(emb, indices, offsets, grad)
                entry["candidates"].append(
                    {"chunk_elements": elements, "warps": warps, "bwd_ms": ms}
                )
                print(optimizer, "zipf" if zipf else "uniform", elements, warps, f"{ms:.3f} ms", flush=True)
            report.append(entry)
            del emb
            torch.cuda.empty_cache()
            with open(os.path.join(args.out, "profile_backward.json"), "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
