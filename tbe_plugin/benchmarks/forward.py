"""Pooled-forward A/B benchmark: our Triton TBE vs FBGEMM vs torch.nn.EmbeddingBag.

Run from the repo root: ``python -m tbe_plugin.benchmarks.forward [--smoke] [--suite S]
[--configs a,b] [--self-check] [--out DIR]``. Writes DIR/forward.json and DIR/forward.md and
prints the markdown. Every provider reads identical weights (FBGEMM's, filled from a fixed
seed and copied into ours via ``split_embedding_weights()``) and identical requests; each
config first checks ours against FBGEMM's output, then times all providers alternately.
The configs (``suite``) are ``TBEConfig``s with FBGEMM-generated inputs and production-shaped
``Workload``s; shared machinery (inputs, timing, bytes, reports) lives in ``common``.
"""

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable

import torch

from tbe_plugin.benchmarks.common import (
    FORWARD_BYTES_FORMULA, SKEW_LEGEND, BenchConfig, InputBatch, add_run_arguments, batch_skew, benchmark_device,
    collect_environment, config_record, copy_tables_, fbgemm_api, fill_defaults, fill_tables_uniform_,
    forward_bytes, free_device_memory, generate_batches, geomeans, markdown_table, max_abs_diff,
    measure_copy_bandwidth, outputs_match, per_table_inputs, production_names, report_header,
    silence_fbgemm_logging, skew_cells, summarize_ms, time_alternating, write_report,
)
from tbe_plugin.benchmarks.suite import (  # noqa: F401  (SMOKE/DEVICE_CONFIGS: the tests' and callers' names)
    DEVICE_CONFIGS, SMOKE_CONFIGS, add_suite_argument, device_bytes_needed, is_production, memory_shortfall,
    select_configs,
)

ROWWISE_STATE_BYTES = 4  # the benchmark's modules use rowwise Adagrad: one fp32 per row

OURS, FBGEMM, TORCH = "ours", "fbgemm", "torch"
TWIN = "-twin"  # suffix of the second, identical module in --self-check


@dataclasses.dataclass
class Provider:
    """One implementation under test: its forward and its per-table weight views."""

    name: str
    forward: Callable[[InputBatch], torch.Tensor]
    tables: list[torch.Tensor]


def tbe_module_kwargs(cfg: BenchConfig, device: torch.device) -> dict:
    """The constructor arguments given to FBGEMM's module and, unchanged, to ours."""
    api = fbgemm_api()
    on_cpu = device.type == "cpu"
    location = api.EmbeddingLocation.HOST if on_cpu else api.EmbeddingLocation.DEVICE
    compute = api.ComputeDevice.CPU if on_cpu else api.ComputeDevice.CUDA
    return dict(
        embedding_specs=[(rows, d, location, compute) for rows, d in zip(cfg.rows, cfg.dims)],
        feature_table_map=None,
        optimizer=api.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
        weights_precision=api.SparseType(cfg.weights_precision),
        output_dtype=api.SparseType.FP32,
        pooling_mode=api.PoolingMode.SUM if cfg.pooling_mode == "sum" else api.PoolingMode.MEAN,
        bounds_check_mode=api.BoundsCheckMode.WARNING,
        device=device,
    )


def _module_provider(name: str, module: torch.nn.Module) -> Provider:
    def forward(batch: InputBatch) -> torch.Tensor:
        return module(batch.indices, batch.offsets, per_sample_weights=batch.per_sample_weights)

    return Provider(name, forward, list(module.split_embedding_weights()))


def build_fbgemm(name: str, cfg: BenchConfig, device: torch.device) -> Provider:
    module = fbgemm_api().SplitTableBatchedEmbeddingBagsCodegen(**tbe_module_kwargs(cfg, device))
    return _module_provider(name, module)


def build_ours(name: str, cfg: BenchConfig, device: torch.device) -> Provider:
    from tbe_plugin import TritonTableBatchedEmbeddingBags  # written alongside: import late

    return _module_provider(name, TritonTableBatchedEmbeddingBags(**tbe_module_kwargs(cfg, device)))


