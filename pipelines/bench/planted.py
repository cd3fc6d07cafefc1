"""What drawing the planted click log costs: ``python -m pipelines.bench.planted --out DIR``.

The training app draws a fresh batch every step (``pipelines.app.data.PlantedClickLog``);
issue 15 asks that this never be the bottleneck at B=32768 per rank. Per batch size, for
the A/B's tables (``conf/tables/dlrm_h200``: 26 tables of 1e6 rows, Poisson bags of mean
20, Zipf 1.15):

- ``alone``: batches drawn back to back, nothing else on the device: host ms per batch
  (the call's own time, the host's cost of launching) and the device's wall time per
  batch (synchronized at both ends of the run);
- ``busy``: the same while the default stream is kept busy with queued matmuls, as a
  training step keeps it (``--busy-ms`` of queued work per batch): the host ms per batch
  is then what the training loop waits for.
- ``per-table``: the former drawing (each table's ids and bag lengths by its own kernels,
  the host waiting for the drawing stream), for comparison, under the same load.

Results (JSON + markdown) record the commit and whether the tree was dirty, the device and
the versions. Asserts no time; ``--smoke`` runs tiny sizes on any device.
"""

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List

import torch

from pipelines.app.config import DataConfig, TablesConfig
from pipelines.app.data import PlantedClickLog
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.workloads import table_sampler

AB_TABLES = TablesConfig(num_tables=26, rows=1_000_000, dim=128, pooling_factor=20, zipf_alpha=1.15)


class PerTableLog(PlantedClickLog):
    """The drawing before ``ZipfTables``: every table's ids and bag lengths by kernels of
    its own, and the host waiting for the drawing stream before the batch is returned."""

    def batch(self, index: int):
        if self._stream is None:
            return self._draw(index)
        with torch.cuda.stream(self._stream):
            batch = self._draw(index)
        self._stream.synchronize()
        batch.record_stream(torch.cuda.current_stream(self.device))
        return batch

    def _bag_lengths(self, counts: List[int], g: torch.Generator) -> torch.Tensor:
        B, parts = self.data.batch_size, []
        for table, count in zip(self.tables, counts):
            if table.pooling == "fixed":
                parts.append(torch.full((B,), round(table.mean_pooling), dtype=torch.int64, device=self.device))
                continue
            bags = torch.randint(0, B, (count,), generator=g, device=self.device)
            parts.append(torch.zeros(B, dtype=torch.int64, device=self.device).index_add_(0, bags, torch.ones_like(bags)))
        return torch.cat(parts)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

        class _PerTable:
            def __init__(self, tables):
                self.tables = tables

            def sample(self, counts, g, device):
                return torch.cat([table_sampler(t.rows, t.alpha, i).sample(c, g, device)
                                  for i, (t, c) in enumerate(zip(self.tables, counts))])  # fmt: skip

        self._sampler = _PerTable(self.tables)


def _time(log: PlantedClickLog, batches: int, busy: Callable[[], None]) -> Dict[str, float]:
    sync = torch.cuda.synchronize if log.device.type == "cuda" else (lambda: None)
    log.batch(0)  # warm: caches, the first allocation
    sync()
    host, began = [], time.perf_counter()
    for i in range(1, batches + 1):
        busy()
        t0 = time.perf_counter()
        log.batch(i)
        host.append((time.perf_counter() - t0) * 1e3)
    sync()
    wall = (time.perf_counter() - began) * 1e3 / batches
    host.sort()
    return {"host_ms_median": host[len(host) // 2], "host_ms_max": host[-1], "wall_ms_per_batch": wall}


def main(argv: List[str] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--batch-sizes", default="8192,32768")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--busy-ms", type=float, default=10.0, help="queued default-stream work per batch (busy)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tables = AB_TABLES
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.smoke:
        tables, sizes, args.batches = TablesConfig(num_tables=3, rows=1000, dim=4, pooling_factor=3), [64], 2
    matrix = torch.randn(4096, 4096, device=device) if device.type == "cuda" else None
    per_matmul_ms = 0.0
    if matrix is not None:  # calibrate: how many matmuls make --busy-ms of queued work
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            matrix @ matrix
        torch.cuda.synchronize()
        per_matmul_ms = (time.perf_counter() - t0) * 1e3 / 10
    matmuls = max(1, round(args.busy_ms / per_matmul_ms)) if per_matmul_ms else 0

    def busy() -> None:
        for _ in range(matmuls):
            matrix @ matrix

    results: Dict[str, Any] = {"git": git_state(), "device": str(torch.cuda.get_device_name() if matrix is not None
                                                                    else "cpu"),
               "torch": torch.__version__, "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
               "tables": repr(tables), "busy_matmuls": matmuls, "per_matmul_ms": per_matmul_ms, "rows": []}  # fmt: skip
    for B in sizes:
        data = DataConfig(batch_size=B, seed=0)
        for name, cls, load in (("alone", PlantedClickLog, lambda: None), ("busy", PlantedClickLog, busy),
                                ("per-table, busy", PerTableLog, busy)):  # fmt: skip
            log = cls(tables, data, 13, device)
            row = {"batch_size": B, "drawing": name, **_time(log, args.batches, load)}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "planted.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [f"# Drawing the planted click log: {results['device']}",
             "", f"Commit {results['git'].get('git_commit')} (dirty: {results['git'].get('git_dirty')}); "
             f"torch {results['torch']}; {results['tables']}; busy = {matmuls} queued 4096^2 matmuls a batch "
             f"({matmuls * per_matmul_ms:.1f} ms).", "",
             "| B | drawing | host ms per batch (median) | host ms (max) | wall ms per batch |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch_size']} | {r['drawing']} | {r['host_ms_median']:.2f} | {r['host_ms_max']:.2f} | "
              f"{r['wall_ms_per_batch']:.2f} |" for r in results["rows"]]
    with open(os.path.join(args.out, "planted.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main()
