"""Sharding plans at scale, on paper: ``python -m tbe_plugin.torchrec.simulate``.

Plans a CTR-like model for Topologies of 8 to 1024 ranks (TorchRec's planner needs no GPU)
and prices each plan with ``tbe_plugin.torchrec.cost``: per world size and plan, the
max/mean of the ranks' costs, the predicted embedding step (the hottest rank's) and the
planning time. The plans:

- ``static``: whole tables placed from TorchRec's static guesses (pooling factor 1,
  uniform ids), what a job gets with no statistics and table-wise sharding;
- ``hybrid``: every sharding type, still from the static guesses;
- ``fdp``: ``partition.feedback_plan`` from the measured statistics;
- ``fdp_host_total`` (``--plans``, not run by default): ``fdp`` with TorchRec's host rule.

The statistics come from a real run, scaled: ``record`` runs the collector on CPU over
batches of ``tbe_plugin.workloads.ctr_mix`` and saves them (with the commit) under
``tbe_plugin/benchmarks/results/``; ``scale_statistics`` makes copies of its tables with
more rows (and a few of up to 1e9 rows), keeping each table's per-sample quantities
(pooling, shares, skew) and moving its hot rows with the rows. ``run`` writes the table to
``partition_simulation_<commit>.md`` / ``.json`` beside them.

Imports ``tbe_plugin.torchrec`` and ``tbe_plugin.workloads``; nothing imports it but tests.
"""

import argparse
import dataclasses
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

from tbe_plugin.torchrec.cost import RESULTS_DIR, CostModel, KernelSpeed, default_kernel_benchmark
from tbe_plugin.torchrec.stats import ROW_BUCKETS, FeatureStatistics, TableStatistics

WORLD_SIZES = (8, 64, 256, 1024)
PLANS = ("static", "hybrid", "fdp")
ABLATIONS = ("fdp_host_total",)
"""Plans run only when asked for: ``fdp_host_total`` is ``fdp`` with TorchRec's host rule
(the least total load) for row-shard groups instead of the hottest rank's."""
LOCAL_WORLD_SIZE = 8
"""Ranks per host (an 8-GPU host)."""
HBM_GB = 140.0
"""Memory per device the planner may fill (an H200's 141 GB)."""


def record_statistics(num_tables: int = 100, batch_size: int = 512, batches: int = 4, seed: int = 0) -> FeatureStatistics:
    """The collector's statistics over ``batches`` batches of ``ctr_mix(num_tables)`` at
    ``batch_size`` bags per table, drawn on CPU (seeds ``seed`` ..)."""
    import torch
    from torchrec import KeyedJaggedTensor

    from tbe_plugin.provenance import git_state
    from tbe_plugin.torchrec.stats import FeatureStatisticsCollector, TableInfo
    from tbe_plugin.workloads import ctr_mix, generate_batch

    workload = ctr_mix(num_tables=num_tables, batch_size=batch_size)
    tables = [TableInfo(f"t{i}", f"f{i}", t.rows, t.dim) for i, t in enumerate(workload.tables)]
    collector = FeatureStatisticsCollector(tables, torch.device("cpu"), sample_every=1)
    keys = [t.feature for t in tables]
    for b in range(batches):
        indices, offsets, _ = generate_batch(workload, seed + b, "cpu")
        collector.observe(KeyedJaggedTensor(keys=keys, values=indices, lengths=offsets.diff(), stride=batch_size))
    return collector.statistics({"source": f"tbe_plugin.workloads.ctr_mix(num_tables={num_tables}, "
                                           f"batch_size={batch_size}), seeds {seed}..{seed + batches - 1}, CPU",
                                 "workload": workload.describe(), **git_state()})  # fmt: skip


def _scaled_table(t: TableStatistics, name: str, rows: int, dim: int, shift_buckets: int) -> TableStatistics:
    """``t`` with ``rows`` rows and ``dim`` columns, its ids relabelled: scaled to the new
    rows and rotated by ``shift_buckets`` of the row buckets (another hash of the same ids,
    so that copies of a table keep their hot rows in other row ranges)."""
    buckets = len(t.row_buckets)
    shift_rows = shift_buckets * rows // buckets if buckets else 0
    heavy = [((min(int(r * rows / t.rows), rows - 1) + shift_rows) % rows, c) for r, c in t.heavy_rows]
    rotated = t.row_buckets[-shift_buckets:] + t.row_buckets[:-shift_buckets] if buckets and shift_buckets else t.row_buckets
    return dataclasses.replace(t, name=name, feature=f"f_{name}", rows=rows, dim=dim, heavy_rows=heavy,
                               row_buckets=list(rotated))  # fmt: skip


