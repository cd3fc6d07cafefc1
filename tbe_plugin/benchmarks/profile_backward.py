"""Where the fused backward's time goes, and how its launch sizes trade off, on the device.

``python -m tbe_plugin.benchmarks.profile_backward --out DIR [--configs b8192,zipf1.15]``
takes configs of the benchmark suite (``suite.py``: the same inputs as the A/B), runs
forward + backward under ``torch.profiler`` for each optimizer asked, and writes
DIR/profile_backward.json: the device time of every kernel, ours (default launch sizes)
and FBGEMM's on the same batch, FBGEMM's backward time, and ours (time and the ten largest
kernels) for each candidate launch (``CANDIDATES``: ``RunsLaunch`` values, passed through the module's
``backward_launch``). Nothing reads it at run time: it tells the next change what to do.

``--best-of DIR/profile_backward.json`` prints the candidate whose backward time, over the
entries of that file, has the best geometric mean ratio to FBGEMM's (candidates that
failed, moved the tables by more than 1e-3 of their scale or took more than 2% longer than
the first candidate on any entry excluded);
``--suite-with NAME -- ARGS`` runs the backward suite (``backward.py ARGS``) with our
modules under candidate NAME, and writes DIR/suite_launch.json (the launch, commit).
"""

import argparse
import dataclasses
import json
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from tbe_plugin.benchmarks.backward import build_module, lookup
from tbe_plugin.benchmarks.common import (
    backward_host_and_wall_ms, generate_batches, plan_in_backward, silence_fbgemm_logging,
)
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.benchmarks.suite import DEVICE_CONFIGS
from tbe_plugin.ops.backward_launch import runs_launch


def _launch(**fields):
    return lambda: dataclasses.replace(runs_launch(), **fields)


def _chunks(**fields):
    return _launch(design="chunks", **fields)


