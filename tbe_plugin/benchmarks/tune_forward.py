"""Sweep the pooled-forward launch parameters per shape class, on the device.

``python -m tbe_plugin.benchmarks.tune_forward --out DIR`` times every candidate
(BAGS, BLOCK_L, BLOCK_D, num_warps) on a few representative shapes and writes
DIR/tune_forward.json with the best candidate per shape beside what the current
heuristic (``pooled_launch_config``) picks, and the commit, device and versions measured.
The results feed that heuristic by hand; nothing reads them at run time. Outputs are
checked against the heuristic's output. Inputs come from ``tbe_plugin.workloads``: every
bag L ids, ids uniform or truncated Zipf(1.15) with the hot rows scattered.
"""

import argparse
import itertools
import json
import os
import sys

import torch
import triton

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.benchmarks.common import collect_environment
from tbe_plugin.ops.embedding_forward import _work_items, forward_into, pooled_launch_config
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

ZIPF_ALPHA = 1.15
# name -> (T, B, L, dims, weights dtype, Zipf alpha of the ids; 0 = uniform)
SHAPES = {
    "L20-D128-fp32": (32, 8192, 20, [128], torch.float32, 0.0),
    "L20-D128-fp16": (32, 8192, 20, [128], torch.float16, 0.0),
    "L20-D128-zipf": (32, 8192, 20, [128], torch.float32, ZIPF_ALPHA),
    "L20-D256-fp16": (32, 8192, 20, [256], torch.float16, 0.0),
    "L20-mixedD": (32, 8192, 20, [32, 64, 96, 128, 160, 192, 224, 256], torch.float32, 0.0),
    "L1-D128": (32, 65536, 1, [128], torch.float32, 0.0),
    "L100-D128": (32, 8192, 100, [128], torch.float32, 0.0),
    "L20-B512": (32, 512, 20, [128], torch.float32, 0.0),
    "L4-D64": (32, 16384, 4, [64], torch.float32, 0.0),
}


def candidates(L: int, max_dim: int, elem: int):
    """One-warp tiles of 8 to 128 ids (BAGS x BLOCK_L, BLOCK_L no longer than a bag),
    column blocks of 64-256, and 1-4 pipeline stages (the first sweep found one warp
    per program best everywhere)."""
    full_d = max(16, min(triton.next_power_of_2(max_dim), 1024 // elem))
    block_ds = sorted({full_d, min(full_d, 128)})
    max_l = triton.next_power_of_2(L)
    for ids_per_step, block_l, block_d, stages in itertools.product(
        (8, 16, 32, 64, 128), (1, 2, 4, 8, 16, 32, 64), block_ds, (1, 2, 3, 4)
    ):
        bags = ids_per_step // block_l
        if block_l > min(max_l, ids_per_step) or ids_per_step * block_d * elem > 32768:
            continue
        yield bags, block_l, block_d, 1, stages


def make_inputs(B, L, E, dims, alpha, device):
    """One batch of the project's generator: every bag L ids, ids Zipf(alpha) over E rows."""
    tables = tuple(TableWorkload(rows=E, dim=d, mean_pooling=L, pooling="fixed", alpha=alpha) for d in dims)
    indices, offsets, _ = generate_batch(Workload("tune", tables, B), seed=0, device=device)
    return indices, offsets


def time_ms(fn, iters=30):
    return triton.testing.do_bench(fn, warmup=5, rep=iters, return_mode="median")


def tune_shape(name, spec, E, budget):
    T, B, L, dims_cycle, dtype, alpha = spec
    dims = [dims_cycle[t % len(dims_cycle)] for t in range(T)]
    names = {torch.float32: "FP32", torch.float16: "FP16", torch.bfloat16: "BF16"}
    emb = TritonTableBatchedEmbeddingBags([(E, d) for d in dims], weights_precision=names[dtype],
                                          bounds_check_mode="WARNING", device="cuda")  # fmt: skip
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets = make_inputs(B, L, E, dims, alpha, "cuda")
    out = torch.empty(B, sum(dims), device="cuda")
    elem = emb.weights.element_size()
    reference = emb(indices, offsets)
    results = []
    for cand in itertools.islice(candidates(L, max(dims), elem), budget):
        work = _work_items(emb.feature_dims, cand[2], emb.device)

        def run(cand=cand, work=work):
            forward_into(out, emb.weights, emb.feature_meta, work, indices, offsets, None,
                         emb.bounds_check_status, 0, 1, emb._align, cand)  # fmt: skip

        try:
            run()
            ok = torch.allclose(out, reference, atol=1e-3, rtol=1e-4)
            ms = time_ms(run)
        except Exception as error:  # a candidate that does not compile is just skipped
            print(f"  {cand}: {type(error).__name__}", file=sys.stderr)
            continue
        results.append({"config": cand, "ms": ms, "ok": ok})
    heuristic = pooled_launch_config(L, max(dims), elem)
    h_work = _work_items(emb.feature_dims, heuristic[2], emb.device)
    h_ms = time_ms(lambda: forward_into(out, emb.weights, emb.feature_meta, h_work, indices, offsets,
                                        None, emb.bounds_check_status, 0, 1, emb._align, heuristic))
    results.sort(key=lambda r: r["ms"])
    row_bytes = sum(dims) * B * L * elem
    del emb
    torch.cuda.empty_cache()
    return {"shape": name, "heuristic": heuristic, "heuristic_ms": h_ms,
            "heuristic_tbps": row_bytes / h_ms / 1e9, "best": results[:8],
            "best_tbps": row_bytes / results[0]["ms"] / 1e9 if results else None,
            "candidates": len(results)}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--budget", type=int, default=400, help="max candidates per shape")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"environment": collect_environment(torch.device("cuda")), "rows": args.rows,
              "inputs": "tbe_plugin.workloads.generate_batch, seed 0, fixed L, Zipf alpha per shape", "shapes": []}
    for name in args.shapes.split(","):
        entry = tune_shape(name, SHAPES[name], args.rows, args.budget)
        best = entry["best"][0] if entry["best"] else None
        print(f"{name}: heuristic {entry['heuristic']} {entry['heuristic_ms']:.4f} ms; "
              f"best {best}", flush=True)  # fmt: skip
        report["shapes"].append(entry)
        with open(os.path.join(args.out, "tune_forward.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