def scale_statistics(stats: FeatureStatistics, row_factors: Sequence[int] = (1, 4, 16), giant_tables: int = 4,
                     giant_rows: int = 10**9, giant_dim: int = 16) -> FeatureStatistics:
    """A bigger model from measured tables: one copy of every table per factor of
    ``row_factors`` with that many times the rows (same dim, pooling, skew; bucket shares
    and hot rows at the same relative place), and ``giant_tables`` copies of the most
    skewed tables with ``giant_rows`` rows at ``giant_dim`` (``giant_rows`` caps every table)."""
    if not row_factors or min(row_factors) < 1:
        raise ValueError(f"row_factors must be >= 1, got {tuple(row_factors)}")
    # Copy c of table i rotated by a fixed stride of buckets (the first copy as recorded).
    tables = [_scaled_table(t, f"{t.name}x{f}", min(t.rows * f, giant_rows), t.dim, (c * 389 + i * 97) % ROW_BUCKETS if c else 0)
              for c, f in enumerate(row_factors) for i, t in enumerate(stats.tables)]  # fmt: skip
    skewed = sorted(stats.tables, key=lambda t: -t.hot_0p1pct_share)[:giant_tables]
    tables += [_scaled_table(t, f"{t.name}giant", giant_rows, giant_dim, (i * 257 + 11) % ROW_BUCKETS)
               for i, t in enumerate(skewed)]
    provenance = {"scaled_from": stats.provenance, "row_factors": list(row_factors), "giant_tables": giant_tables,
                  "giant_rows": giant_rows, "giant_dim": giant_dim}  # fmt: skip
    return dataclasses.replace(stats, tables=tables, provenance=provenance)


def plan_once(stats: FeatureStatistics, world_size: int, plan: str, kernel: KernelSpeed, rank_batch_size: int,
              backend: str = "triton", hbm_gb: float = HBM_GB, local_world_size: int = LOCAL_WORLD_SIZE) -> Dict[str, Any]:
    """One plan at one world size: its report's numbers and the planning time."""
    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec._compat import triton_kernel
    from tbe_plugin.torchrec.partition import feedback_plan, meta_collection, plan_preset

    if plan not in PLANS + ABLATIONS:
        raise ValueError(f"plan {plan!r} is not one of {PLANS + ABLATIONS}")
    topology = Topology(world_size=world_size, local_world_size=min(local_world_size, world_size),
                        compute_device="cuda", hbm_cap=int(hbm_gb * 2**30))  # fmt: skip
    model = CostModel.from_topology(topology, kernel, rank_batch_size)
    compute_kernel = triton_kernel() if backend == "triton" else "fused"
    module, sharders = meta_collection(stats), get_sharders(backend)
    began = time.process_time()
    if plan in ("fdp", "fdp_host_total"):
        result = feedback_plan(module, sharders, topology, stats, model, compute_kernel,
                               host_placement="rank_max" if plan == "fdp" else "host_total")
    else:
        result = plan_preset(module, sharders, topology, stats, model, "table_wise" if plan == "static" else "hybrid",
                             compute_kernel)  # fmt: skip
    planning_s = time.process_time() - began
    types: Dict[str, int] = {}
    for s in result.shards:
        types[s.sharding_type] = types.get(s.sharding_type, 0) + 1
    return {"world_size": world_size, "plan": plan, "max_over_mean": result.report.max_over_mean,
            "predicted_step_ms": result.report.predicted_step_ms, "planning_s": planning_s,
            "rounds": result.rounds, "shards": len(result.shards), "shards_by_type": types,
            "hottest_tables": [s["table"] for s in result.report.hottest_tables()]}  # fmt: skip


def simulate(stats: FeatureStatistics, world_sizes: Sequence[int] = WORLD_SIZES, plans: Sequence[str] = PLANS,
             kernel: Optional[KernelSpeed] = None, rank_batch_size: int = 4096, **kwargs: Any) -> List[Dict[str, Any]]:
    """``plan_once`` for every world size and plan; a plan that fails is a row with its error."""
    kernel = kernel or KernelSpeed.from_benchmark(default_kernel_benchmark())
    rows = []
    for world_size in world_sizes:
        for plan in plans:
            try:
                rows.append(plan_once(stats, world_size, plan, kernel, rank_batch_size, **kwargs))
            except Exception as error:  # a plan that does not fit is a result of the simulation, named
                rows.append({"world_size": world_size, "plan": plan, "error": f"{type(error).__name__}: {error}"[:400]})
            print(_row_line(rows[-1]), flush=True)
    return rows


