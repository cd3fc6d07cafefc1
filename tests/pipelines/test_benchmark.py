"""The pipeline benchmark: its trace summary on a made-up trace, and a tiny CPU run."""

import json
import os
import subprocess
import sys

from pipelines.bench.pipeline import stream_summary


def test_stream_summary_counts_busy_and_overlapping_time(tmp_path):
    events = [  # stream 7: [0, 10) and [5, 20) -> busy 20 us; stream 9: [15, 30) -> 15 us; overlap [15, 20)
        {"ph": "X", "cat": "kernel", "ts": 0, "dur": 10, "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "ts": 5, "dur": 15, "args": {"stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "ts": 15, "dur": 15, "args": {"stream": 9}},
        {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100, "args": {}},  # not GPU work
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = stream_summary(str(path))
    assert s["busy_ms_per_stream"] == {"7": 0.020, "9": 0.015}
    assert abs(s["overlap_ms"] - 0.005) < 1e-12
    assert abs(s["window_ms"] - 0.030) < 1e-12


def test_tiny_run_on_cpu(tmp_path):
    """fbgemm on CPU (gloo, world size 1): every mode runs, our k = 0 trains exactly as the
    plain loop, the report is written."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pipelines.bench.pipeline", "--balances", "balanced", "--backends", "fbgemm",
               "--modes", "plain,stale0,stale1,sparse_only,dense_only,concurrent", "--batch-size", "16",
               "--rows", "300", "--dim", "16", "--steps", "2", "--warmup", "1", "--distinct-batches", "2",
               "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "pipeline_ws1.json").read_text())
    runs = results["runs"]
    assert sorted(runs) == sorted(f"balanced/fbgemm/{m}" for m in
                                  ("plain", "stale0", "stale1", "sparse_only", "dense_only", "concurrent"))  # fmt: skip
    assert all(r["ms"] > 0 and len(r["losses"]) == 3 for r in runs.values())
    assert all(r["plan"] == {"table_wise/fused": 26} for r in runs.values()), runs  # pinned: the same every build
    assert results["summary"]["balanced/fbgemm"]["loss_diff_stale0_vs_plain"] == 0.0
    # concurrent runs the dense step of the same batches as dense_only, from the same weights (its fixed
    # stand-in embeddings, ~U(0, 1e-2), come from the global generator at first use, so they differ a little)
    pairs = zip(runs["balanced/fbgemm/concurrent"]["losses"], runs["balanced/fbgemm/dense_only"]["losses"])
    assert max(abs(a - b) for a, b in pairs) < 1e-3
    assert results["summary"]["balanced/fbgemm"]["concurrent_over_sum"] > 0
    assert runs["balanced/fbgemm/stale1"]["losses"] != runs["balanced/fbgemm/plain"]["losses"]
    assert "| balanced | fbgemm |" in (out / "pipeline_ws1.md").read_text()


def test_scaling_report_computes_efficiency(tmp_path):
    from pipelines.bench.pipeline import scaling_report

    def result(world_size, ms):
        return {"world_size": world_size, "batch_size_per_rank": 1000, "rows": 10,
                "runs": {"balanced/triton/stale1": {"ms": ms}, "balanced/triton/plain": {"ms": 2 * ms}}}  # fmt: skip

    paths = []
    for world_size, ms in ((1, 10.0), (2, 12.5)):
        path = tmp_path / f"ws{world_size}.json"
        record = result(world_size, ms)
        if world_size == 2:
            record["provenance"] = {"commit": "abc1234", "dirty": True}
        path.write_text(json.dumps(record))
        paths.append(str(path))
    text = scaling_report(paths[::-1])  # any order
    assert "world size 1: ws1.json, commit not recorded." in text, text
    assert "world size 2: ws2.json, Commit abc1234 (dirty tree)." in text, text
    # ws1: 1000 / 10 ms = 100000/s; ws2: 2000 / 12.5 ms = 160000/s; efficiency 160000 / 200000
    assert "| balanced/triton/stale1 | 100000 | 160000 | 0.80 |" in text, text
    assert "| balanced/triton/plain | 50000 | 80000 | 0.80 |" in text, text
