"""The A/B's reading of the training app's runs: per run, throughput from the wall span of
its timed steps and where its wall time went; per backend, the median and spread over runs
and whether the difference is inside the noise; loss divergences; the profiled phases.
Pure functions on the runs ``scripts/ab.py`` loads from the app's metrics records."""

import statistics
from typing import Any, Dict, List, Optional

BACKENDS = ("fbgemm", "triton")
PHASE_ROWS = ("tbe_forward", "tbe_backward", "all_to_all", "dense_and_other", "total_ms", "step_ms")

def timed_steps(run: Dict[str, Any], skip: int) -> List[float]:
    """Host step times after the first ``skip`` steps (drained steps have none)."""
    return [r["step_ms"] for r in run["step"][skip:] if r["step_ms"] is not None]


def wall_span(run: Dict[str, Any], skip: int) -> Optional[Dict[str, Any]]:
    """The timed steps' wall span from the metrics records' own ``time``: from the end of
    the last of the first ``skip`` steps (with ``skip`` 0, the loop's start: the ``startup``
    record) to the end of the last step (the app stamps the step that pays a host sync
    after it), the steps between counted by their numbers (drained steps too: they
    trained); ``train_s`` is the span less the pauses inside it that are not training (the
    records' ``pause_s``: evaluations, the profiler's start and stop, checkpoints' checks
    and saves, re-plans). None when the records carry no time (an older app's metrics) or
    no step follows the warm-up."""
    steps = run["step"]
    if not steps or any(r.get("time") is None for r in steps):
        return None
    first = steps[skip - 1] if 0 < skip < len(steps) else run.get("startup") if skip == 0 else None
    if not first or first.get("time") is None or first.get("step") is None:
        return None
    last = steps[-1]
    counted = last["step"] - first["step"]
    if counted <= 0:
        return None
    inside = [p for p in run.get("pauses", []) if first["time"] < p["time"] <= last["time"]]
    span = last["time"] - first["time"]
    paused = sum(p["pause_s"] for p in inside)
    return {"from_step": first["step"], "to_step": last["step"], "steps": counted, "span_s": span, "paused_s": paused,
            "pauses": [[p["kind"], p["step"], p["pause_s"]] for p in inside], "train_s": span - paused}  # fmt: skip


def throughput(run: Dict[str, Any], skip: int) -> Dict[str, Any]:
    """One run: examples/s over the wall span of its timed steps (``wall_span``: it holds
    the host syncs, the ranks' agreement and drains, which the step times leave out; its
    pauses for evaluation, profiler and checkpoints are not training and left out), with
    ``source`` "wall span"; for metrics without ``time``, from the mean host step time
    ("sum of step_ms": an older app's). ``step_ms_examples_per_s``: what the step times
    alone would say. The spread of single host step times (p10, p50, p90)."""
    ms = sorted(timed_steps(run, skip))
    config = run.get("config", {})
    examples = config.get("batch_size", 0) * config.get("world_size", 1)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))] if ms else None  # noqa: E731
    step_mean = statistics.fmean(ms) if ms else None
    out: Dict[str, Any] = {"p10_ms": pick(0.1), "p50_ms": statistics.median(ms) if ms else None, "p90_ms": pick(0.9),
                           "step_ms_mean": step_mean, "step_ms_examples_per_s": examples / (step_mean / 1e3)
                           if step_mean else None, "span": wall_span(run, skip)}  # fmt: skip
    span = out["span"]
    if span is not None and span["train_s"] > 0:
        return {"source": "wall span", "steps_timed": span["steps"], "mean_ms": span["train_s"] * 1e3 / span["steps"],
                "examples_per_s": examples * span["steps"] / span["train_s"], **out}  # fmt: skip
    if not ms:
        return {"source": None, "steps_timed": 0, "mean_ms": None, "examples_per_s": None, **out}
    return {"source": "sum of step_ms", "steps_timed": len(ms), "mean_ms": step_mean,
            "examples_per_s": out["step_ms_examples_per_s"], **out}  # fmt: skip