# Candidate launches by name (RunsLaunch values; the chunk sizes are per class of tile).
CANDIDATES = {
    "default": runs_launch,
    "chunks": _chunks(),
    "grid": _chunks(chunk_mode="grid"),
    "auto": _chunks(chunk_mode="auto"),
    "loop": _chunks(chunk_mode="loop"),
    "list16": _chunks(chunk_programs_per_sm=16),
    "auto_loop_warps8": _chunks(chunk_mode="auto", max_loop_warps=8),
    "auto_loop_warps4": _chunks(chunk_mode="auto", max_loop_warps=4),
    "loop_programs16": _chunks(loop_programs_per_sm=16),
    # The pieces design (ops.backward_pieces): cells of 64 or 256 ids, 16 or 32 looping
    # programs a multiprocessor, 4 or 2 gathers in flight a lane.
    "pieces": _launch(design="pieces"),
    "pieces256": _launch(design="pieces", piece_ids=256),
    "pieces_p32": _launch(design="pieces", piece_programs_per_sm=32),
    "pieces_grid": _launch(design="pieces", piece_programs_per_sm=0),
    "pieces_unroll2": _launch(design="pieces", piece_unroll=2),
    # The backward's id-only part made in the backward, not in the forward on a side stream
    # (RunsLaunch.plan_in_forward; for the end to end: the kernel benchmarks always do this).
    "plan_in_backward": _launch(plan_in_forward=False),
    # Repeats of a row in one bag (adjacent in the sorted ids) read their gradient row once.
    "repeats": _launch(piece_repeats=True),
    # Repeats of a row in one bag merged before the sort (windows of 16, 32 or 64 positions).
    "merge16": _launch(merge_repeats=16),
    "merge32": _launch(merge_repeats=32),
    "merge64": _launch(merge_repeats=64),
    # ... in place (merge_compact=False): the dropped ids sorted last, no host read of a count.
    "merge32_in_place": _launch(merge_repeats=32, merge_compact=False),
    "merge64_in_place": _launch(merge_repeats=64, merge_compact=False),
    # The default's kernels, batches of up to 2**20 ids as captured CUDA graphs (ops.backward_graphs).
    "graphs": _launch(graph_max_ids=1 << 20),
    # Per-piece records written by the marks kernel: one round of dependent loads less a round.
    "records": _launch(piece_records=True),
    # ... visited in the order of the gradient rows they read (L2 serves the gather).
    "ordered": _launch(piece_records=True, piece_order=True),
    # Records free registers (ptxas sm_90, D=128 fp32 rowwise: 40 against 60): more resident
    # programs; 8 gathers a step in flight a lane (H200 at c56e317: slower but at D=512).
    "records_p20": _launch(piece_records=True, piece_programs_per_sm=20),
    "records_p24": _launch(piece_records=True, piece_programs_per_sm=24),
    "unroll8": _launch(piece_unroll=8),
    "records_unroll8": _launch(piece_records=True, piece_unroll=8),
    "records_unroll8_p20": _launch(piece_records=True, piece_unroll=8, piece_programs_per_sm=20),
    # Graphs that read the output gradient in place (no copy into the graph's buffer), up to
    # 2**20 ids and up to 2**22 (l1's 2.1M ids, wide-d512's 2.6M).
    "graphs_in_place": _launch(graph_grad_in_place=True, graph_fill=False),
    # The output gradient copied into the graph's buffer (the default until ccbc90c), up to
    # 2**20 and 2**22 ids: is the graphed pieces kernel's slowdown the cell's or the graph's?
    "graphs_copy": _launch(graph_grad_in_place=False, graph_fill=False),
    "graphs4m_copy": _launch(graph_grad_in_place=False, graph_fill=False, graph_max_ids=1 << 22),
    "graphs4m_in_place": _launch(graph_grad_in_place=True, graph_max_ids=1 << 22),
    # ... up to 2**24 (uniform b8192's 5.2M ids, l100's 26M stay eager) and 2**26 (every
    # suite config, b65536's 41.9M ids included): no host path left but the graph's fill.
    "graphs16m_in_place": _launch(graph_grad_in_place=True, graph_max_ids=1 << 24),
    "graphs64m_in_place": _launch(graph_grad_in_place=True, graph_max_ids=1 << 26),
    # The step's inputs filled inside the graph from one copied vector of addresses (RunsLaunch.graph_fill,
    # the default since it was timed at daec3fa) and, as before, by ~6 launches before the replay.
    "graphs_fill": _launch(graph_fill=True),
    "graphs_nofill": _launch(graph_fill=False),
    # The rows sorted by ops.radix_sort (only their bits, the bag carried) instead of torch.sort.
    "radix": _launch(radix_sort=True),
    # Each round's operands loaded a piece a lane, 32 pieces a round, summed RUNS at a time
    # (RunsLaunch.piece_lanes): ptxas sm_90 at D=128 93 registers against 64-66, so 16
    # two-warp programs no longer fit a multiprocessor (10 do: 10 x 64 x 93 < 65536).
    "lanes32": _launch(piece_lanes=32),
    "lanes32_p10": _launch(piece_lanes=32, piece_programs_per_sm=10),
    "lanes64_p10": _launch(piece_lanes=64, piece_programs_per_sm=10),
    # Grids cut to the programs that fit a multiprocessor (RunsLaunch.piece_fit; learned at the
    # warm-up's first launch): fp16 at D=128 (66 registers) 14 of 16, D=512 5; and 8 gathers a
    # step (72 registers at D=128 fp32: 14 fit; at 16 a program it lost, b65536 31.1 ms
    # against 18.7 at c56e317, a second wave of 2 programs a multiprocessor).
    "fit": _launch(piece_fit=True),
    "unroll8_fit": _launch(piece_unroll=8, piece_fit=True),
    "lanes32_fit": _launch(piece_lanes=32, piece_fit=True),
    # One-warp programs, a piece a group at D=128: the lanes' operands reach the group by warp
    # shuffles, not shared memory (ptxas sm_90, D=128 fp32 rowwise unscaled: 61 registers with
    # lanes, 60 without, against 80 for two warps with lanes), 32 programs a multiprocessor.
    "w1_p32": _launch(piece_elements=128, piece_warps=1, piece_programs_per_sm=32),
    "lanes32_w1": _launch(piece_elements=128, piece_warps=1, piece_lanes=32, piece_programs_per_sm=32),
    "lanes32_w1_fit": _launch(piece_elements=128, piece_warps=1, piece_lanes=32, piece_programs_per_sm=32,
                              piece_fit=True),
    # Runs of up to 1-64 ids in a launch of their own with lanes32_w1's sizes, the other pieces
    # with the default's (RunsLaunch.piece_short): lanes32_w1_fit won on uniform ids (runs of 1-3)
    # and lost on skewed ones (most ids in long runs) at 667690e.
    "noshort": _launch(piece_short=0),
    # The short launch for ADAM, PARTIAL_ROWWISE_ADAM and LAMB too (at 0020964 it lost there with
    # 83 registers and 4-byte row stores; since 64c2a4c 64 registers and 16-byte stores, and it
    # won at 246ec7c: the default since) and without them (the default before).
    "short_two": _launch(short_two_states=True),
    "short_two_off": _launch(short_two_states=False),
    # Each feature's 16 (64) hottest rows summed apart as counts times the output gradient
    # (RunsLaunch.hot_rows; eager batches of 2**20 ids or more, pooled, unweighted).
    "hot16": _launch(hot_rows=16),
    "hot64": _launch(hot_rows=64),
    "hot16_any": _launch(hot_rows=16, hot_min_ids=0),  # batches of any size (the CPU smoke runs)
    # ... and the other ids compacted before the sort (RunsLaunch.hot_split; one host read a batch).
    "hot16_split": _launch(hot_rows=16, hot_split=True),
    "hot32_split": _launch(hot_rows=32, hot_split=True),
    "hot64_split": _launch(hot_rows=64, hot_split=True),
    # ... choosing from 1024 sampled ids a feature instead of 4096 (the choice's tl.sort a quarter as long).
    "hot16_split_s1024": _launch(hot_rows=16, hot_split=True, hot_sample=1024),
    "hot32_split_s1024": _launch(hot_rows=32, hot_split=True, hot_sample=1024),
    # The three of 2026-12-05c together: the split hot rows, the lean operands, the L2 hints.
    "stack16": _launch(hot_rows=16, hot_split=True, hot_sample=1024, lean_operands=True, piece_evict=True),
    "stack64": _launch(hot_rows=64, hot_split=True, lean_operands=True, piece_evict=True),
    # ... with the hot rows' product on tensor cores (RunsLaunch.hot_tf32x3: three TF32 products a dot).
    "hot64_split_tf32": _launch(hot_rows=64, hot_split=True, hot_tf32x3=True),
    "stack16_tf32": _launch(hot_rows=16, hot_split=True, hot_sample=1024, lean_operands=True, piece_evict=True,
                            hot_tf32x3=True),
    "stack64_tf32": _launch(hot_rows=64, hot_split=True, lean_operands=True, piece_evict=True, hot_tf32x3=True),
    "stack16_tf32_any": _launch(hot_rows=16, hot_split=True, hot_sample=1024, lean_operands=True, piece_evict=True,
                                hot_tf32x3=True, hot_min_ids=0),  # batches of any size (the CPU smoke runs)
    "hot16_split_any": _launch(hot_rows=16, hot_split=True, hot_min_ids=0),
    # The forward's plan launched by a host thread (RunsLaunch.plan_thread, the default since the e2e
    # A/Bs at acf7b70; the candidates above take it too): "no_thread" launches it on the training
    # thread (the default before); the *_thread names are the same launches as those without.
    "no_thread": _launch(plan_thread=False),
    "thread": _launch(plan_thread=True),
    # The plan on the current stream right after the lookup, by the training thread (RunsLaunch.plan_side_stream).
    "plan_main_stream": _launch(plan_side_stream=False),
    "stack16_thread": _launch(hot_rows=16, hot_split=True, hot_sample=1024, lean_operands=True, piece_evict=True,
                              plan_thread=True),
    "stack64_tf32_thread": _launch(hot_rows=64, hot_split=True, lean_operands=True, piece_evict=True,
                                   hot_tf32x3=True, plan_thread=True),
    "stack16_thread_any": _launch(hot_rows=16, hot_split=True, hot_sample=1024, lean_operands=True, piece_evict=True,
                                  plan_thread=True, hot_min_ids=0),  # batches of any size (the CPU smoke runs)
    "short_two_w2": _launch(short_two_states=True, short_warps=2, short_programs_per_sm=16),
    "short_nofit": _launch(short_fit=False),
    "short16": _launch(piece_short=16),
    "short32": _launch(piece_short=32),
    "short8_w1_p32": _launch(piece_short=8, piece_elements=128, piece_warps=1, piece_programs_per_sm=32),
    "short16_w1_p32": _launch(piece_short=16, piece_elements=128, piece_warps=1, piece_programs_per_sm=32),
    "short16_fit": _launch(piece_short=16, piece_fit=True),
    "short16_tile512": _launch(piece_short=16, short_max_tile=512),
    "short1": _launch(piece_short=1),
    "short2": _launch(piece_short=2),
    "short4": _launch(piece_short=4),
    "short8": _launch(piece_short=8),
    "short64": _launch(piece_short=64),
    "short4_fit": _launch(piece_short=4, piece_fit=True),
    "short4_w1_p32": _launch(piece_short=4, piece_elements=128, piece_warps=1, piece_programs_per_sm=32),
    # The short launch with two pieces a group (RUNS 2 at D=128): more gradient and weight rows in
    # flight a multiprocessor (ptxas sm_90, rowwise fp32 unscaled: 74 registers, ~25 one-warp
    # programs resident, 50 pieces in flight, against 63 registers, 32 programs, 32 pieces; scaled:
    # 127 registers, 16 programs, no more in flight). ctr-dlrm's short launch moved ~1.8 GB at 59%
    # of DRAM bandwidth (ncu, 246ec7c): rows in flight bound it.
    "short_e256": _launch(short_elements=256, short_warp_elements=256),
    # The marks found by the sorted-operands kernel (a byte a position and its block's counts),
    # so that the marks kernel runs once, from them (RunsLaunch.marks_in_operands); with the merge too.
    "marks_in_operands": _launch(marks_in_operands=True),
    # The training forward writes the plan's positions, a bag's repeats merged or not
    # (RunsLaunch.forward_positions, forward_merge): for the end to end (pipelines.bench.e2e --backward-launch),
    # whose plan is made in the forward; a backward timed alone plans in the backward, unchanged.
    "fwd_positions": _launch(forward_positions=True),
    "fwd_merge": _launch(forward_merge=True),
    "no_fwd_positions": _launch(forward_positions=False),
    "merge32_in_place_marks": _launch(merge_repeats=32, merge_compact=False, marks_in_operands=True),
    # Fewer bytes in the sorted operands (RunsLaunch.lean_operands): int32 gradient offsets, a row's
    # start and D only at heads and grid points; with the marks beside the operands too.
    "lean": _launch(lean_operands=True),
    # L2 eviction hints in the pieces kernel (RunsLaunch.piece_evict): rows and state evict_first,
    # gradient gathers evict_last.
    "evict": _launch(piece_evict=True),
    "lean_marks": _launch(lean_operands=True, marks_in_operands=True),
    "merge_marks_any": _launch(merge_repeats=32, merge_compact=False, marks_in_operands=True,
                               merge_min_ids=0),  # batches of any size (the CPU smoke runs)
}