def build_torch(cfg: BenchConfig, tables: list[torch.Tensor], batches: list[InputBatch]) -> Provider:
    """One torch.nn.EmbeddingBag per table, sharing ``tables``' storage; outputs concatenated."""
    bags = [torch.nn.EmbeddingBag.from_pretrained(table, freeze=False, mode=cfg.pooling_mode,
                                                  include_last_offset=True) for table in tables]
    # Per-table slicing reads offsets on the host: do it once per batch, outside the timing.
    plans = {id(batch): per_table_inputs(cfg, batch) for batch in batches}

    def forward(batch: InputBatch) -> torch.Tensor:
        outputs = []
        for bag, (indices, offsets, weights) in zip(bags, plans[id(batch)]):
            if weights is not None:
                weights = weights.to(bag.weight.dtype)
            outputs.append(bag(indices, offsets, per_sample_weights=weights))
        return torch.cat(outputs, dim=1)

    return Provider(TORCH, forward, tables)


@torch.no_grad()
def fp32_reference(cfg: BenchConfig, tables: list[torch.Tensor], batch: InputBatch) -> torch.Tensor:
    """Pooled output from fp32 copies of the tables (one table upcast at a time)."""
    outputs = []
    for table, (indices, offsets, weights) in zip(tables, per_table_inputs(cfg, batch)):
        outputs.append(torch.nn.functional.embedding_bag(
            indices, table.float(), offsets, mode=cfg.pooling_mode, per_sample_weights=weights,
            include_last_offset=True))
    return torch.cat(outputs, dim=1)


def _builders(self_check: bool) -> list[tuple[str, Callable]]:
    if self_check:
        return [(FBGEMM, build_fbgemm), (FBGEMM + TWIN, build_fbgemm), (OURS, build_ours), (OURS + TWIN, build_ours)]
    return [(FBGEMM, build_fbgemm), (OURS, build_ours)]


def _build_providers(cfg, device, batches, self_check) -> tuple[dict[str, Provider], dict]:
    """Build every provider that this stack supports; unsupported ones get a reason."""
    providers, unavailable = {}, {}
    for name, build in _builders(self_check):
        try:
            providers[name] = build(name, cfg, device)
        except Exception as error:
            unavailable[name] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    if not providers:
        return providers, unavailable
    source = next(iter(providers.values())).tables
    fill_tables_uniform_(source, seed=1234)
    for provider in list(providers.values())[1:]:
        copy_tables_(provider.tables, source)
    if not self_check:
        providers[TORCH] = build_torch(cfg, source, batches)
    return providers, unavailable


def _check_outputs(cfg, providers, unavailable, batch) -> tuple[dict, str]:
    """Max |diff| of every provider against FBGEMM (else an fp32 torch reference)."""
    outputs = {}
    for name, provider in list(providers.items()):
        try:
            with torch.no_grad():
                outputs[name] = provider.forward(batch)
        except Exception as error:
            unavailable[name] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            del providers[name]
    if not outputs:
        return {}, "none"
    if FBGEMM in outputs:
        reference_name, reference = FBGEMM, outputs[FBGEMM]
    else:
        tables = next(iter(providers.values())).tables
        reference_name, reference = "torch-fp32", fp32_reference(cfg, tables, batch)
    checks = {}
    for name, output in outputs.items():
        if name == reference_name:
            continue
        diff = max_abs_diff(output, reference)
        checks[name] = {"max_abs_diff": diff,
                        "matches": outputs_match(diff, reference, cfg.weights_precision)}
    return checks, reference_name


def skipped_entry(cfg: BenchConfig, names: list[str], reason: str) -> dict:
    """The report entry of a config that did not run, every provider n/a for ``reason``."""
    return {"name": cfg.name, "config": config_record(cfg), "shape": cfg.describe(),
            "production": is_production(cfg), "input_source": "not generated", "skipped": reason,
            "skew": None, "bytes": None, "reference": "none", "ratios": {},
            "providers": {name: {"status": "n/a", "reason": reason} for name in names}}