def profiled_extra_s(run: Dict[str, Any], skip: int) -> Optional[float]:
    """An estimate of what profiling cost the profiled steps (in their step times, so in
    the timed span when they fall in it): their host step times less as many of the median
    of the other timed steps. None without a profile or its steps in the records."""
    steps = (run.get("phases") or {}).get("profiled_steps")
    if not steps:
        return None
    lo, hi = steps
    profiled = [r["step_ms"] for r in run["step"] if lo <= r["step"] <= hi and r["step_ms"] is not None]
    others = [r["step_ms"] for r in run["step"][skip:] if not lo <= r["step"] <= hi and r["step_ms"] is not None]
    if not profiled or not others:
        return None
    return (sum(profiled) - len(profiled) * statistics.median(others)) / 1e3


def time_breakdown(run: Dict[str, Any], skip: int) -> Dict[str, Any]:
    """Where a run's wall time went: ``wall_s`` the subprocess's (torchrun and all),
    ``steps_s`` the sum of its host step times (``warmup_s`` of the first ``skip``),
    ``other_s`` = wall - steps; ``startup_s`` from the launch until the first step,
    ``loop_s`` from there to the end of the last step (``loop_outside_steps_s`` of it
    outside the step times: ``paused_s`` evaluations, profiler, checkpoints, the rest
    ``loop_other_s`` host syncs, agreement, drains), ``end_s`` after it (final drain,
    checkpoint, evaluation, exit). ``source``: "records' time" (the app's ``time`` and
    durations, with the launch time from timing.json; the start-up split in ``startup``,
    the end's in ``end``), "arrival of records (polled)" for the run folders of an older
    A/B (the times at which its records appeared: start-up until the config record), or
    None (unknown; then None where unknown)."""
    timing = run.get("timing") or {}
    ms = [r["step_ms"] for r in run["step"] if r["step_ms"] is not None]
    warmup = [r["step_ms"] for r in run["step"][:skip] if r["step_ms"] is not None]
    wall, launched = timing.get("wall_s"), timing.get("launched_at")
    steps_s = sum(ms) / 1e3 if ms else None
    known = lambda *xs: all(x is not None for x in xs)  # noqa: E731
    minus = lambda a, b: a - b if known(a, b) else None  # noqa: E731
    startup, final = run.get("startup") or {}, run.get("final") or {}
    last_at = run["step"][-1].get("time") if run["step"] else None
    paused_s, startup_split, end_split = None, None, None
    if known(startup.get("time"), last_at):
        source, loop_at = "records' time", startup["time"]
        ended = launched + wall if known(launched, wall) else None
        startup_s = minus(loop_at, launched) if launched is not None else startup.get("startup_s")
        loop_s, end_s = last_at - loop_at, minus(ended, last_at)
        paused_s = sum(p["pause_s"] for p in run.get("pauses", []) if loop_at < p["time"] <= last_at)
        startup_split = {"launch_s": minus(startup.get("process_start"), launched),
                         **{k: startup.get(k) for k in ("imports_s", "config_s", "process_group_s", "build_s",
                                                         "restore_s", "data_setup_s")}}  # fmt: skip
        end_split = {"in_app_s": minus(final.get("time"), last_at), "exit_s": minus(ended, final.get("time"))}
    else:  # an older app's records: when they appeared in the file (timing.json of an older ab.py)
        config_at, old_last_at = timing.get("config_at_s"), timing.get("last_step_at_s")
        source = "arrival of records (polled)" if config_at is not None else None
        startup_s, loop_s, end_s = config_at, minus(old_last_at, config_at), minus(wall, old_last_at)
    outside = minus(loop_s, steps_s)
    return {"source": source, "wall_s": wall, "steps_s": steps_s, "warmup_s": sum(warmup) / 1e3 if warmup else None,
            "other_s": minus(wall, steps_s), "startup_s": startup_s, "loop_s": loop_s, "loop_outside_steps_s": outside,
            "paused_s": paused_s, "loop_other_s": minus(outside, paused_s), "end_s": end_s, "startup": startup_split,
            "end": end_split, "drained_steps": len(run["step"]) - len(ms), "evals": len(run["eval"]),
            "profiled": "phases" in run, "profiled_extra_s": profiled_extra_s(run, skip),
            "timing_json": timing or None}  # fmt: skip


