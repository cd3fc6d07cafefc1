"""SIG's two targets, measured on this machine (``python -m pipelines.bench.inputs``).

1. Sharing: jobs A and B over the same synthetic raw log, B sharing most of A's transform
   nodes (other table sizes for four features, another cross, a longer activity window).
   A reads through SIG into an empty store (computing and publishing); B then reads through
   SIG, and again with no SIG at all (computing alone). Reported: the shared fraction of B's
   nodes, B's hit rate, and B's reader CPU time per partition both ways (process CPU time,
   every thread, medians over partitions), with their ratio.
2. Autoscaling: a ``ReaderPool`` feeds a trainer whose consumption steps up 4x and back down
   (``drive_trainer``); reported: the pool size, queue depth and consumption over time (a PNG),
   every scaling decision, the longest wait on an empty queue against the cooldown, and the
   pool's size at the end against its minimum.

Writes ``sig_<commit>.json`` and ``.md`` and the timeline PNG into ``--out``, with the
commit, the dirty flag, the machine and the package versions. Asserts no time.
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pipelines.inputs.graph import ctr_graph
from pipelines.inputs.pool import ReaderPool
from pipelines.inputs.raw import SyntheticRawLog
from pipelines.inputs.reader import NoSig, SigReader, StoreClient
from pipelines.inputs.scaling import ScalingPolicy
from pipelines.inputs.store import PartStore

JOB_A = dict(num_sparse=28, rows=1_000_000, window=64)
JOB_B = dict(num_sparse=28, rows=1_000_000, window=128, cross_columns=("c1", "c3"),
             bucket_rows={0: 200_000, 3: 50_000, 7: 2_000_000, 12: 10_000})  # fmt: skip


def drive_trainer(pool: ReaderPool, phases: Sequence[Tuple[str, float, float]]) -> List[Dict[str, Any]]:
    """Takes partitions from ``pool`` at a scripted rate: each phase ``(name, seconds,
    partitions per second)``, on a fixed schedule (a late take is not made up by a burst
    beyond the phase's rate). Returns one record per partition taken: ``t`` (delivered, since
    the pool started), ``asked`` (when the trainer asked), phase, partition, seconds waited
    and ``dry`` (the pool had nothing for it when asked)."""
    trace: List[Dict[str, Any]] = []
    for name, seconds, rate in phases:
        began = time.monotonic()
        due = began
        while time.monotonic() - began < seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            asked, dry_before = time.monotonic(), len(pool.dry_spells)
            item = pool.get()
            if item is None:
                return trace
            now = time.monotonic()
            trace.append({"t": now - pool.started, "asked": asked - pool.started, "phase": name, "partition": item[0],
                          "waited_s": now - asked, "dry": len(pool.dry_spells) > dry_before})  # fmt: skip
            due = max(due + 1.0 / rate, now - 1.0 / rate)
    return trace


def dry_periods(trace: Sequence[Dict[str, Any]]) -> List[Tuple[float, float]]:
    """The spans over which the queue stayed dry: each run of consecutive takes that all
    found the pool empty, from the first one's ask to the last one's delivery (the trainer
    never had a partition in hand ahead of its need in between)."""
    periods: List[Tuple[float, float]] = []
    run_from = None
    for record in trace:
        if record["dry"]:
            run_from = record["asked"] if run_from is None else run_from
            last = record["t"]
        elif run_from is not None:
            periods.append((run_from, last))
            run_from = None
    if run_from is not None:
        periods.append((run_from, last))
    return periods


def _median_cpu(reader: SigReader, partitions: Sequence[int]) -> Tuple[float, Dict[str, Any]]:
    per_partition = []
    for p in partitions:
        reader.read(p)
        per_partition.append(reader.last_stats.cpu_s)
    return statistics.median(per_partition), reader.stats.to_json()


def measure_sharing(work: str, rows: int, partitions: int) -> Dict[str, Any]:
    raw = SyntheticRawLog(os.path.join(work, "raw"), rows=rows, seed=0, users=max(100, rows // 20))
    for p in range(partitions):
        raw.ensure(p)  # the raw log exists before any job: writing it is no reader's cost
    a, b = ctr_graph(**JOB_A), ctr_graph(**JOB_B)
    store = PartStore(os.path.join(work, "store"))
    ps = range(partitions)
    b_alone_cpu, b_alone = _median_cpu(SigReader(b, raw, NoSig(), publish=False), ps)
    a_sig_cpu, a_sig = _median_cpu(SigReader(a, raw, StoreClient(store)), ps)
    b_sig_cpu, b_sig = _median_cpu(SigReader(b, raw, StoreClient(store), publish=False), ps)
    return {
        "rows_per_partition": rows, "partitions": partitions, "nodes_b": len(b.needed()),
        "shared_fraction_b": b.shared_fraction(a),
        "stored_nodes_b": sum(b.by_name[n].materialized for n in b.needed()),
        "b_hit_rate": b_sig["hit_rate"], "b_sig": b_sig, "b_alone": b_alone, "a_sig_first": a_sig,
        "cpu_s_per_partition": {"b_alone": b_alone_cpu, "a_sig_first": a_sig_cpu, "b_sig": b_sig_cpu},
        "b_cpu_ratio_alone_over_sig": b_alone_cpu / b_sig_cpu,
        "store_bytes": sum(r["bytes"] for r in store.manifest()),
    }  # fmt: skip


def measure_autoscaling(
    work: str, rows: int, policy: ScalingPolicy, latency_s: float, load: float, seconds: float,
) -> Dict[str, Any]:  # fmt: skip
    """One scenario of target 2: readers hit SIG (job B's parts, materialized first) and wait
    ``latency_s`` per partition (a remote store's round trip; 0: bound by this machine's
    cores). The slow phases ask for ``load`` of one reader's measured throughput, the fast
    phase 4x that."""
    raw = SyntheticRawLog(os.path.join(work, "raw"), rows=rows, seed=0, users=max(100, rows // 20))
    graph = ctr_graph(**JOB_B)
    spec = {"graph": graph.to_json(), "raw": raw.spec(), "sig": {"kind": "store", "url": os.path.join(work, "store")},
            "latency_s": latency_s}  # fmt: skip
    cycle = list(range(4))
    warm = SigReader(graph, raw, StoreClient(PartStore(spec["sig"]["url"])))
    for p in cycle:
        warm.read(p)  # materialized first: the pool's readers hit, as B's did
    read_s = []
    for p in cycle:
        began = time.perf_counter()
        warm.read(p)
        read_s.append(time.perf_counter() - began)
    per_partition_s = latency_s + statistics.median(read_s)
    slow_rate = load / per_partition_s
    pool = ReaderPool(spec, (cycle[i % len(cycle)] for i in range(10**9)), policy)
    phases = [("slow", seconds, slow_rate), ("fast", seconds, 4 * slow_rate), ("slow again", 2 * seconds, slow_rate)]
    try:
        # A trainer starts taking batches after building its model, by when the first
        # reader has filled the queue: the phases start from a full queue, as training would.
        deadline = time.monotonic() + 60
        while pool.depth < policy.queue_capacity and time.monotonic() < deadline:
            time.sleep(0.05)
        warm_up_s = time.monotonic() - pool.started
        trace = drive_trainer(pool, phases)
        final_size, final_processes = pool.size, len(pool.reader_pids)
    finally:
        pool.close()
    dry = dry_periods(trace)
    return {
        "latency_s": latency_s, "rows_per_partition": rows, "warm_up_s": warm_up_s, "one_reader_s_per_partition": per_partition_s,
        "load": load, "policy": dataclasses.asdict(policy), "phases": phases, "trace": trace,
        "timeline": pool.timeline, "dry_periods": dry,
        "decisions": [d.to_json() for d in pool.decisions if d.action != "hold"],
        "holds": sum(d.action == "hold" for d in pool.decisions),
        "longest_wait_s": max(r["waited_s"] for r in trace),
        "longest_dry_s": max((b - a for a, b in dry), default=0.0),
        "cooldown_s": policy.cooldown_s, "final_size": final_size, "final_processes": final_processes,
        "min_readers": policy.min_readers, "max_size": max(s["size"] for s in pool.timeline),
        "taken": {name: sum(r["phase"] == name for r in trace) for name, _, _ in phases},
        "asked": {name: round(seconds * rate, 1) for name, seconds, rate in phases},
        "reader_stats": pool.stats.to_json(),
    }  # fmt: skip


def plot_timeline(scenarios: Dict[str, Dict[str, Any]], path: str) -> None:
    """Per scenario: readers, queue depth and scaling decisions (top); the trainer's
    consumption, its waits and the dry periods against the cooldown (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(scenarios), sharex="col", figsize=(7 * len(scenarios), 6), squeeze=False)
    for column, (name, result) in enumerate(scenarios.items()):
        top, bottom = axes[0][column], axes[1][column]
        timeline, trace = result["timeline"], result["trace"]
        times = [s["t"] for s in timeline]
        top.step(times, [s["size"] for s in timeline], where="post", label="readers")
        top.step(times, [s["depth"] for s in timeline], where="post", label="queue depth (partitions)", alpha=0.7)
        for d in result["decisions"]:
            top.axvline(d["time"], color="green" if d["action"] == "grow" else "red", lw=0.8, ls="--")
        top.set_title(f"{name}: {result['latency_s']} s latency, slow load {result['load']} of one reader")
        top.set_ylabel("count")
        top.legend(loc="upper left", fontsize=8)
        taken = [r["t"] for r in trace]
        rate = [sum(1 for u in taken if t - 1.0 < u <= t) for t in taken]
        bottom.plot(taken, rate, label="consumed per s (1 s window)")
        waits = bottom.twinx()
        waits.plot(taken, [r["waited_s"] for r in trace], ".", ms=3, color="tab:orange", label="trainer wait (s)")
        for a, b in result["dry_periods"]:
            waits.plot([a, b], [b - a, b - a], color="tab:red", lw=2)
        waits.axhline(result["cooldown_s"], color="gray", lw=0.8, ls=":", label="cooldown (s)")
        waits.set_ylabel("s (red: dry periods, at their length)")
        waits.legend(loc="upper right", fontsize=8)
        for phase, start in _phase_starts(trace):
            bottom.axvline(start, color="black", lw=0.5)
            bottom.text(start, 0, f" {phase}", fontsize=8, va="bottom")
        bottom.set_xlabel("seconds since the pool started")
        bottom.legend(loc="upper left", fontsize=8)
    fig.suptitle("SIG reader pool under a 4x step in consumption (dashed: grow green, shrink red)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _phase_starts(trace: Sequence[Dict[str, Any]]) -> List[Tuple[str, float]]:
    starts: List[Tuple[str, float]] = []
    for record in trace:
        if not starts or starts[-1][0] != record["phase"]:
            starts.append((record["phase"], record["asked"]))
    return starts


def _environment() -> Dict[str, Any]:
    import subprocess

    import fsspec
    import numpy
    import pyarrow

    from tbe_plugin.benchmarks.report import git_state

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mine = subprocess.run(["git", "status", "--porcelain", "--", "pipelines/inputs", "tests/pipelines"],
                          cwd=root, capture_output=True, text=True).stdout.splitlines()  # fmt: skip
    return {**git_state(), "sig_files_changed": [line[3:] for line in mine if "inputs" in line],
            "python": platform.python_version(), "pyarrow": pyarrow.__version__, "fsspec": fsspec.__version__,
            "numpy": numpy.__version__, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "cpu_pressure_at_start": _cpu_pressure()}  # fmt: skip


def _cpu_pressure() -> Optional[str]:
    """Linux's CPU pressure line (the share of time some task waited for a core), or None."""
    try:
        with open("/proc/pressure/cpu") as f:
            return f.readline().strip()
    except OSError:
        return None


def markdown(env: Dict[str, Any], sharing: Dict[str, Any], scenarios: Dict[str, Dict[str, Any]], png: str) -> str:
    cpu = sharing["cpu_s_per_partition"]
    dirty = "clean tree" if not env["git_dirty"] else (
        f"dirty tree: other work's files changed ({len(env.get('git_changed', []))} listed in the JSON), SIG's own "
        + ("unchanged" if not env["sig_files_changed"] else f"changed: {', '.join(env['sig_files_changed'])}"))
    lines = [
        f"# SIG on CPU (commit {env['git_commit'][:7]}, {dirty})", "",
        f"{env['cpus']} CPUs ({env['machine']}), shared with other work: load average "
        f"{env['load_average_at_start'][0]:.1f} at the start, {env.get('load_average_at_end', [float('nan')])[0]:.1f} "
        f"at the end (CPU pressure at the end: `{env.get('cpu_pressure_at_end')}`); pyarrow {env['pyarrow']}, "
        f"fsspec {env['fsspec']}, numpy {env['numpy']}, Python {env['python']}.",
        "", "## Two jobs sharing transform nodes", "",
        f"{sharing['partitions']} partitions of {sharing['rows_per_partition']} events. Job B needs "
        f"{sharing['nodes_b']} nodes, {sharing['shared_fraction_b']:.1%} of them shared with job A; "
        f"{sharing['stored_nodes_b']} of B's nodes are stored by SIG (raw columns, windowed counts); "
        "readers compute the elementwise ones.", "",
        "| reader | CPU s per partition (median) | hit rate | raw parses |", "|---|---|---|---|",
        f"| B alone (no SIG) | {cpu['b_alone']:.4f} | n/a | {sharing['b_alone']['raw_parses']} |",
        f"| A first through SIG (computes, publishes) | {cpu['a_sig_first']:.4f} | "
        f"{sharing['a_sig_first']['hit_rate']:.1%} | {sharing['a_sig_first']['raw_parses']} |",
        f"| B through SIG after A | {cpu['b_sig']:.4f} | {sharing['b_hit_rate']:.1%} | {sharing['b_sig']['raw_parses']} |",
        "", f"**B's hit rate {sharing['b_hit_rate']:.1%}; its reader CPU time "
        f"{sharing['b_cpu_ratio_alone_over_sig']:.2f}x lower through SIG than alone** (targets: >= 95%, >= 4x). "
        f"B's misses are its one stored node A lacks (a longer activity window), computed from stored "
        f"columns. Store: {sharing['store_bytes'] / 1e6:.1f} MB.", "",
        "## Autoscaled readers under a 4x step in consumption", "",
        "A dry period is a run of consecutive takes that each found the pool empty, from the first "
        "ask to the last delivery. Target: none longer than one cooldown; the pool back at its minimum.", "",
        "| scenario | one reader s/partition | phases (s, partitions/s) | taken / asked | longest dry period | "
        "longest single wait | cooldown | max size | final size (min) | changes | pool's reads: wall / CPU s each |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, r in scenarios.items():
        stats = r["reader_stats"]
        phases = ", ".join(f"{p} {s:.0f} s at {rate:.2f}" for p, s, rate in r["phases"])
        taken = ", ".join(f"{r['taken'][p]}/{r['asked'][p]:.0f}" for p, _, _ in r["phases"])
        lines.append(f"| {name} | {r['one_reader_s_per_partition']:.3f} | {phases} | {taken} | "
                     f"**{r['longest_dry_s']:.2f} s** | {r['longest_wait_s']:.2f} s | {r['cooldown_s']} s | "
                     f"{r['max_size']} | **{r['final_size']}** ({r['min_readers']}) | {len(r['decisions'])} | "
                     f"{stats['wall_s'] / stats['partitions']:.3f} / {stats['cpu_s'] / stats['partitions']:.3f} |")  # fmt: skip
    policy = next(iter(scenarios.values()))["policy"]
    lines += ["", "Reads' wall and CPU times are the readers' own (``SigReader.read``), latency excluded: "
              "where wall far exceeds CPU, the readers waited for a core.", "", f"Policy: {json.dumps(policy)}.", "", f"![timeline]({os.path.basename(png)})", ""]
    for name, r in scenarios.items():
        lines += [f"### {name}: decisions (holds: {r['holds']})", "", "| t (s) | action | size | queue | busy | reason |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {d['time']:.2f} | {d['action']} | {d['size_before']} -> {d['size_after']} | {d['depth']:.2f} | "
                  f"{d['utilization']:.2f} | {d['reason']} |" for d in r["decisions"]]  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipelines.bench.inputs", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(__file__)), "results"))
    parser.add_argument("--rows", type=int, default=50_000, help="events per partition (sharing)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--scaling-rows", type=int, default=1024, help="events per partition (autoscaling)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per read in the remote-store scenario")
    parser.add_argument("--load", type=float, default=0.6, help="slow phases' share of one reader's throughput")
    parser.add_argument("--phase-seconds", type=float, default=8.0)
    parser.add_argument("--scenarios", default="remote,local", help="remote (--latency per read), local (no latency)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: checks that it runs")
    args = parser.parse_args(list(argv) or None)
    if args.smoke:
        args.rows, args.partitions, args.scaling_rows, args.phase_seconds = 500, 2, 500, 1.0
    # The policy's defaults (cooldown, interval, queue, water marks) but for the pool's range
    # and a task group of 2 readers kept on standby: one decision covers a 4x step from a
    # reader at --load 0.6 (2.4 readers' worth) with processes already started.
    policy = ScalingPolicy(min_readers=1, max_readers=4, initial_readers=1, step=2, standby=2)
    env = _environment()
    latencies = {"remote": args.latency, "local": 0.0}
    with tempfile.TemporaryDirectory() as work:
        sharing = measure_sharing(os.path.join(work, "sharing"), args.rows, args.partitions)
        scenarios = {name: measure_autoscaling(os.path.join(work, name), args.scaling_rows, policy, latencies[name],
                                               args.load, args.phase_seconds)  # fmt: skip
                     for name in args.scenarios.split(",")}
    env["load_average_at_end"], env["cpu_pressure_at_end"] = os.getloadavg(), _cpu_pressure()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"sig_{env['git_commit'][:7]}{'_smoke' if args.smoke else ''}")
    plot_timeline(scenarios, stem + "_timeline.png")
    with open(stem + ".json", "w") as f:
        json.dump({"environment": env, "args": vars(args), "sharing": sharing, "autoscaling": scenarios}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(env, sharing, scenarios, stem + "_timeline.png"))
    print(open(stem + ".md").read())
    print(f"wrote {stem}.json, .md, _timeline.png", file=sys.stderr)


if __name__ == "__main__":
    main()