def _training_state(module) -> list[torch.Tensor]:
    """The tensors a step updates: weights and optimizer state."""
    return [module.weights] + [t for t in module._state_tensors() if t is not None]


def time_backward(module, batch, grad, iters: int) -> float:
    """Median ms of ``out.backward(grad)`` after an untimed forward (FBGEMM's bwd-only)."""
    times = []
    for _ in range(iters + 2):
        out = lookup(module, batch)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out.backward(grad)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def kernel_breakdown(module, batch, grad, top: int = 16) -> list[dict]:
    """Device time per kernel of one backward, largest first."""
    out = lookup(module, batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us:
            rows.append({"name": event.key[:120], "ms": round(device_us / 1e3, 4), "calls": event.count})
    return sorted(rows, key=lambda r: -r["ms"])[:top]


def host_ms(module, batch, grad, iters: int = 10) -> float:
    """Host time of ``out.backward(grad)`` with the device idle at its start (launch cost)."""
    return backward_host_and_wall_ms(lambda: lookup(module, batch), grad, iters, torch.device("cuda"))[0]


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 26) -> float:
    """max |a - b| in fp32, ``chunk`` elements at a time (no full-size fp32 temporaries)."""
    a, b = a.detach().reshape(-1), b.reshape(-1)
    worst = torch.zeros((), dtype=torch.float32, device=a.device)
    for i in range(0, a.numel(), chunk):
        worst = torch.maximum(worst, (a[i : i + chunk].float() - b[i : i + chunk].float()).abs().max())
    return worst.item()


