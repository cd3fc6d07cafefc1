"""Backward + fused-optimizer A/B benchmark: our Triton TBE vs FBGEMM's, as training steps.

Run from the repo root: ``python -m tbe_plugin.benchmarks.backward [--smoke] [--suite S]
[--configs a,b] [--optimizers X,Y] [--out DIR]``. Writes DIR/backward.json and DIR/backward.md and prints
the markdown. Both modules get the same constructor arguments (``forward.tbe_module_kwargs``
with the optimizer set and stochastic rounding off), identical weights (FBGEMM's, filled
from a fixed seed and copied into ours via ``split_embedding_weights()``), identical
requests and one fixed output gradient per config. Per (config, optimizer): one training
step on both, comparing updated weights and optimizer states; then three timed modes, as
FBGEMM's own benchmark has them: ``fwd`` (forward, grad mode on), ``bwd``
(``out.backward(grad)`` alone, after an untimed forward) and ``fwd+bwd``.

Every timed backward is a real training step: weights and states move (Adam's step
count grows), which changes no kernel's work. Shared machinery lives in ``common``; the
configs and constructor arguments are the forward benchmark's.
"""

import argparse
import sys
import time

import torch

from tbe_plugin.benchmarks.common import (
    ABS_TOLERANCE, FORWARD_BYTES_FORMULA, SKEW_LEGEND, BenchConfig, InputBatch, add_run_arguments, batch_skew,
    benchmark_device, collect_environment, config_record, copy_tables_, fbgemm_api, fill_defaults,
    fill_tables_uniform_, forward_bytes, free_device_memory, generate_batches, geomeans, markdown_table,
    max_abs_diff, measure_copy_bandwidth, outputs_match, per_table_inputs, plan_in_backward, production_names,
    paired_ratios, report_header, silence_fbgemm_logging, skew_cells, summarize_ms, time_alternating, write_report,
)
from tbe_plugin.benchmarks.forward import FBGEMM, OURS, tbe_module_kwargs
from tbe_plugin.benchmarks.suite import (
    add_suite_argument, device_bytes_needed, is_production, memory_shortfall, select_configs,
)

OPTIMIZERS = ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM", "LAMB")
SUITE_OPTIMIZER = "EXACT_ROWWISE_ADAGRAD"
"""Runs on every config; the reference config (``REFERENCE_CONFIG``) runs every optimizer."""
REFERENCE_CONFIG = {"device": "b8192", "smoke": "smoke-mixed-d"}
MODES = ("fwd", "bwd", "fwd+bwd")
PROVIDERS = [OURS, FBGEMM]
TORCH_REFERENCE = "torch-fp32"
LEARNING_RATE, EPS = 0.01, 1.0e-8
# Optimizer states are fp32 on both sides and depend on the gradients alone, whose
# per-row sums only differ in order: a state matches within this fraction of its max.
STATE_REL_TOLERANCE = 1e-4
SORT_BYTES_PER_LOOKUP = 2 * (4 + 4)
# fp32 optimizer state per row as (floats per row, floats per row and column), FBGEMM's
# layout; only sizes the memory check before the modules exist (the byte count reads the
# module's own states).
STATE_FLOATS = {"EXACT_SGD": (0, 0), "EXACT_ROWWISE_ADAGRAD": (1, 0), "EXACT_ADAGRAD": (0, 1),
                "ADAM": (0, 2), "PARTIAL_ROWWISE_ADAM": (1, 1), "LAMB": (0, 2)}