def _row_line(row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['world_size']:>5} {row['plan']:>7}  error: {row['error']}"
    return (f"{row['world_size']:>5} {row['plan']:>7}  max/mean {row['max_over_mean']:7.2f}  "
            f"step {row['predicted_step_ms']:9.3f} ms  planned in {row['planning_s']:6.2f} s CPU ({row['rounds']} rounds)  {row['shards_by_type']}")


def to_markdown(rows: List[Dict[str, Any]], header: Dict[str, Any]) -> str:
    lines = ["# Partition simulation", "", f"Commit {header['git_commit']} (dirty: {header['git_dirty']}). "
             f"{header['tables']} tables, {header['rank_batch_size']} bags per rank and feature, "
             f"{header['local_world_size']} ranks per host, {header['hbm_gb']} GB per device. Statistics: "
             f"{header['statistics']}. Kernel speeds: {header['kernel']}.", "",
             "Planning: process CPU time of the planner (TorchRec's enumerator, estimators, proposer and partitioner, "
             "and for fdp every round), one thread.", "",
             "| ranks | plan | max/mean | predicted embedding step (ms) | planning CPU (s) | rounds | shards by type |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['world_size']} | {r['plan']} | error: {r['error'][:120]} | | | | |")
            continue
        types = ", ".join(f"{k} {v}" for k, v in sorted(r["shards_by_type"].items()))
        lines.append(f"| {r['world_size']} | {r['plan']} | {r['max_over_mean']:.2f} | {r['predicted_step_ms']:.2f} | "
                     f"{r['planning_s']:.1f} | {r['rounds']} | {types} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tbe_plugin.torchrec.simulate", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record", help="record statistics of ctr_mix batches on CPU and save them")
    record.add_argument("--tables", type=int, default=100)
    record.add_argument("--batch-size", type=int, default=512)
    record.add_argument("--batches", type=int, default=4)
    record.add_argument("--out", help="JSON path (default: results/partition_stats_ctr_mix_<commit>.json)")
    run = sub.add_parser("run", help="plan the scaled model at each world size and write the table")
    run.add_argument("--statistics", required=True, help="recorded statistics (record's JSON)")
    run.add_argument("--world-sizes", type=int, nargs="+", default=list(WORLD_SIZES))
    run.add_argument("--plans", nargs="+", default=list(PLANS), choices=PLANS + ABLATIONS)
    run.add_argument("--row-factors", type=int, nargs="+", default=[1, 4, 16])
    run.add_argument("--giant-tables", type=int, default=4)
    run.add_argument("--rank-batch-size", type=int, default=4096)
    run.add_argument("--kernel-benchmark", help="backward benchmark JSON (default: the current H200 one)")
    run.add_argument("--out-dir", default=RESULTS_DIR)
    run.add_argument("--tag", default="", help="suffix of the results' names (an ablation beside the main table)")
    args = parser.parse_args(argv)

    import torch

    from tbe_plugin.provenance import git_state

    torch.set_num_threads(1)  # planning times are process time on one core
    state = git_state()
    if args.command == "record":
        stats = record_statistics(args.tables, args.batch_size, args.batches)
        out = args.out or os.path.join(RESULTS_DIR, f"partition_stats_ctr_mix_{state['git_commit'][:7]}.json")
        stats.save(out)
        print(f"wrote {out}: {len(stats.tables)} tables, hot 1% share "
              f"{min(t.hot_1pct_share for t in stats.tables):.2f}..{max(t.hot_1pct_share for t in stats.tables):.2f}")
        return
    stats = scale_statistics(FeatureStatistics.load(args.statistics), args.row_factors, args.giant_tables)
    kernel = KernelSpeed.from_benchmark(args.kernel_benchmark or default_kernel_benchmark())
    rows = simulate(stats, args.world_sizes, args.plans, kernel, args.rank_batch_size)
    header = {**state, "tables": len(stats.tables), "rank_batch_size": args.rank_batch_size,
              "local_world_size": LOCAL_WORLD_SIZE, "hbm_gb": HBM_GB, "kernel": kernel.source,
              "statistics": f"{os.path.basename(args.statistics)} scaled (row factors {args.row_factors}, "
                            f"{args.giant_tables} tables of 1e9 rows)", "max_rows": max(t.rows for t in stats.tables)}  # fmt: skip
    tag = f"_{args.tag}" if args.tag else ""
    base = os.path.join(args.out_dir, f"partition_simulation_{state['git_commit'][:7]}{tag}")
    with open(base + ".json", "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(to_markdown(rows, header))
    print(f"wrote {base}.md and .json")


if __name__ == "__main__":
    main()