def _resident_programs() -> list[dict]:
    """``RunsLaunch.piece_fit``'s learned counts: each compiled pieces variant's warps, tile,
    lanes and gathers a step, and the programs of it that fit a multiprocessor."""
    from tbe_plugin.ops.pieces_launch import _RESIDENT

    rows = []
    for (_, weights, _, _, warps, constexprs), programs in _RESIDENT.items():
        named = dict(constexprs)
        rows.append({"weights": str(weights), "warps": warps, "programs": programs,
                     **{k: named.get(k) for k in ("BLOCK_D", "RUNS", "LANES", "UNROLL")}})  # fmt: skip
    return rows


def profile_config(cfg, optimizer: str, candidates: list[str], iters: int, with_fbgemm: bool) -> dict:
    device = torch.device("cuda")
    batch = generate_batches(cfg, 1, device)[0][0]
    ours = build_module("ours", cfg, optimizer, device)
    out = lookup(ours, batch)
    grad = torch.randn(out.shape, device=device, generator=torch.Generator(device).manual_seed(0))
    del out
    entry = {"config": cfg.name, "optimizer": optimizer, "lookups": batch.indices.numel(),
             "kernels": kernel_breakdown(ours, batch, grad), "host_ms": host_ms(ours, batch, grad),
             "candidates": {}}  # fmt: skip
    if with_fbgemm:
        try:
            fbgemm = build_module("fbgemm", cfg, optimizer, device)
            entry["fbgemm_kernels"] = kernel_breakdown(fbgemm, batch, grad)
            entry["fbgemm_bwd_ms"] = time_backward(fbgemm, batch, grad, iters)
            del fbgemm
        except Exception as error:  # noqa: BLE001 - FBGEMM may reject a config; reported
            entry["fbgemm_error"] = f"{type(error).__name__}: {error}"[:300]
    snapshot = [t.detach().clone() for t in _training_state(ours)]
    expected = None
    for name in candidates:
        launch = plan_in_backward(CANDIDATES[name]())  # the timed backward is the whole one
        ours.backward_launch = launch
        try:
            # One step from the same state as every candidate: the same tables up to the
            # order of fp32 sums (chunk sizes differ), or the candidate is wrong.
            for t, saved in zip(_training_state(ours), snapshot):
                t.copy_(saved)
            lookup(ours, batch).backward(grad)
            # The first candidate's step is kept; later ones compare in place (no third copy
            # of the tables: wide-d512-fp16's took 30 GiB each, e45a0a4 ran out of memory).
            expected = expected or [t.detach().clone() for t in _training_state(ours)]
            diff = max(_max_abs_diff(a, b) for a, b in zip(_training_state(ours), expected))
            scale = max(b.abs().max().float().item() for b in expected)
            entry["candidates"][name] = {"launch": dataclasses.asdict(launch), "max_diff_vs_first": diff,
                                         "relative_diff": diff / max(scale, 1e-30),
                                         "bwd_ms": time_backward(ours, batch, grad, iters),
                                         "kernels": kernel_breakdown(ours, batch, grad, top=10)}  # fmt: skip
            if launch.piece_fit:  # what the grids were cut to (programs a multiprocessor, by compiled variant)
                entry["candidates"][name]["resident_programs"] = _resident_programs()
        except Exception as error:  # noqa: BLE001 - a candidate that fails to compile is reported
            entry["candidates"][name] = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(cfg.name, optimizer, name, entry["candidates"][name].get("bwd_ms"), flush=True)
    ours.backward_launch = None
    del ours
    torch.cuda.empty_cache()
    return entry


