"""Sweep the pooled-forward launch parameters per shape class, on the device.

``python -m tbe_plugin.benchmarks.tune_forward --out DIR`` times every candidate
(BAGS, BLOCK_L, BLOCK_D, num_warps) on a few representative shapes and writes
DIR/tune_forward.json with the best candidate per shape beside what the current
heuristic (``module_launch_config``) picks, and the commit, device and versions measured.
The results feed that heuristic by hand; nothing reads them at run time. Outputs are
checked against the heuristic's output. Inputs come from ``tbe_plugin.workloads``: every
bag L ids, ids uniform or truncated Zipf(1.15) with the hot rows scattered (``SHAPES``); or
production-shaped tables with Poisson bags of per-table means and per-table skew
(``WORKLOADS``: the end-to-end benchmark's 30 DLRM tables and the kernel suite's
production configs: ctr-mix, user ids, long bags, D=512 fp16), where one launch config
serves tables of very different bag lengths.
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
from tbe_plugin.ops.embedding_forward import (_work_items, forward_into, module_launch_config, pooled_tile_classes,
                                              wide_rows)
from tbe_plugin.benchmarks.suite import DEVICE_PRODUCTION
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

ZIPF_ALPHA = 1.15
# name -> (T, B, L, dims, weights dtype, Zipf alpha of the ids; 0 = uniform)
SHAPES = {
    "L20-D128-fp32": (32, 8192, 20, [128], torch.float32, 0.0),
    "L20-D128-fp16": (32, 8192, 20, [128], torch.float16, 0.0),
    "L20-D128-bf16": (32, 8192, 20, [128], torch.bfloat16, 0.0),
    "L20-D128-zipf": (32, 8192, 20, [128], torch.float32, ZIPF_ALPHA),
    "L10-D128-fp32": (32, 8192, 10, [128], torch.float32, 0.0),
    "L10-D128-fp16": (32, 8192, 10, [128], torch.float16, 0.0),
    "L10-D128-zipf": (32, 8192, 10, [128], torch.float32, ZIPF_ALPHA),
    "L20-D256-fp16": (32, 8192, 20, [256], torch.float16, 0.0),
    "L20-mixedD": (32, 8192, 20, [32, 64, 96, 128, 160, 192, 224, 256], torch.float32, 0.0),
    "L1-D128": (32, 65536, 1, [128], torch.float32, 0.0),
    "L100-D128": (32, 8192, 100, [128], torch.float32, 0.0),
    "L20-B512": (32, 512, 20, [128], torch.float32, 0.0),
    "L4-D64": (32, 16384, 4, [64], torch.float32, 0.0),
    # Wide rows (whole-row column blocks, ``embedding_forward.wide_rows``): 2-byte rows
    # uniform (no L2 help) and 4-byte rows as skewed as the suite's wide-d512-fp16.
    "L20-D512-fp16": (16, 8192, 20, [512], torch.float16, 0.0),
    "L20-D512-fp32-zipf": (16, 8192, 20, [512], torch.float32, 1.05),
}
# name -> a production-shaped workload (its own rows, dims, bag-length laws and skew): the
# kernel suite's production configs, the end-to-end benchmark's tables (ctr-dlrm) among them
# (but FBGEMM's fixed-length B=512, which ``SHAPES`` has as L20-B512).
WORKLOADS = {w.name: w for w in DEVICE_PRODUCTION if isinstance(w, Workload)}


def candidates(L: int, max_dim: int, elem: int, first=()):
    """``first`` (configs to try before the others), then one-warp tiles of 8 to 128 ids
    (BAGS x BLOCK_L, BLOCK_L no longer than a bag), column blocks of 64-256, and 1-4
    pipeline stages (the first sweep, on fixed-length bags, found one warp per program
    best everywhere)."""
    yield from first
    full_d = max(16, min(triton.next_power_of_2(max_dim), 1024 // elem))
    block_ds = sorted({full_d, min(full_d, 128)})
    max_l = triton.next_power_of_2(L)
    for ids_per_step, block_l, block_d, stages in itertools.product(
        (8, 16, 32, 64, 128), (1, 2, 4, 8, 16, 32, 64), block_ds, (1, 2, 3, 4)
    ):
        bags = ids_per_step // block_l
        if block_l > min(max_l, ids_per_step) or ids_per_step * block_d * elem > 32768:
            continue
        for prefetch in (0, 1) if stages == 1 else (0,):
            config = (bags, block_l, block_d, 1, stages, prefetch)
            if config not in first and config[:5] not in first:
                yield config


def production_first(max_dim: int, elem: int):
    """Configs tried first on Poisson bags of mixed lengths (5 values: no PREFETCH; 6: the
    sixth is PREFETCH): a warp per bag over 8 or 16 ids a step (FBGEMM's forward gives
    each bag a warp), several bags on a warp each (2-4 warps a program), and the
    fixed-length heuristic's tiles."""
    block_d = max(16, min(triton.next_power_of_2(max_dim), 128))
    configs = [(1, block_l, block_d, 1, stages) for block_l in (8, 16) for stages in (1, 2, 3)]
    configs += [(bags, block_l, block_d, bags, stages) for bags in (2, 4) for block_l in (4, 8) for stages in (1, 2)]
    configs += [(16, 2, block_d, 1, 3), (8, 4, block_d, 1, 3), (16, 1, block_d, 1, 3)]
    # With each step's ids loaded a step ahead (PREFETCH), first: a step then waits on one
    # memory latency instead of two. A warp a bag, 4-8 rows of a bag in flight a thread
    # (sm_90: 96 registers at (1, 8), no spills), 1-8 warps a program (1-warp programs stop
    # at 32 a multiprocessor); then the heuristic's tiles (254 registers at (16, 2), spilling).
    ahead = [(bags, block_l, block_d, bags, 1, 1) for bags, block_l in ((1, 8), (1, 4), (2, 4), (4, 4), (2, 8), (4, 8),
                                                                         (8, 4), (1, 16))]  # fmt: skip
    ahead += [(16, 2, block_d, 1, 1, 1), (8, 4, block_d, 1, 1, 1)]
    # The heuristic's tile spread over 2-8 warps (ptxas sm_90, fp32: (16, 2) on one warp 255
    # registers and spills; (16, 2) over 4 warps and (32, 1) over 4 spill nothing), never timed
    # before b8c7017's Nsight Compute profile showed the one-warp tile at 12% occupancy.
    ahead += [(16, 2, block_d, 2, 1, 1), (16, 2, block_d, 4, 1, 1), (32, 1, block_d, 4, 1, 1),
              (32, 2, block_d, 8, 1, 1), (8, 2, block_d, 1, 1, 1)]
    # The warp kernel (FLAT 3, ops.forward_warp: an id a lane, 60-64 registers), first: a bag a
    # program (the heuristic's for bags of 24-48 ids since 59738aa). (Groups of 2-8 bags a
    # program one after another, the next group's ids loaded during this group's rows, were
    # timed at 9bc6bf3 and removed: no faster where right, and wrong on the GPU with Poisson
    # bags: results/tune_forward_h200_9bc6bf3_seq.json.)
    # FLAT 4, the same kernel's lean rows (a bag a program; 44% fewer instructions a row in the
    # hot loop at fp32, 34% at fp16, ptxas sm_90 at 8c9bd8a; untimed when written), first.
    warp = [(1, unroll, block_d, 1, 1, 0, flat) for flat in (4, 3) for unroll in (8, 32)]
    return tuple(warp + ahead + configs)


