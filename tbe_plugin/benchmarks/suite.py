"""The kernel suite that ``forward`` and ``backward`` run: its configs, by name, in two sets.

``current``: the near-uniform ``TBEConfig`` shapes whose inputs come from FBGEMM's
``generate_requests`` (T tables alike, fixed L). ``production``: shapes like click-through
models' sparse side, ``tbe_plugin.workloads.Workload`` (per-table rows, D, Poisson pooling
and Zipf skew, inputs from ``workloads.generate_batch``), plus FBGEMM's standard small
batch, which belongs to both sets. ``--suite`` picks a set, ``--configs`` names configs in
it. The smoke configs (tiny, CPU, interpreter) cover both kinds of config. A config that
would not fit in the device's free memory is skipped, with the reason in the report
(``device_bytes_needed``, ``memory_shortfall``).

Imported by the benchmarks only; imports ``common`` and ``tbe_plugin.workloads``.
"""

import torch

from tbe_plugin.benchmarks.common import INDEX_DTYPES, BenchConfig, TBEConfig
from tbe_plugin.workloads import TableWorkload, Workload, ctr_mix, ctr_tables_dlrm

SUITES = ("all", "current", "production")

_SMOKE = dict(T=3, B=4, L=3, E=50)
SMOKE_CURRENT = [
    TBEConfig("smoke-sum", **_SMOKE, D=8),
    TBEConfig("smoke-mixed-d", **_SMOKE, D=(8, 12)),
    TBEConfig("smoke-weighted", **_SMOKE, D=12, weighted=True),
    TBEConfig("smoke-mean", **_SMOKE, D=12, pooling="mean"),
    TBEConfig("smoke-zipf", **_SMOKE, D=8, zipf_alpha=1.15),
    TBEConfig("smoke-fp16", **_SMOKE, D=8, weights_precision="fp16"),
    TBEConfig("smoke-bf16", **_SMOKE, D=12, weights_precision="bf16"),
]
SMOKE_PRODUCTION = [
    # Mixed D and rows, Poisson bags (empty ones included), a uniform and two skewed tables,
    # int32 ids: the production path end to end at interpreter speed.
    Workload("smoke-ctr", (
        TableWorkload(rows=50, dim=8, mean_pooling=3.0, alpha=1.1),
        TableWorkload(rows=80, dim=12, mean_pooling=1.5, alpha=0.0),
        TableWorkload(rows=30, dim=16, mean_pooling=4.0, alpha=1.3),
    ), batch_size=4, index_dtype="int32"),
]

_SUITE = dict(T=32, B=8192, L=20, E=1_000_000, D=128)
FBGEMM_STANDARD = TBEConfig("fbgemm-standard", T=32, B=512, L=20, E=100_000, D=128)
DEVICE_CURRENT = [
    FBGEMM_STANDARD,
    TBEConfig("b8192", **_SUITE),
    TBEConfig("b65536", **_SUITE | dict(B=65536)),
    TBEConfig("fp16", **_SUITE, weights_precision="fp16"),
    TBEConfig("bf16", **_SUITE, weights_precision="bf16"),
    TBEConfig("zipf1.15", **_SUITE, zipf_alpha=1.15),
    TBEConfig("mixed-d", **_SUITE | dict(D=(32, 64, 96, 128, 160, 192, 224, 256))),
    TBEConfig("weighted", **_SUITE, weighted=True),
    TBEConfig("mean", **_SUITE, pooling="mean"),
    TBEConfig("l1", **_SUITE | dict(B=65536, L=1)),
    TBEConfig("l100", **_SUITE | dict(L=100)),
]
DEVICE_PRODUCTION = [
    FBGEMM_STANDARD,
    # 100 tables, D 16..256 tied to size, rows 1e5..5e6, Poisson(1..30), alpha 1.0..1.3,
    # B=16384: 16.5 GB of fp32 weights per provider, ~22M lookups a batch.
    ctr_mix(),
    ctr_mix(weights_precision="fp16"),
    # User and item ids: one id a bag over 1e7 rows, alpha 1.2..1.3 (the hottest row takes
    # ~15-25% of a table's lookups), B=65536: 20.5 GB fp32 per provider.
    Workload("user-id", tuple(TableWorkload(rows=10_000_000, dim=128, mean_pooling=1, pooling="fixed", alpha=a)
                              for a in (1.2, 1.2, 1.25, 1.3)), batch_size=65536),
    # Long histories: Poisson bags of mean 100..200, alpha 1.1, fp16: ~20M lookups, 4.1 GB.
    Workload("long-bags", tuple(TableWorkload(rows=1_000_000, dim=128, mean_pooling=100 + 100 * t / 15, alpha=1.1)
                                for t in range(16)), batch_size=8192, weights_precision="fp16"),
    # Wide rows: D=512 fp16, Poisson(20), mild skew: 16.4 GB per provider.
    Workload("wide-d512-fp16", tuple(TableWorkload(rows=1_000_000, dim=512, mean_pooling=20, alpha=1.05)
                                     for _ in range(16)), batch_size=8192, weights_precision="fp16"),
    # The end-to-end benchmark's tables (pipelines.bench.e2e): 30 DLRM tables of D=128 fp32,
    # Poisson(1..60) bags, alpha 1.05..1.3, B=16384: 15.4M lookups, 16.1 GB per provider.
    Workload("ctr-dlrm", ctr_tables_dlrm(), batch_size=16384),
]
SMOKE_CONFIGS = SMOKE_CURRENT + SMOKE_PRODUCTION
DEVICE_CONFIGS = DEVICE_CURRENT + DEVICE_PRODUCTION[1:]
PRODUCTION_NAMES = frozenset(cfg.name for cfg in SMOKE_PRODUCTION + DEVICE_PRODUCTION)