def best_candidate(report: dict, max_relative_diff: float = 1e-3, max_loss: float = 0.02) -> str:
    """The candidate with the best geometric mean of FBGEMM's backward ms over ours across
    the report's entries (those with FBGEMM's time), among candidates measured in every
    one of them without error, within ``max_relative_diff`` of the first candidate (the
    reference, HEAD's default in the device scripts) and nowhere more than ``max_loss``
    slower than it: a launch that becomes the default must not cost any profiled config
    more than the noise. An entry where the reference failed excludes every candidate."""
    entries = [e for e in report["entries"] if e.get("fbgemm_bwd_ms")]
    if not entries:
        raise ValueError("no entry with FBGEMM's backward time: nothing to rank candidates by")
    ratios: dict = {}
    for entry in entries:
        # Without the reference's time (it failed) nothing in the entry can be compared: no
        # candidate is measured in all entries then.
        reference = next(iter(entry["candidates"].values()), {}).get("bwd_ms")
        for name, result in entry["candidates"].items():
            ok = reference is not None and "bwd_ms" in result and result["relative_diff"] <= max_relative_diff
            ok = ok and result["bwd_ms"] <= reference * (1 + max_loss)
            ratios.setdefault(name, []).append(entry["fbgemm_bwd_ms"] / result["bwd_ms"] if ok else None)
    complete = {n: r for n, r in ratios.items() if len(r) == len(entries) and None not in r}
    if not complete:
        raise ValueError(f"no candidate measured in all {len(entries)} entries within {max_relative_diff}")
    return max(complete, key=lambda n: statistics.geometric_mean(complete[n]))