BACKWARD_BYTES_FORMULA = (
    "bytes = B * sum_t(D_t) * 4 [fp32 grad_output, read once] "
    "+ 2 * sum_t(U_t * D_t) * w [each distinct row read and written once] "
    "+ 2 * sum_t(U_t * S_t) [its optimizer state read and written; S_t = 4 per rowwise "
    "state + 4 * D_t per elementwise state, 0 for SGD] "
    "+ n * s_idx + (T*B + 1) * s_off + [weighted] n * 4 [indices, offsets, per-sample "
    f"weights read once] + n * {SORT_BYTES_PER_LOOKUP} [sort, a lower bound: one write and one "
    "read of a 32-bit row key and a 32-bit position per lookup; 32 bits suffice below 2**31 "
    "rows and lookups], where U_t = distinct rows "
    "of table t in the request, n = lookups, w = bytes per weight. fwd+bwd counts forward "
    "+ backward bytes. FBGEMM's own benchmark counts 2x (bwd) and 3x (fwd+bwd) its forward "
    "figure B*sum(D)*(L*w + 4); those are in the JSON as fbgemm_formula_bytes."
)


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def build_module(name: str, cfg: BenchConfig, optimizer: str, device: torch.device) -> torch.nn.Module:
    """FBGEMM's TBE or ours, with the forward benchmark's arguments and this optimizer."""
    api = fbgemm_api()
    kwargs = tbe_module_kwargs(cfg, device) | dict(
        optimizer=api.EmbOptimType[optimizer], stochastic_rounding=False,
        learning_rate=LEARNING_RATE, eps=EPS,
    )
    if name == FBGEMM:
        return api.SplitTableBatchedEmbeddingBagsCodegen(**kwargs)
    from tbe_plugin import TritonTableBatchedEmbeddingBags

    module = TritonTableBatchedEmbeddingBags(**kwargs)
    module.backward_launch = plan_in_backward()  # the timed backward is the whole one
    return module


def lookup(module: torch.nn.Module, batch: InputBatch) -> torch.Tensor:
    return module(batch.indices, batch.offsets, per_sample_weights=batch.per_sample_weights)