def run_config(cfg: BenchConfig, args, device: torch.device, copy_tbps: float) -> dict:
    names = [name for name, _ in _builders(args.self_check)] + ([] if args.self_check else [TORCH])
    needed = device_bytes_needed(cfg, args.batches, [ROWWISE_STATE_BYTES] * cfg.num_tables,
                                 providers=len(_builders(args.self_check)))  # torch shares FBGEMM's tables
    shortfall = memory_shortfall(device, needed)
    if shortfall is not None:
        return skipped_entry(cfg, names, shortfall)
    batches, input_source = generate_batches(cfg, args.batches, device, seed=args.seed)
    providers, unavailable = _build_providers(cfg, device, batches, args.self_check)
    checks, reference_name = _check_outputs(cfg, providers, unavailable, batches[0])
    moved = forward_bytes(cfg, batches[0])
    calls = {name: (lambda i, p=p: p.forward(batches[i % len(batches)]))
             for name, p in providers.items()}
    samples = (time_alternating(calls, args.iters, args.warmup, device, min_ms=args.min_timed_ms,
                                max_iters=args.max_iters) if calls else {})
    results = {}
    for name in [*providers, *unavailable]:
        if name in unavailable:
            results[name] = {"status": "n/a", "reason": unavailable[name]}
            continue
        stats = summarize_ms(samples[name])
        tbps = moved["total"] / (stats["median_ms"] * 1e-3) / 1e12
        results[name] = {"status": "ok", **stats, "tbps": tbps,
                         "pct_copy_bw": 100.0 * tbps / copy_tbps,
                         **checks.get(name, {"reference": True})}
    ratios = {}
    for slow, fast in ratio_pairs(args.self_check):
        if results.get(slow, {}).get("status") == "ok" and results.get(fast, {}).get("status") == "ok":
            ratios[f"{slow}/{fast}"] = results[slow]["median_ms"] / results[fast]["median_ms"]
    skew = batch_skew(cfg, batches[0])
    del providers, calls, batches
    free_device_memory()
    return {"name": cfg.name, "config": config_record(cfg), "shape": cfg.describe(),
            "production": is_production(cfg), "input_source": input_source, "skew": skew,
            "bytes": moved, "reference": reference_name, "providers": results, "ratios": ratios}


def ratio_pairs(self_check: bool) -> list[tuple[str, str]]:
    """(numerator, denominator) of each reported time ratio; > 1 means the second is faster."""
    if self_check:
        return [(FBGEMM, FBGEMM + TWIN), (OURS, OURS + TWIN)]
    return [(FBGEMM, OURS)]