def suite_with(name: str, argv: list[str]) -> None:
    """The backward suite with our modules under candidate ``name``: FBGEMM's untouched."""
    from tbe_plugin.benchmarks import backward

    launch = plan_in_backward(CANDIDATES[name]())  # the suite times the whole backward
    build = backward.build_module

    def build_with_launch(provider, cfg, optimizer, device):
        module = build(provider, cfg, optimizer, device)
        if provider != backward.FBGEMM:
            module.backward_launch = launch
        return module

    backward.build_module = build_with_launch
    try:
        backward.main(argv)
    finally:
        backward.build_module = build
    out = backward.parse_args(argv).out
    with open(os.path.join(out, "suite_launch.json"), "w") as f:
        json.dump({"git": git_state(), "candidate": name, "launch": dataclasses.asdict(launch)}, f, indent=1)


def main(argv=None) -> list[dict]:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--best-of"]:
        with open(argv[1]) as f:
            print(best_candidate(json.load(f)))
        return []
    if argv[:1] == ["--suite-with"]:
        if argv[1] not in CANDIDATES:
            raise SystemExit(f"unknown candidate {argv[1]!r}; candidates: {', '.join(CANDIDATES)}")
        suite_with(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--configs", default="b8192,zipf1.15,b65536,fbgemm-standard,ctr-mix,long-bags")
    parser.add_argument("--optimizers", default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-fbgemm", action="store_true", help="skip FBGEMM's breakdown and time")
    args = parser.parse_args(argv)
    silence_fbgemm_logging()
    configs = {cfg.name: cfg for cfg in DEVICE_CONFIGS}
    unknown = [name for name in args.configs.split(",") if name not in configs]
    bad = [name for name in args.candidates.split(",") if name not in CANDIDATES]
    if unknown or bad:
        raise SystemExit(f"unknown configs {unknown} or candidates {bad}; configs: {', '.join(configs)}")
    os.makedirs(args.out, exist_ok=True)
    report = {"git": git_state(), "entries": []}
    for name in args.configs.split(","):
        for optimizer in args.optimizers.split(","):
            entry = profile_config(configs[name], optimizer, args.candidates.split(","), args.iters,
                                   not args.no_fbgemm)  # fmt: skip
            report["entries"].append(entry)
            with open(os.path.join(args.out, "profile_backward.json"), "w") as f:
                json.dump(report, f, indent=1)
    return report["entries"]


if __name__ == "__main__":
    main()