def compare_backends(per_run: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per backend the median examples/s over its runs and their range; the ratio
    triton / fbgemm; the noise: the larger relative range of one backend's runs. A backend
    with no timed run is left out (then no ratio); one with a single run has no range (then
    the noise is unknown: None)."""
    backends: Dict[str, Any] = {}
    for backend in BACKENDS:
        rates = [r["throughput"]["examples_per_s"] for r in per_run if r["backend"] == backend]
        rates = [x for x in rates if x is not None]
        if not rates:
            continue
        median = statistics.median(rates)
        spread = (max(rates) - min(rates)) / median if len(rates) > 1 else None
        backends[backend] = {"runs": len(rates), "median_examples_per_s": median, "min": min(rates), "max": max(rates),
                             "relative_range": spread}  # fmt: skip
    if len(backends) < len(BACKENDS):
        return {"backends": backends, "ratio": None, "noise": None, "inside_noise": None}
    ratio = backends["triton"]["median_examples_per_s"] / backends["fbgemm"]["median_examples_per_s"]
    ranges = [b["relative_range"] for b in backends.values()]
    noise = None if None in ranges else max(ranges)
    return {"backends": backends, "ratio": ratio, "noise": noise,
            "inside_noise": None if noise is None else abs(ratio - 1) <= noise}  # fmt: skip


def noise_sentence(comparison: Dict[str, Any]) -> str:
    ratio, noise = comparison["ratio"], comparison["noise"]
    absent = [b for b in BACKENDS if b not in comparison["backends"]]
    if len(absent) == len(BACKENDS):
        return "No timed steps: no throughput to compare."
    if ratio is None:
        return (f"The backends' throughputs cannot be compared: no finished run of {' or '.join(absent)} with "
                "timed steps.")  # fmt: skip
    difference = f"{abs(ratio - 1):.1%}"
    if noise is None:
        single = [b for b, s in comparison["backends"].items() if s["relative_range"] is None]
        return (f"The run-to-run noise is unknown ({' and '.join(single)}: a single timed run), so these runs "
                f"cannot tell whether the difference ({difference}) is more than noise.")  # fmt: skip
    if comparison["inside_noise"]:
        return (f"The difference ({difference}) is inside the run-to-run noise ({noise:.1%}, the widest range of "
                "one backend's runs): these runs do not tell the backends apart in speed.")
    if ratio > 1:
        return f"triton is faster: {ratio:.3f}x fbgemm's throughput, outside the run-to-run noise ({noise:.1%})."
    return (f"fbgemm is faster: triton reaches {ratio:.3f}x its throughput ({difference} less), outside the "
            f"run-to-run noise ({noise:.1%}).")


def divergence(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """The largest |loss_a - loss_b| over the steps both ran, and where."""
    la = {r["step"]: r["loss"] for r in a["step"]}
    lb = {r["step"]: r["loss"] for r in b["step"]}
    common = sorted(set(la) & set(lb))
    if not common:
        return {"max_abs": None, "at_step": None, "steps": 0}
    worst = max(common, key=lambda s: abs(la[s] - lb[s]))
    return {"max_abs": abs(la[worst] - lb[worst]), "at_step": worst, "steps": len(common)}


def divergences(runs: Dict[str, Dict[str, Any]], names: List[str]) -> Dict[str, Any]:
    """Between the first run of each backend, and between each backend's first two runs;
    where a run it needs is missing, why it cannot be made (``cannot``)."""
    first = {b: [n for n in names if runs[n]["backend"] == b] for b in BACKENDS}
    cannot = lambda why: {"max_abs": None, "at_step": None, "steps": 0, "cannot": why}  # noqa: E731
    absent = [b for b in BACKENDS if not first[b]]
    out = {"fbgemm vs triton": cannot(f"no finished run of {' or '.join(absent)}") if absent else
           divergence(runs[first["fbgemm"][0]], runs[first["triton"][0]])}  # fmt: skip
    for backend, own in first.items():
        out[f"{backend} run to run"] = (divergence(runs[own[0]], runs[own[1]]) if len(own) > 1 else
                                        cannot(f"{'only one' if own else 'no'} finished run of {backend}"))  # fmt: skip
    return out


def median_phases(runs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The median over a backend's runs of each phase's ms per step."""
    recorded = [r["phases"] for r in runs if r.get("phases")]
    if not recorded:
        return None
    out: Dict[str, Any] = {k: statistics.median(p[k] for p in recorded) for k in PHASE_ROWS if k in recorded[0]}
    out["timing"], out["runs"] = recorded[0].get("timing", "unknown"), len(recorded)
    return out