def render_markdown(report: dict) -> str:
    names = report["providers"]
    pairs = [f"{a}/{b}" for a, b in report["ratio_pairs"]]
    header = [
        *report_header("# TBE pooled forward: " + " vs ".join(names), report),
        f"- bytes: {FORWARD_BYTES_FORMULA}",
        f"- ratio a/b = median ms of a / median ms of b: > 1 means b is faster. "
        f"max |diff| is against `{FBGEMM}` (or an fp32 torch reference where FBGEMM is n/a).",
        f"- {SKEW_LEGEND} Repeated rows are counted in the bytes at every lookup but mostly "
        "come from L2, so hot-row inputs can exceed 100% of copy bandwidth.",
        "",
    ]
    columns = ["config", "shape", "distinct", "hot1%"] + [f"{n} ms" for n in names] + \
        [f"{n} TB/s (% copy)" for n in names] + pairs + [f"max abs diff ({n})" for n in names if n != FBGEMM]
    rows = []
    for entry in report["configs"]:
        res = entry["providers"]
        ok = {n: res.get(n, {}).get("status") == "ok" for n in names}
        row = [entry["name"], entry["shape"], *skew_cells(entry["skew"])]
        row += [f"{res[n]['median_ms']:.4g}" if ok[n] else "n/a" for n in names]
        row += [f"{res[n]['tbps']:.3g} ({res[n]['pct_copy_bw']:.3g}%)" if ok[n] else "n/a" for n in names]
        row += [f"{entry['ratios'][p]:.3f}" if p in entry["ratios"] else "n/a" for p in pairs]
        for n in names:
            if n == FBGEMM:
                continue
            if not ok[n] or "max_abs_diff" not in res[n]:
                row.append("n/a")
            else:
                flag = "" if res[n]["matches"] else " **MISMATCH**"
                vs = "" if entry["reference"] == FBGEMM else f" vs {entry['reference']}"
                row.append(f"{res[n]['max_abs_diff']:.2e}{vs}{flag}")
        rows.append(row)
    leading = 4 + 2 * len(names)
    for label, means in (("geomean", report["geomean"]),
                         (f"geomean (production: {production_names(report['configs'])})", report["geomean_production"])):
        rows.append([label] + [""] * (leading - 1) + [f"{means[p]:.3f}" if means.get(p) else "n/a" for p in pairs] +
                    [""] * (len(columns) - leading - len(pairs)))
    spread = [[e["name"], n, *(f"{e['providers'][n][k]:.4g}" for k in ("p10_ms", "median_ms", "p90_ms"))]
              for e in report["configs"] for n in names if e["providers"].get(n, {}).get("status") == "ok"]
    unavailable = [f"- {e['name']} / {n}: {r['reason']}" for e in report["configs"]
                   for n, r in e["providers"].items() if r["status"] != "ok"]
    if report["mismatches"]:
        header += [f"**Output mismatch** (beyond tolerance): {', '.join(report['mismatches'])}", ""]
    parts = header + [markdown_table(columns, rows), "", "## Spread (ms)", "",
                      markdown_table(["config", "provider", "p10", "median", "p90"], spread)]
    if unavailable:
        parts += ["", "## Not available", "", *unavailable]
    return "\n".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, "forward", "timed rounds (default 50, smoke 5)")
    add_suite_argument(parser)
    parser.add_argument("--self-check", action="store_true",
                        help="time FBGEMM vs an identical FBGEMM and ours vs ours")
    args = parser.parse_args(argv)
    fill_defaults(args, smoke=dict(iters=5, warmup=1, batches=2, copy_gib=1 / 16),
                  device=dict(iters=50, warmup=5, batches=4, copy_gib=2.0))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = benchmark_device(args.smoke)
    has_cuda = device.type == "cuda"
    silence_fbgemm_logging()
    configs = select_configs(args)
    copy_bw = measure_copy_bandwidth(device, int(args.copy_gib * 2**30))
    names = [FBGEMM, FBGEMM + TWIN, OURS, OURS + TWIN] if args.self_check else [OURS, FBGEMM, TORCH]
    clock = "CUDA events" if has_cuda else "time.perf_counter"
    report = {
        "benchmark": "tbe_forward", "mode": "smoke" if args.smoke else "device",
        "self_check": args.self_check, "environment": collect_environment(device),
        "copy_bandwidth": copy_bw, "providers": names,
        "ratio_pairs": ratio_pairs(args.self_check), "bytes_formula": FORWARD_BYTES_FORMULA,
        "settings": {k: getattr(args, k) for k in ("iters", "warmup", "batches", "seed")},
        "method": (f"{args.warmup} warm-up calls per provider, then {args.iters} rounds calling "
                   f"every provider once, order alternating (A B C, C B A, ...), {clock} per call, "
                   f"median with p10/p90; {args.batches} distinct requests cycled; grad mode on, "
                   f"outputs discarded; weights U(-1, 1), identical across providers"),
        "configs": [],
    }
    for cfg in configs:
        print(f"[forward] {cfg.name} ...", file=sys.stderr, flush=True)
        began = time.perf_counter()
        report["configs"].append(run_config(cfg, args, device, copy_bw["tbps"]))
        report["configs"][-1]["elapsed_s"] = time.perf_counter() - began
    pairs = [f"{a}/{b}" for a, b in report["ratio_pairs"]]
    report["geomean"] = geomeans(report["configs"], pairs)
    report["geomean_production"] = geomeans(report["configs"], pairs, production_only=True)
    report["mismatches"] = [f"{e['name']}/{n}" for e in report["configs"]
                            for n, r in e["providers"].items() if r.get("matches") is False]
    if report["mismatches"]:
        print(f"[forward] OUTPUT MISMATCH: {', '.join(report['mismatches'])}", file=sys.stderr)
    markdown = render_markdown(report)
    write_report(args.out, "forward", report, markdown)
    print(markdown)
    return report


if __name__ == "__main__":
    main()