def is_production(cfg: TBEConfig | Workload) -> bool:
    """Whether ``cfg`` counts in the production-shaped geomean."""
    return cfg.name in PRODUCTION_NAMES


def suite_configs(smoke: bool, suite: str) -> list[TBEConfig | Workload]:
    """The configs of one set (``SUITES``), smoke or device, in run order."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    current, production = (SMOKE_CURRENT, SMOKE_PRODUCTION) if smoke else (DEVICE_CURRENT, DEVICE_PRODUCTION)
    if suite == "current":
        return list(current)
    if suite == "production":
        return list(production)
    return list(SMOKE_CONFIGS if smoke else DEVICE_CONFIGS)


def add_suite_argument(parser) -> None:
    parser.add_argument("--suite", choices=SUITES, default="all",
                        help="current: FBGEMM-generated near-uniform shapes; production: CTR-shaped "
                             "workloads (and FBGEMM's B=512); all: both")


def select_configs(args) -> list[TBEConfig | Workload]:
    """The configs of ``args.suite``, narrowed to ``args.configs`` (comma-separated) if given."""
    available = suite_configs(args.smoke, args.suite)
    if args.configs is None:
        return available
    by_name = {cfg.name: cfg for cfg in available}
    wanted = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown} in suite {args.suite}; choose from {sorted(by_name)}")
    return [by_name[name] for name in wanted]


WORKSPACE_BYTES_PER_LOOKUP = 128
"""Transient device memory a provider may hold per lookup (sorted ids and positions, hot-row
partial sums, FBGEMM's sort buffers, kept by the caching allocator): an overestimate, used
only to skip a config that could not fit."""
FREE_MEMORY_USABLE = 0.9
"""Share of the free device memory a config may plan to use (fragmentation, the CUDA context)."""


def device_bytes_needed(cfg: BenchConfig, num_batches: int, state_bytes_per_row: list[int], providers: int) -> int:
    """An upper estimate of the device memory one config takes: every provider's weights
    and optimizer state (``state_bytes_per_row`` per table) and workspace, the requests,
    and a few outputs and output gradients."""
    lookups = int(1.05 * cfg.expected_lookups) + 1  # Poisson bags: the sum is within a few sigma of its mean
    tables = cfg.weight_bytes + sum(rows * state for rows, state in zip(cfg.rows, state_bytes_per_row))
    request = lookups * (INDEX_DTYPES[cfg.index_dtype].itemsize + 4 * cfg.weighted)
    outputs = 4 * cfg.batch_size * sum(cfg.dims) * 4  # fp32: the providers' outputs, a reference, a gradient
    return providers * (tables + lookups * WORKSPACE_BYTES_PER_LOOKUP) + num_batches * request + outputs + 2**30


def memory_shortfall(device: torch.device, needed_bytes: int) -> str | None:
    """Why a config needing ``needed_bytes`` cannot run on ``device`` now, or None if it can."""
    if device.type != "cuda":
        return None
    free_bytes, _ = torch.cuda.mem_get_info(device)
    if needed_bytes <= FREE_MEMORY_USABLE * free_bytes:
        return None
    return (f"skipped: needs ~{needed_bytes / 1e9:.1f} GB of device memory, "
            f"{free_bytes / 1e9:.1f} GB free (uses at most {FREE_MEMORY_USABLE:.0%})")