def time_ms(fn, iters=30):
    return triton.testing.do_bench(fn, warmup=5, rep=iters, return_mode="median")


def shape_workload(spec, E) -> Workload:
    """A ``SHAPES`` entry as a workload: T tables of E rows, every bag L ids."""
    T, B, L, dims_cycle, dtype, alpha = spec
    precision = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    tables = tuple(TableWorkload(rows=E, dim=dims_cycle[t % len(dims_cycle)], mean_pooling=L, pooling="fixed",
                                 alpha=alpha) for t in range(T))  # fmt: skip
    return Workload("tune", tables, B, weights_precision=precision)


def tune_shape(name, workload: Workload, budget, per_class=False, extra=(), weighted=False):
    """The sweep of one shape: a list of one entry, or with ``per_class`` one per tile class
    of its features (``pooled_tile_classes``, from the batch's mean bag length as
    ``launch_forward`` computes it: the module launches once per class), each class's
    candidates sized for its rows and checked on its features' columns. ``extra``: configs
    timed right after the heuristic's (none wider than a class's rows). The module and the
    batch are built once for all classes. ``weighted``: per-sample weights U(0, 1) on every id
    (the heuristic then as the module picks it: ``module_launch_config``)."""
    B = workload.batch_size
    dims = [t.dim for t in workload.tables]
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in workload.tables],
                                          weights_precision=workload.weights_precision.upper(),
                                          bounds_check_mode="WARNING", device="cuda")  # fmt: skip
    emb.init_embedding_weights_uniform(-1, 1)
    indices, offsets, _ = generate_batch(workload, seed=0, device="cuda")
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(1)).cuda() if weighted else None
    avg_len = indices.numel() / (offsets.numel() - 1)
    L = max(1, round(avg_len))  # the mean bag length, as the heuristic sees it
    out = torch.empty(B, sum(dims), device="cuda")
    elem = emb.weights.element_size()
    reference = emb(indices, offsets, psw)
    with torch.no_grad():  # the module's own forward: a launch per column tile of mixed D
        module_ms = time_ms(lambda: emb(indices, offsets, psw))
    starts = [sum(dims[:f]) for f in range(len(dims))]
    mixed_pooling = len({t.mean_pooling for t in workload.tables}) > 1

    def sweep(tile_class):
        features = tile_class[1] if tile_class is not None else None
        class_dims = [dims[f] for f in features] if features is not None else dims
        columns = (torch.cat([torch.arange(starts[f], starts[f] + dims[f]) for f in features]).cuda()
                   if features is not None else slice(None))  # fmt: skip
        tables = [workload.tables[f] for f in features] if features is not None else workload.tables
        longest = max(round(t.mean_pooling) for t in tables)
        max_dim = tile_class[0] if tile_class is not None else max(dims)
        first = production_first(max(class_dims), elem) if mixed_pooling else ()
        # The heuristic's own tile with and without PREFETCH (one stage, or its stages), timed first.
        heuristic = module_launch_config(L, max_dim, emb.weights, class_dims)
        bags, block_l, block_d, warps, stages, prefetch, *flat = heuristic
        siblings = [tuple(heuristic), (bags, block_l, block_d, warps, 3 if prefetch else 1, 1 - prefetch, *flat)]
        if flat and flat[0] == 3:  # the warp kernel takes no PREFETCH: its sibling takes three stages
            siblings[1] = (bags, block_l, block_d, warps, 3, 0, *flat)
        ahead = tuple(c for c in extra if c[2] <= triton.next_power_of_2(max(class_dims)))
        first = tuple(siblings) + tuple(c for c in (*ahead, *first) if c not in siblings)

        def work_items(config):
            """As the module launches: one class whose rows fit one column block gets a program
            column per feature (None: direct; FLAT 4 then loads whole rows when every D is the block)."""
            if features is None and max(dims) <= config[2]:
                return None
            return _work_items(emb.feature_dims, config[2], emb.device, features)

        results = []
        for cand in itertools.islice(candidates(longest, max(class_dims), elem, first), budget):
            work = work_items(cand)

            def run(cand=cand, work=work):
                forward_into(out, emb.weights, emb.feature_meta, work, indices, offsets, psw,
                             emb.bounds_check_status, 0, 1, emb._align, cand)  # fmt: skip

            try:
                run()
                ok = torch.allclose(out[:, columns], reference[:, columns], atol=1e-3, rtol=1e-4)
                ms = time_ms(run)
            except Exception as error:  # a candidate that does not compile is just skipped
                print(f"  {cand}: {type(error).__name__}", file=sys.stderr)
                continue
            results.append({"config": cand, "ms": ms, "ok": ok})
        heuristic = siblings[0]
        h_work = work_items(heuristic)
        h_ms = time_ms(lambda: forward_into(out, emb.weights, emb.feature_meta, h_work, indices, offsets,
                                            psw, emb.bounds_check_status, 0, 1, emb._align, heuristic))
        results.sort(key=lambda r: r["ms"])
        row_bytes = _row_bytes(workload, offsets, elem, features)
        return {"shape": name, "tile_class": [max_dim, len(features)] if features is not None else None,
                "class_dims": sorted(set(class_dims)), "heuristic": heuristic, "heuristic_ms": h_ms,
                "heuristic_tbps": row_bytes / h_ms / 1e9, "module_ms": module_ms, "best": results[:8],
                "best_tbps": row_bytes / results[0]["ms"] / 1e9 if results else None,
                "candidates": len(results)}  # fmt: skip

    groups = list(pooled_tile_classes(dims, wide_rows(avg_len, elem))) if per_class else []
    entries = [sweep(group) for group in groups] if len(groups) > 1 else [sweep(None)]
    del emb
    torch.cuda.empty_cache()
    return entries


