"""What ``RunsLaunch.hot_split`` leaves to the sort: ``python -m tbe_plugin.benchmarks.probe_hot_split --out DIR``.

A count, not a timing (it runs on the CPU). For production-shaped batches (``--configs``: the
suite's ctr-dlrm, long-bags and ctr-mix by default) and each number of hot rows a table
(``--hot``) and sample of ids a feature (``--samples``), the hot rows are chosen as the backward
chooses them (``hot_product.select_hot_rows``, which ``choose_hot_rows``' kernel matches bit for
bit) and the batch's ids split:

- ``hot_share``: the share of the ids that are hot (summed by the counts' product, out of the
  sort); ``oracle_share``: the share the batch's own K most frequent rows a table would take
  (what a perfect choice would remove);
- of the ids left, what the sort and the pieces kernel see: their number, their distinct rows,
  the ids in runs of at most ``piece_short`` (16: the short launch) and in longer runs, and
  the longest run.

K = 0 is the default backward (every id sorted). Writes DIR/probe_hot_split.json with the
commit and dirty flag. ``--smoke``: a tiny workload (the tests run it).
"""

import argparse
import json

import torch

from tbe_plugin.benchmarks.report import git_state, write_json
from tbe_plugin.ops.hot_product import hot_tables, select_hot_rows
from tbe_plugin.ops.indexing import META_COLS, META_ROW_BASE, META_ROWS
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

SMOKE = Workload("smoke-split", tuple(TableWorkload(rows=400, dim=8, mean_pooling=5, alpha=1.2) for _ in range(3)),
                 batch_size=64)  # fmt: skip
SHORT = 16  # RunsLaunch.piece_short: runs of at most this many ids take the short launch


def feature_meta(workload: Workload) -> torch.Tensor:
    """The columns of a module's feature metadata the choice reads (rows, first global row)."""
    rows = [t.rows for t in workload.tables]
    meta = torch.zeros(len(rows), META_COLS, dtype=torch.int64)
    meta[:, META_ROWS] = torch.tensor(rows)
    meta[:, META_ROW_BASE] = torch.tensor([0, *torch.tensor(rows).cumsum(0)[:-1].tolist()])
    return meta


def global_rows(meta: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Each id's global row (its feature's first row plus the id)."""
    lengths = offsets[1:] - offsets[:-1]
    features = torch.repeat_interleave(torch.arange(lengths.numel()) // batch_size, lengths)
    return meta[features, META_ROW_BASE] + indices.long()


def runs(rows: torch.Tensor) -> dict:
    """What the sort and the pieces kernel see of these ids."""
    if rows.numel() == 0:
        return {"ids": 0, "distinct_rows": 0, "ids_in_short_runs": 0, "ids_in_long_runs": 0, "longest_run": 0}
    _, counts = torch.unique(rows, return_counts=True)
    short = counts <= SHORT
    return {"ids": int(rows.numel()), "distinct_rows": int(counts.numel()),
            "ids_in_short_runs": int(counts[short].sum()), "ids_in_long_runs": int(counts[~short].sum()),
            "longest_run": int(counts.max())}  # fmt: skip


def oracle_share(rows: torch.Tensor, meta: torch.Tensor, hot: int) -> float:
    """The share of ids in each table's ``hot`` most frequent rows of the batch."""
    unique, counts = torch.unique(rows, return_counts=True)
    table = torch.searchsorted(meta[:, META_ROW_BASE].contiguous(), unique, right=True) - 1
    taken = 0
    for t in torch.unique(table).tolist():
        taken += int(torch.topk(counts[table == t], min(hot, int((table == t).sum()))).values.sum())
    return taken / rows.numel()


def probe(workload: Workload, hots: list[int], samples: list[int], seed: int = 0) -> dict:
    indices, offsets, _ = generate_batch(workload, seed, "cpu")
    meta, B = feature_meta(workload), workload.batch_size
    rows = global_rows(meta, indices, offsets, B)
    tables = hot_tables(meta)
    total_rows = sum(t.rows for t in workload.tables)
    out = {"config": workload.name, "ids": int(rows.numel()), "default": runs(rows), "split": []}
    bounds = offsets[::B].tolist()
    for hot in hots:
        oracle = oracle_share(rows, meta, hot)
        for sample in samples:
            _, per_feature = select_hot_rows(indices, offsets, meta, tables, B, hot, sample, False, total_rows)
            is_hot = torch.zeros(rows.numel(), dtype=torch.bool)
            for f in range(meta.shape[0]):  # a feature at a time: its ids against its hot rows (ascending)
                mine, part = per_feature[f], rows[bounds[f] : bounds[f + 1]]
                slot = torch.searchsorted(mine, part).clamp(max=hot - 1)
                is_hot[bounds[f] : bounds[f + 1]] = mine[slot] == part
            share = float(is_hot.float().mean())
            out["split"].append({"hot_rows": hot, "sample": sample, "hot_share": round(share, 4),
                                 "oracle_share": round(oracle, 4), "left": runs(rows[~is_hot])})  # fmt: skip
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", default="ctr-dlrm,long-bags,ctr-mix")
    parser.add_argument("--hot", default="16,32,64")
    parser.add_argument("--samples", default="1024,4096")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    hots = [int(h) for h in args.hot.split(",")]
    samples = [int(s) for s in args.samples.split(",")]
    if args.smoke:
        workloads = [SMOKE]
    else:
        from tbe_plugin.benchmarks.suite import DEVICE_CONFIGS

        named = {c.name: c for c in DEVICE_CONFIGS}
        workloads = [named[name] for name in args.configs.split(",")]
    results = {"git": git_state(), "device": "cpu (counts only)", "configs": []}
    for workload in workloads:
        results["configs"].append(probe(workload, hots, samples))
        print(json.dumps(results["configs"][-1]), flush=True)
    write_json(args.out, "probe_hot_split.json", results)
    return results


if __name__ == "__main__":
    main()