def optimizer_states(module: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Per table, its optimizer-state views (``[]`` per table for EXACT_SGD)."""
    states = module.split_optimizer_states()
    return [list(s) for s in states] if states else [[] for _ in module.split_embedding_weights()]


def state_bytes_per_row(cfg: BenchConfig, module: torch.nn.Module) -> list[int]:
    """Bytes of optimizer state per row of each table, read off the module's own layout."""
    return [sum(s.numel() * s.element_size() for s in states) // rows
            for states, rows in zip(optimizer_states(module), cfg.rows)]


def memory_check(cfg: BenchConfig, optimizers: list[str], args, device: torch.device) -> str | None:
    """Why ``cfg`` cannot run with the most memory-hungry of ``optimizers``, or None."""
    def need(optimizer: str) -> int:
        per_row, per_column = STATE_FLOATS[optimizer]
        state = [4 * (per_row + per_column * dim) for dim in cfg.dims]
        # Where FBGEMM is n/a, reference_step holds an fp32 copy of the tables: a third provider.
        return device_bytes_needed(cfg, args.batches, state, providers=3 if cfg.weights_precision == "bf16" else 2)

    return memory_shortfall(device, max(need(optimizer) for optimizer in optimizers))


def backward_bytes(cfg: BenchConfig, batch: InputBatch, distinct: list[int], state_bytes: list[int]) -> dict:
    """Bytes one fused backward must move, per ``BACKWARD_BYTES_FORMULA``."""
    n = batch.indices.numel()
    parts = {
        "grad_output": cfg.batch_size * sum(cfg.dims) * 4,
        "rows": 2 * sum(u * d for u, d in zip(distinct, cfg.dims)) * cfg.weight_dtype.itemsize,
        "optimizer_state": 2 * sum(u * s for u, s in zip(distinct, state_bytes)),
        "indices": n * batch.indices.element_size() + batch.offsets.numel() * batch.offsets.element_size()
        + (0 if batch.per_sample_weights is None else n * 4),
        "sort": n * SORT_BYTES_PER_LOOKUP,
    }
    return {"total": sum(parts.values()), **parts, "distinct_rows": sum(distinct)}


@torch.no_grad()
def reference_step(cfg, optimizer, tables, states, batch, grad) -> tuple[list, list]:
    """Tables and states after one step from ``tables`` and zero states, in fp32: the row
    gradients from torch's embedding_bag autograd, the update from the project's reference."""
    from tbe_plugin.ops.reference import optimizer_step_reference

    expected_tables, expected_states, column = [], [], 0
    for table, table_states, (indices, offsets, weights) in zip(tables, states, per_table_inputs(cfg, batch)):
        dim = table.shape[1]
        fp32 = table.detach().to(torch.float32, copy=True).requires_grad_()
        with torch.enable_grad():
            pooled = torch.nn.functional.embedding_bag(
                indices, fp32, offsets, mode=cfg.pooling_mode, per_sample_weights=weights, include_last_offset=True)
            pooled.backward(grad[:, column : column + dim])
        column += dim
        touched = torch.unique(indices.to(torch.int64))
        rows = fp32.detach()[touched]
        moments = [torch.zeros((touched.numel(), *s.shape[1:]), device=s.device) for s in table_states]
        optimizer_step_reference(optimizer, rows, fp32.grad[touched], *(moments + [None, None])[:2],
                                 step=1, lr=LEARNING_RATE, eps=EPS)
        expected = table.clone()
        expected[touched] = rows.to(table.dtype)
        expected_tables.append(expected)
        full = [torch.zeros(s.shape, device=s.device) for s in table_states]
        for state, moment in zip(full, moments):
            state[touched] = moment
        expected_states.append(full)
    return expected_tables, expected_states


def compare_step(cfg, module, expected_tables, expected_states) -> dict:
    """Max |diff| of ``module``'s weights and states against the expected ones, and whether
    each table is within tolerance (weights: the forward's per-precision tolerance)."""
    weight_diffs = [max_abs_diff(w, e) for w, e in zip(module.split_embedding_weights(), expected_tables)]
    weights_ok = all(outputs_match(d, e, cfg.weights_precision) for d, e in zip(weight_diffs, expected_tables))
    state_diffs, states_ok = [0.0], True
    for states, expected in zip(optimizer_states(module), expected_states):
        for state, reference in zip(states, expected):
            diff = max_abs_diff(state, reference)
            scale = float(reference.float().abs().max()) if reference.numel() else 0.0
            state_diffs.append(diff)
            states_ok &= diff <= STATE_REL_TOLERANCE * scale + ABS_TOLERANCE
    return {"weights_max_abs_diff": max(weight_diffs), "states_max_abs_diff": max(state_diffs),
            "matches": bool(weights_ok and states_ok)}


def check_step(cfg, optimizer, modules, unavailable, batch, grad) -> tuple[dict, str]:
    """One training step on each module from identical weights; ours compared with FBGEMM
    (or, where FBGEMM is n/a, with ``reference_step``)."""
    if FBGEMM in modules:
        try:
            lookup(modules[FBGEMM], batch).backward(grad)
        except Exception as error:  # e.g. a dtype FBGEMM's kernels lack
            unavailable[FBGEMM] = _reason(error)
            del modules[FBGEMM]
    if OURS not in modules:
        return {}, FBGEMM if FBGEMM in modules else "none"
    if FBGEMM in modules:
        fbgemm = modules[FBGEMM]
        reference, expected = FBGEMM, (fbgemm.split_embedding_weights(), optimizer_states(fbgemm))
    else:
        ours = modules[OURS]
        reference, expected = TORCH_REFERENCE, reference_step(
            cfg, optimizer, ours.split_embedding_weights(), optimizer_states(ours), batch, grad)
    try:
        lookup(modules[OURS], batch).backward(grad)
    except Exception as error:
        unavailable[OURS] = _reason(error)
        del modules[OURS]
        return {}, reference
    return {OURS: compare_step(cfg, modules[OURS], *expected)}, reference


def time_modes(modules, batches, grad, args, device) -> dict[str, dict[str, list[float]]]:
    """Per mode, every provider's per-call milliseconds, providers alternating."""
    def batch(i: int) -> InputBatch:
        return batches[i % len(batches)]

    forward = {name: (lambda i, m=m: lookup(m, batch(i))) for name, m in modules.items()}
    backward = {name: (lambda out: out.backward(grad)) for name in modules}
    step = {name: (lambda i, m=m: lookup(m, batch(i)).backward(grad)) for name, m in modules.items()}
    rounds = dict(min_ms=args.min_timed_ms, max_iters=args.max_iters)
    return {
        "fwd": time_alternating(forward, args.iters, args.warmup, device, **rounds),
        "bwd": time_alternating(backward, args.iters, args.warmup, device, prepare=forward, **rounds),
        "fwd+bwd": time_alternating(step, args.iters, args.warmup, device, **rounds),
    }


def skipped_entry(cfg: BenchConfig, optimizer: str, reason: str) -> dict:
    """The report entry of a (config, optimizer) that did not run, both providers n/a."""
    return {"name": cfg.name, "optimizer": optimizer, "config": config_record(cfg), "shape": cfg.describe(),
            "production": is_production(cfg), "skipped": reason, "skew": None, "reference": "none",
            "providers": {n: {"status": "n/a", "reason": reason} for n in PROVIDERS}, "ratios": {}}


def run_entry(cfg, optimizer, batches, grad, args, device, copy_tbps) -> dict:
    """Build both modules, check one step, time the three modes; everything freed on return."""
    modules, unavailable = {}, {}
    for name in (FBGEMM, OURS):
        try:
            modules[name] = build_module(name, cfg, optimizer, device)
        except Exception as error:
            unavailable[name] = _reason(error)
    if OURS not in modules:
        return {"name": cfg.name, "optimizer": optimizer, "providers": {
            n: {"status": "n/a", "reason": unavailable.get(n, "ours is n/a")} for n in PROVIDERS}, "ratios": {}}
    source = next(iter(modules.values())).split_embedding_weights()
    fill_tables_uniform_(source, seed=1234)
    for module in modules.values():
        copy_tables_(module.split_embedding_weights(), source)
    skew = batch_skew(cfg, batches[0])
    distinct = skew["distinct_per_table"]
    forward = forward_bytes(cfg, batches[0])
    backward = backward_bytes(cfg, batches[0], distinct, state_bytes_per_row(cfg, modules[OURS]))
    moved = {"fwd": forward["total"], "bwd": backward["total"], "fwd+bwd": forward["total"] + backward["total"]}
    fbgemm_formula = {mode: k * forward["fbgemm_formula_bytes"] for k, mode in zip((1, 2, 3), MODES)}
    checks, reference = check_step(cfg, optimizer, modules, unavailable, batches[0], grad)
    samples = time_modes(modules, batches, grad, args, device) if modules else {}
    results = {}
    for name in PROVIDERS:
        if name not in modules:
            results[name] = {"status": "n/a", "reason": unavailable.get(name, "not built")}
            continue
        modes = {}
        for mode in MODES:
            stats = summarize_ms(samples[mode][name])
            tbps = moved[mode] / (stats["median_ms"] * 1e-3) / 1e12
            modes[mode] = {**stats, "tbps": tbps, "pct_copy_bw": 100.0 * tbps / copy_tbps}
        results[name] = {"status": "ok", "modes": modes, **checks.get(name, {"reference": True})}
    ratios, rounds = {}, {}
    if all(results[n]["status"] == "ok" for n in PROVIDERS):
        ratios = {mode: results[FBGEMM]["modes"][mode]["median_ms"] / results[OURS]["modes"][mode]["median_ms"]
                  for mode in MODES}
        rounds = {mode: paired_ratios(samples[mode][FBGEMM], samples[mode][OURS]) for mode in MODES}
    return {"name": cfg.name, "optimizer": optimizer, "config": config_record(cfg), "shape": cfg.describe(),
            "production": is_production(cfg), "skew": skew,
            "bytes": {"fwd": forward, "bwd": backward, "fwd+bwd": moved["fwd+bwd"],
                      "fbgemm_formula_bytes": fbgemm_formula},
            "reference": reference, "providers": results, "ratios": ratios, "round_ratios": rounds}


def plan(args) -> list[tuple[BenchConfig, list[str]]]:
    """(config, optimizers) to run: by default the suite optimizer on every selected config
    and every optimizer on the reference config; ``--optimizers`` names them for all."""
    configs = select_configs(args)
    if args.optimizers is not None:
        wanted = [o.strip().upper() for o in args.optimizers.split(",") if o.strip()]
        unknown = [o for o in wanted if o not in OPTIMIZERS]
        if unknown or not wanted:
            raise SystemExit(f"unknown optimizer(s) {unknown}; choose from {list(OPTIMIZERS)}")
        return [(cfg, wanted) for cfg in configs]
    reference = REFERENCE_CONFIG["smoke" if args.smoke else "device"]
    return [(cfg, list(OPTIMIZERS) if cfg.name == reference else [SUITE_OPTIMIZER]) for cfg in configs]


def render_markdown(report: dict) -> str:
    settings = report["settings"]
    entries = [e for e in report["entries"] if "config" in e]
    header = [
        *report_header("# TBE backward + fused optimizer: " + " vs ".join(PROVIDERS), report),
        f"- training: learning rate {settings['learning_rate']}, eps {settings['eps']}, "
        "stochastic_rounding=False on both, weights U(-1, 1); each timed backward is a training step",
        f"- fwd bytes: {FORWARD_BYTES_FORMULA}",
        f"- bwd bytes: {BACKWARD_BYTES_FORMULA}",
        f"- ratio = median ms of {FBGEMM} / median ms of {OURS}: > 1 means ours is faster. Rounds: the "
        "same ratio round by round (each round calls both, next to each other), its p10-p90 and the "
        "share of rounds below 1.0.",
        f"- check: one step on both from identical weights; max |diff| of the updated weights and "
        f"optimizer states, ours vs `{FBGEMM}` (or, where FBGEMM is n/a, `{TORCH_REFERENCE}`: torch "
        "embedding_bag autograd in fp32 + tbe_plugin.ops.reference.optimizer_step_reference). "
        "Tolerance: weights as the forward benchmark's (relative to max |w|, per precision), "
        f"states {STATE_REL_TOLERANCE:g} x max |state|.",
        f"- {SKEW_LEGEND}",
        "",
    ]
    if report["mismatches"]:
        header += [f"**Mismatch after one step** (beyond tolerance): {', '.join(report['mismatches'])}", ""]
    parts = list(header)
    means = [("geomean", report["geomean"]),
             (f"geomean (production: {production_names(entries)})", report["geomean_production"])]
    for mode in MODES:
        rows = []
        for e in entries:
            res = e["providers"]
            ok = {n: res[n]["status"] == "ok" for n in PROVIDERS}
            row = [e["name"], e["optimizer"], *skew_cells(e["skew"])]
            row += [f"{res[n]['modes'][mode]['median_ms']:.4g}" if ok[n] else "n/a" for n in PROVIDERS]
            row += [f"{res[n]['modes'][mode]['tbps']:.3g} ({res[n]['modes'][mode]['pct_copy_bw']:.3g}%)"
                    if ok[n] else "n/a" for n in PROVIDERS]
            row.append(f"{e['ratios'][mode]:.3f}" if mode in e["ratios"] else "n/a")
            spread = e.get("round_ratios", {}).get(mode)
            row.append(f"{spread['p10']:.3f}-{spread['p90']:.3f} ({100 * spread['below_1']:.0f}%)" if spread else "n/a")
            rows.append(row)
        for label, by_mode in means:
            mean = by_mode.get(mode)
            rows.append([label, *[""] * (3 + 2 * len(PROVIDERS)), f"{mean:.3f}" if mean else "n/a", ""])
        columns = ["config", "optimizer", "distinct", "hot1%", *(f"{n} ms" for n in PROVIDERS),
                   *(f"{n} TB/s (% copy)" for n in PROVIDERS), f"{FBGEMM}/{OURS}",
                   "rounds p10-p90 (share < 1)"]
        parts += [f"## {mode}", "", markdown_table(columns, rows), ""]
    rows = []
    for e in entries:
        ours = e["providers"][OURS]
        row = [e["name"], e["optimizer"], e["shape"], skew_cells(e["skew"])[0], e["reference"]]
        if "weights_max_abs_diff" in ours:
            flag = "yes" if ours["matches"] else "**MISMATCH**"
            row += [f"{ours['weights_max_abs_diff']:.2e}", f"{ours['states_max_abs_diff']:.2e}", flag]
        else:
            row += ["n/a", "n/a", "n/a"]
        rows.append(row)
    parts += ["## One step from identical weights (ours vs reference)", "",
              markdown_table(["config", "optimizer", "shape", "distinct rows", "reference",
                              "max abs diff weights", "max abs diff states", "match"], rows), ""]
    spread = [[e["name"], e["optimizer"], mode, n,
               *(f"{e['providers'][n]['modes'][mode][k]:.4g}" for k in ("p10_ms", "median_ms", "p90_ms"))]
              for e in entries for mode in MODES for n in PROVIDERS if e["providers"][n]["status"] == "ok"]
    parts += ["## Spread (ms)", "",
              markdown_table(["config", "optimizer", "mode", "provider", "p10", "median", "p90"], spread)]
    unavailable = [f"- {e['name']} / {e['optimizer']} / {n}: {r['reason']}" for e in report["entries"]
                   for n, r in e["providers"].items() if r["status"] != "ok"]
    if unavailable:
        parts += ["", "## Not available", "", *unavailable]
    return "\n".join(parts)


def write_partial_report(report: dict, out_dir: str) -> str:
    """Fill in the geomeans and mismatches of the entries so far, write both files, and
    return the markdown."""
    report["geomean"] = geomeans(report["entries"], list(MODES))
    report["geomean_production"] = geomeans(report["entries"], list(MODES), production_only=True)
    report["mismatches"] = [f"{e['name']}/{e['optimizer']}" for e in report["entries"]
                            if e["providers"][OURS].get("matches") is False]
    markdown = render_markdown(report)
    write_report(out_dir, "backward", report, markdown)
    return markdown


def _rounds_text(args) -> str:
    """How many timed rounds, for the report's method line."""
    if args.min_timed_ms <= 0:
        return f"{args.iters} rounds"
    return (f"{args.iters} rounds or, for short calls, as many as bring the slower provider's last warm-up "
            f"call times the rounds to {args.min_timed_ms:g} ms (at most {max(args.iters, args.max_iters)}; "
            "the same for both; each entry's sample count is its rounds)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, "backward", "timed rounds per mode (default 20, smoke 3)")
    add_suite_argument(parser)
    parser.add_argument("--optimizers", default=None,
                        help=f"comma-separated, run on every selected config; default: {SUITE_OPTIMIZER} "
                             "on every config, every optimizer on the reference config")
    args = parser.parse_args(argv)
    fill_defaults(args, smoke=dict(iters=3, warmup=1, batches=2, copy_gib=1 / 16),
                  device=dict(iters=20, warmup=3, batches=3, copy_gib=2.0))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = benchmark_device(args.smoke)
    has_cuda = device.type == "cuda"
    silence_fbgemm_logging()
    work = plan(args)
    copy_bw = measure_copy_bandwidth(device, int(args.copy_gib * 2**30))
    clock = "CUDA events" if has_cuda else "time.perf_counter"
    report = {
        "benchmark": "tbe_backward", "mode": "smoke" if args.smoke else "device",
        "environment": collect_environment(device), "copy_bandwidth": copy_bw, "providers": PROVIDERS,
        "modes": list(MODES), "bytes_formula": {"fwd": FORWARD_BYTES_FORMULA, "bwd": BACKWARD_BYTES_FORMULA},
        "settings": {**{k: getattr(args, k) for k in ("iters", "min_timed_ms", "max_iters", "warmup", "batches",
                                                       "seed")},
                     "learning_rate": LEARNING_RATE, "eps": EPS, "stochastic_rounding": False},
        "method": (f"per mode, {args.warmup} warm-up calls per provider, then {_rounds_text(args)} calling "
                   f"both once, order alternating (A B, B A, ...), {clock} per call, median with p10/p90; "
                   f"{args.batches} distinct requests cycled, one fixed grad_output ~ N(0, 1) per config. "
                   "fwd: forward in grad mode, output discarded; bwd: an untimed forward, then "
                   "out.backward(grad) timed alone; fwd+bwd: forward and backward in one sample"),
        "configs": [], "entries": [],
    }
    markdown = write_partial_report(report, args.out)
    for cfg, optimizers in work:
        began = time.perf_counter()
        shortfall = memory_check(cfg, optimizers, args, device)
        if shortfall is not None:
            print(f"[backward] {cfg.name}: {shortfall}", file=sys.stderr, flush=True)
            report["configs"].append({"name": cfg.name, "input_source": "not generated", "skipped": shortfall})
            report["entries"] += [skipped_entry(cfg, optimizer, shortfall) for optimizer in optimizers]
            markdown = write_partial_report(report, args.out)
            continue
        batches, input_source = generate_batches(cfg, args.batches, device, seed=args.seed)
        generator = torch.Generator(device=device).manual_seed(args.seed + 99)
        grad = torch.randn(cfg.batch_size, sum(cfg.dims), generator=generator, device=device)
        report["configs"].append({"name": cfg.name, "input_source": input_source})
        for optimizer in optimizers:
            print(f"[backward] {cfg.name} {optimizer} ...", file=sys.stderr, flush=True)
            report["entries"].append(run_entry(cfg, optimizer, batches, grad, args, device, copy_bw["tbps"]))
            free_device_memory()
            report["configs"][-1]["elapsed_s"] = time.perf_counter() - began
            # Rewritten after every entry: a run stopped by a time limit keeps what it measured.
            markdown = write_partial_report(report, args.out)
        del batches, grad
        free_device_memory()
    if report["mismatches"]:
        print(f"[backward] MISMATCH AFTER ONE STEP: {', '.join(report['mismatches'])}", file=sys.stderr)
    print(markdown)
    return report

if __name__ == "__main__":
    main()