def _row_bytes(workload: Workload, offsets: torch.Tensor, elem: int, features=None) -> int:
    """Bytes of the rows a batch reads (of ``features``, all when None): every lookup's row
    (repeated ids counted)."""
    B = workload.batch_size
    per_table = (offsets[B::B] - offsets[:-1:B]).tolist()  # lookups of each table
    keep = set(features) if features is not None else set(range(len(per_table)))
    return sum(n * t.dim * elem for f, (n, t) in enumerate(zip(per_table, workload.tables)) if f in keep)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join([*SHAPES, *WORKLOADS])}")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--budget", type=int, default=400, help="max candidates per shape")
    parser.add_argument("--first", default="", help="configs timed first, after the heuristic's: "
                        "BAGS,BLOCK_L,BLOCK_D,WARPS,STAGES,PREFETCH;... (a BLOCK_D above a class's tile is skipped)")
    parser.add_argument("--weighted", action="store_true", help="per-sample weights U(0, 1) on every id")
    parser.add_argument("--per-class", action="store_true",
                        help="sweep each tile class of a mixed-D shape on its own (the module's launches)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"environment": collect_environment(torch.device("cuda")), "rows": args.rows,
              "inputs": "tbe_plugin.workloads.generate_batch, seed 0: SHAPES fixed L and one Zipf alpha per shape; "
                        "WORKLOADS their own tables", "weighted": args.weighted, "shapes": []}  # fmt: skip
    first = tuple(tuple(int(v) for v in c.split(",")) for c in args.first.split(";") if c)
    for name in args.shapes.split(","):
        if name not in SHAPES and name not in WORKLOADS:
            raise SystemExit(f"unknown shape {name!r}; shapes: {', '.join([*SHAPES, *WORKLOADS])}")
        workload = WORKLOADS[name] if name in WORKLOADS else shape_workload(SHAPES[name], args.rows)
        for entry in tune_shape(name, workload, args.budget, args.per_class, first, args.weighted):
            best = entry["best"][0] if entry["best"] else None
            print(f"{name} {entry['class_dims']}: heuristic {entry['heuristic']} {entry['heuristic_ms']:.4f} ms "
                  f"(module {entry['module_ms']:.4f}); best {best}", flush=True)  # fmt: skip
            report["shapes"].append(entry)
        with open(os.path.join(args.out, "tune_forward.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
