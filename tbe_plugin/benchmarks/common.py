"""What every TBE benchmark shares: configs, inputs, weights, timing, byte accounting, reports.

A benchmark config is a ``TBEConfig`` (FBGEMM's vocabulary: T tables alike, fixed L; inputs
from FBGEMM's ``generate_requests``) or a ``tbe_plugin.workloads.Workload`` (per-table rows,
D, pooling law and skew; inputs from ``workloads.generate_batch``). Both answer the same
questions (``name``, ``num_tables``, ``batch_size``, ``rows``, ``dims``, ``weights_precision``,
``pooling_mode``, ``weighted``, ``index_dtype``, ``describe()``), which is all that the
functions here ask of a config.

Imported by ``tbe_plugin.benchmarks.forward`` and ``tbe_plugin.benchmarks.backward``; it
imports torch, numpy and ``tbe_plugin.workloads`` at module level and FBGEMM only inside
functions, so that a caller can silence FBGEMM's import-time logging first
(``silence_fbgemm_logging``). Nothing here times a provider differently from another: the
same inputs, the same alternating order, the same clock.
"""

import dataclasses
import inspect
import logging
import math
import os
import platform
import statistics
import time
import types
from collections.abc import Callable

import numpy as np
import torch

# Re-exported: the benchmarks, pipelines.bench.pipeline and scripts import these from here.
from tbe_plugin.benchmarks.report import (  # noqa: F401
    SKEW_LEGEND, geomean, geomeans, git_state, markdown_table, production_names, report_header, skew_cells,
    write_report,
)
from tbe_plugin.workloads import (  # noqa: F401  (the dtype tables: one home, re-exported)
    INDEX_DTYPES, POOLING_MODES, WEIGHT_DTYPES, TableWorkload, Workload, generate_batch, skew_stats,
)


# A provider's output "matches" the reference when max|diff| <= REL_TOLERANCE * max|ref|
# + ABS_TOLERANCE. Both sides read identical weights, so only the summation order (and,
# for a low-precision reference such as torch's bf16 output, its rounding) differs.
REL_TOLERANCE = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-2}
ABS_TOLERANCE = 1e-6

FORWARD_BYTES_FORMULA = (
    "bytes = sum_t(n_t * D_t) * w + n * s_idx + (T*B + 1) * s_off + [weighted] n * 4 "
    "+ B * sum_t(D_t) * s_out, where n_t = lookups into table t (every lookup counted, "
    "repeated ids included), n = sum_t n_t, w = bytes per weight, s_idx/s_off/s_out = "
    "element sizes of indices/offsets/output. FBGEMM's own benchmark "
    "(bench/tbe/tbe_training_benchmark.py, `device`) counts only "
    "B*sum(D)*L*w + B*sum(D)*s_out (with per-table bags: sum_t(n_t * D_t) * w + "
    "B*sum(D)*s_out); that figure is in the JSON as fbgemm_formula_bytes."
)


def silence_fbgemm_logging() -> None:
    """Raise the root logger to ERROR: fbgemm_gpu logs a version warning per library it
    loads and its request generator calls ``logging.basicConfig(level=DEBUG)``."""
    logging.getLogger().setLevel(logging.ERROR)


def fbgemm_api() -> types.SimpleNamespace:
    """FBGEMM's module and enums, imported after its import-time logging is silenced."""
    silence_fbgemm_logging()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        BoundsCheckMode, EmbeddingLocation, PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen,
    )

    silence_fbgemm_logging()
    return types.SimpleNamespace(
        EmbOptimType=EmbOptimType, SparseType=SparseType, BoundsCheckMode=BoundsCheckMode,
        EmbeddingLocation=EmbeddingLocation, PoolingMode=PoolingMode, ComputeDevice=ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen=SplitTableBatchedEmbeddingBagsCodegen,
    )


@dataclasses.dataclass(frozen=True)
class TBEConfig:
    """One benchmark configuration, in FBGEMM's benchmark vocabulary."""

    name: str
    """Key in the JSON and the markdown (e.g. ``fbgemm-standard``)."""
    T: int
    """Number of tables (one feature per table)."""
    B: int
    """Batch size: bags per table."""
    L: int
    """Ids per bag (fixed pooling factor)."""
    E: int
    """Rows per table."""
    D: int | tuple[int, ...]
    """Embedding dim: one for all tables, or a tuple that is cycled over the tables."""
    weights_precision: str = "fp32"
    """One of ``WEIGHT_DTYPES``."""
    pooling: str = "sum"
    """``sum`` or ``mean``."""
    weighted: bool = False
    """Pass per-sample weights (fp32, like FBGEMM's request generator)."""
    zipf_alpha: float | None = None
    """None: uniform ids; otherwise Zipf(alpha) ids as FBGEMM's ``generate_requests`` draws
    them (the fallback without it: ``tbe_plugin.workloads``' truncated law, hot rows scattered)."""
    index_dtype: str = "int64"
    """Dtype of indices and offsets (FBGEMM's default is int64)."""

    def __post_init__(self) -> None:
        for field in ("T", "B", "L", "E"):
            if getattr(self, field) < 1:
                raise ValueError(f"config {self.name}: {field} must be >= 1")
        dims = self.D if isinstance(self.D, tuple) else (self.D,)
        if not dims or any(d < 1 for d in dims):
            raise ValueError(f"config {self.name}: every D must be >= 1, got {self.D}")
        if self.weights_precision not in WEIGHT_DTYPES:
            raise ValueError(f"config {self.name}: weights_precision {self.weights_precision!r}")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"config {self.name}: pooling {self.pooling!r}")
        if self.weighted and self.pooling != "sum":
            raise ValueError(f"config {self.name}: per-sample weights need sum pooling")
        if self.zipf_alpha is not None and self.zipf_alpha <= 1.0:
            raise ValueError(f"config {self.name}: zipf_alpha must be > 1 (None = uniform)")
        if self.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"config {self.name}: index_dtype {self.index_dtype!r}")

    # The vocabulary shared with ``workloads.Workload`` (module docstring).
    @property
    def num_tables(self) -> int:
        return self.T

    @property
    def batch_size(self) -> int:
        return self.B

    @property
    def pooling_mode(self) -> str:
        return self.pooling

    @property
    def rows(self) -> list[int]:
        return [self.E] * self.T

    @property
    def dims(self) -> list[int]:
        cycle = self.D if isinstance(self.D, tuple) else (self.D,)
        return [cycle[t % len(cycle)] for t in range(self.T)]

    @property
    def weight_dtype(self) -> torch.dtype:
        return WEIGHT_DTYPES[self.weights_precision]

    @property
    def weight_bytes(self) -> int:
        return self.E * sum(self.dims) * self.weight_dtype.itemsize

    @property
    def expected_lookups(self) -> int:
        return self.T * self.B * self.L

    def as_workload(self) -> Workload:
        """The same shape as a ``Workload``: every bag L ids, ids uniform or Zipf(zipf_alpha)."""
        tables = tuple(TableWorkload(rows=self.E, dim=d, mean_pooling=self.L, pooling="fixed",
                                     alpha=self.zipf_alpha or 0.0) for d in self.dims)
        return Workload(self.name, tables, self.B, weights_precision=self.weights_precision,
                        pooling_mode=self.pooling, weighted=self.weighted, index_dtype=self.index_dtype)

    def describe(self) -> str:
        """One line: T, B, L, E, D, precision, pooling, ids."""
        dims = self.D if isinstance(self.D, int) else "/".join(map(str, self.D))
        ids = "uniform" if self.zipf_alpha is None else f"zipf{self.zipf_alpha}"
        extra = " weighted" if self.weighted else ""
        return (f"T={self.T} B={self.B} L={self.L} E={self.E:.0e} D={dims} "
                f"{self.weights_precision} {self.pooling} {ids}{extra}")


BenchConfig = TBEConfig | Workload


def config_record(cfg: BenchConfig) -> dict:
    """A config as the reports' JSON holds it: its fields plus per-table rows and dims."""
    return dataclasses.asdict(cfg) | {"kind": type(cfg).__name__, "rows": cfg.rows, "dims": cfg.dims}


@dataclasses.dataclass
class InputBatch:
    """One forward's inputs in FBGEMM's layout: bags ordered table-major, offsets [T*B+1]."""

    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: torch.Tensor | None


class _WarningCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0][:200])


def _fbgemm_generate_requests() -> Callable | None:
    try:
        from fbgemm_gpu.tbe.utils.requests import generate_requests
    except ImportError:
        return None
    finally:
        silence_fbgemm_logging()
    return generate_requests


def _batches_from_fbgemm(generate_requests, cfg: TBEConfig, num_batches: int, device) -> list:
    kwargs = dict(
        iters=num_batches, B=cfg.B, T=cfg.T, L=cfg.L, E=cfg.E,
        alpha=cfg.zipf_alpha or 1.0, weighted=cfg.weighted,
        use_cpu=device.type == "cpu", deterministic_output=True,
    )
    accepted = inspect.signature(generate_requests).parameters
    requests = generate_requests(**{k: v for k, v in kwargs.items() if k in accepted})
    return [request.unpack_3() for request in requests]


def _workload_batches(workload: Workload, num_batches: int, device: torch.device, seed: int) -> list[InputBatch]:
    return [InputBatch(*generate_batch(workload, seed + i, device)) for i in range(num_batches)]


def generate_batches(
    cfg: BenchConfig, num_batches: int, device: torch.device, seed: int = 0
) -> tuple[list[InputBatch], str]:
    """``num_batches`` distinct requests for ``cfg`` on ``device``, and how they were drawn.

    A ``Workload``: ``workloads.generate_batch`` with seeds seed, seed + 1, ... A
    ``TBEConfig``: FBGEMM's own ``generate_requests`` when importable (so its inputs match
    FBGEMM's benchmark); otherwise ``generate_batch`` of ``cfg.as_workload()``.
    """
    workload_source = (f"tbe_plugin.workloads.generate_batch (seeds {seed}..{seed + num_batches - 1}; "
                       "truncated Zipf(alpha_t) per table, hot rows scattered)")
    if isinstance(cfg, Workload):
        return _workload_batches(cfg, num_batches, device, seed), workload_source
    torch.manual_seed(seed)
    np.random.seed(seed)
    generate_requests = _fbgemm_generate_requests()
    raw, source = None, workload_source + " of the equivalent workload (fbgemm_gpu's generator not importable)"
    if generate_requests is not None:
        # FBGEMM logs (and silently falls back to uniform ids) when a Zipf draw is too
        # skewed to fill a bag with distinct ids: catch that warning and report it.
        warnings = _WarningCollector()
        root = logging.getLogger()
        root.addHandler(warnings)
        root.setLevel(logging.WARNING)
        try:
            raw = _batches_from_fbgemm(generate_requests, cfg, num_batches, device)
            source = "fbgemm_gpu.tbe.utils.requests.generate_requests"
            source += "".join(f" (fbgemm warned: {m})" for m in warnings.messages[:2])
        except Exception as error:  # e.g. an older signature: fall back, and say so
            source = f"{workload_source} of the equivalent workload (fbgemm generator failed: {type(error).__name__}: {error})"
        finally:
            root.removeHandler(warnings)
            silence_fbgemm_logging()
    if raw is None:
        return _workload_batches(cfg.as_workload(), num_batches, device, seed), source
    index_dtype = INDEX_DTYPES[cfg.index_dtype]
    batches = [
        InputBatch(
            indices=indices.to(device=device, dtype=index_dtype).contiguous(),
            offsets=offsets.to(device=device, dtype=index_dtype).contiguous(),
            per_sample_weights=None if weights is None
            else weights.to(device=device, dtype=torch.float32).contiguous(),
        )
        for indices, offsets, weights in raw
    ]
    return batches, source


def per_table_inputs(cfg: BenchConfig, batch: InputBatch) -> list[tuple]:
    """Split a table-major request into per-table (indices, offsets, weights) for EmbeddingBag."""
    B = cfg.batch_size
    bounds = batch.offsets[::B].tolist()
    pieces = []
    for t in range(cfg.num_tables):
        offsets = batch.offsets[t * B : (t + 1) * B + 1] - bounds[t]
        indices = batch.indices[bounds[t] : bounds[t + 1]]
        weights = batch.per_sample_weights
        pieces.append((indices, offsets, None if weights is None else weights[bounds[t] : bounds[t + 1]]))
    return pieces


@torch.no_grad()
def fill_tables_uniform_(tables: list[torch.Tensor], seed: int, bound: float = 1.0) -> None:
    """Fill each table in place with U(-bound, bound) from a per-table seeded generator."""
    for t, table in enumerate(tables):
        generator = torch.Generator(device=table.device).manual_seed(seed + t)
        table.uniform_(-bound, bound, generator=generator)


@torch.no_grad()
def copy_tables_(destination: list[torch.Tensor], source: list[torch.Tensor]) -> None:
    if len(destination) != len(source):
        raise ValueError(f"{len(destination)} destination tables for {len(source)} sources")
    for dst, src in zip(destination, source):
        dst.copy_(src)


def forward_bytes(cfg: BenchConfig, batch: InputBatch, output_dtype=torch.float32) -> dict:
    """Bytes one pooled forward must move, per ``FORWARD_BYTES_FORMULA``."""
    bounds = batch.offsets[:: cfg.batch_size].tolist()  # T+1 table boundaries into indices
    lookups = [bounds[t + 1] - bounds[t] for t in range(cfg.num_tables)]
    rows = sum(n * d for n, d in zip(lookups, cfg.dims)) * cfg.weight_dtype.itemsize
    output = cfg.batch_size * sum(cfg.dims) * output_dtype.itemsize
    parts = {
        "rows": rows,
        "indices": batch.indices.numel() * batch.indices.element_size(),
        "offsets": batch.offsets.numel() * batch.offsets.element_size(),
        "per_sample_weights": 0 if batch.per_sample_weights is None
        else batch.per_sample_weights.numel() * batch.per_sample_weights.element_size(),
        "output": output,
    }
    # FBGEMM's B*sum(D)*L*w is ``rows`` itself when every bag holds L ids.
    return {"total": sum(parts.values()), **parts, "fbgemm_formula_bytes": rows + output}


def batch_skew(cfg: BenchConfig, batch: InputBatch) -> dict:
    """``workloads.skew_stats`` of one request: distinct-row fraction (near 1 for uniform
    ids over big tables, low for hot rows, which the cache serves though the byte count
    includes them), hot-1% share, longest run, distinct rows per table."""
    return skew_stats(cfg, batch.indices, batch.offsets)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], object], device: torch.device, wait: bool) -> float:
    """Milliseconds of ``fn()`` from an idle device (synchronized first): until it returns
    (``wait`` False: the host's share, launch cost included) or until the device is done."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    if wait:
        synchronize(device)
    return (time.perf_counter() - start) * 1e3


def plan_in_backward(launch=None):
    """``launch`` (``runs_launch()`` when None) with the backward's id-only part planned in
    the backward (``RunsLaunch.plan_in_forward`` off). The kernel benchmarks time
    ``out.backward(grad)`` after an untimed forward, which would otherwise have started that
    part of the backward (sort, operands, marks) beside it: their backward is the whole one."""
    from tbe_plugin.ops.backward_launch import runs_launch

    return dataclasses.replace(launch or runs_launch(), plan_in_forward=False)


def backward_host_and_wall_ms(forward: Callable[[], torch.Tensor], grad: torch.Tensor, calls: int,
                              device: torch.device) -> tuple[float, float]:  # fmt: skip
    """Medians over ``calls`` of ``out.backward(grad)`` after an untimed ``out = forward()``,
    each from an idle device: (host ms until it returns, wall ms until the device is done)."""
    hosts, walls = [], []
    for _ in range(calls):
        out = forward()
        walls.append(timed_ms(lambda: out.backward(grad), device, wait=True))
        out = forward()
        hosts.append(timed_ms(lambda: out.backward(grad), device, wait=False))
    return statistics.median(hosts), statistics.median(walls)


def free_device_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def summarize_ms(samples_ms: list[float]) -> dict:
    values = np.asarray(samples_ms, dtype=np.float64)
    return {
        "median_ms": float(np.median(values)),
        "p10_ms": float(np.percentile(values, 10)),
        "p90_ms": float(np.percentile(values, 90)),
        "mean_ms": float(values.mean()),
        "n": int(values.size),
    }


def paired_ratios(reference_ms: list[float], ours_ms: list[float]) -> dict:
    """Round by round (``time_alternating``'s rounds call both providers once, next to each
    other), the reference's ms over ours: their p10, median and p90 and the share of rounds
    below 1.0, so that a median ratio near 1.0 reads against the spread of the rounds."""
    if len(reference_ms) != len(ours_ms) or not ours_ms:
        raise ValueError(f"paired_ratios: {len(reference_ms)} and {len(ours_ms)} rounds; need the same, at least one")
    ratios = np.asarray(reference_ms, dtype=np.float64) / np.asarray(ours_ms, dtype=np.float64)
    return {"p10": float(np.percentile(ratios, 10)), "median": float(np.median(ratios)),
            "p90": float(np.percentile(ratios, 90)), "below_1": float((ratios < 1.0).mean()),
            "rounds": int(ratios.size)}  # fmt: skip


def time_alternating(
    calls: dict[str, Callable[[int], object]], iters: int, warmup: int, device: torch.device,
    prepare: dict[str, Callable[[int], object]] | None = None, min_ms: float = 0.0, max_iters: int = 30,
) -> dict[str, list[float]]:
    """Per-call milliseconds of every provider, timed in alternating order.

    ``calls[name](i)`` runs one forward of provider ``name`` on input batch number ``i``
    (the caller cycles its batches). Round r calls every provider once, in listed order
    for even r and reversed for odd r (A B C C B A ...), so drift in clocks or
    temperature hits all providers alike. CUDA: one pair of events around each call and
    no synchronization inside the timed loop, so host overhead that the GPU hides stays
    hidden, as in FBGEMM's ``benchmark_requests``. CPU: ``time.perf_counter``.

    ``prepare[name](i)``, when given, runs untimed just before each call of ``name``
    (warm-up included) and its result replaces ``i`` as the call's argument: the backward
    benchmark's forward before a timed ``out.backward(grad)``. Its work is queued before
    the start event, so a CUDA sample holds the call alone (FBGEMM's ``bwd_only``).

    ``min_ms`` > 0: more rounds for short calls, the same number for every provider: enough
    that the slowest provider's last warm-up call, times the rounds, reaches ``min_ms``, at
    least ``iters`` and at most ``max(iters, max_iters)`` (calls of a fraction of a
    millisecond are host-bound and vary from call to call: 5 rounds leave their medians
    inside that spread).
    """
    names = list(calls)

    def argument(name: str, i: int) -> object:
        return prepare[name](i) if prepare is not None else i

    last_warmup_ms = {}  # timed (each call synchronized) only when min_ms asks for it
    for name in names:
        for i in range(warmup):
            arg = argument(name, i)
            if min_ms <= 0:
                calls[name](arg)
                continue
            synchronize(device)
            begin = time.perf_counter()
            calls[name](arg)
            synchronize(device)
            last_warmup_ms[name] = (time.perf_counter() - begin) * 1e3
    synchronize(device)
    iters = _rounds(iters, min_ms, max_iters, last_warmup_ms)
    if device.type == "cuda":
        events: dict[str, list] = {name: [] for name in names}
        for r in range(iters):
            for name in names if r % 2 == 0 else reversed(names):
                arg = argument(name, r)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                calls[name](arg)
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(device)
        return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(iters):
        for name in names if r % 2 == 0 else reversed(names):
            arg = argument(name, r)
            begin = time.perf_counter()
            calls[name](arg)
            samples[name].append((time.perf_counter() - begin) * 1e3)
    return samples


def _rounds(iters: int, min_ms: float, max_iters: int, last_warmup_ms: dict[str, float]) -> int:
    """``time_alternating``'s rounds: ``iters``, or more (up to ``max_iters``) while the
    slowest provider's warm-up call times the rounds stays under ``min_ms``."""
    if min_ms <= 0 or not last_warmup_ms:
        return iters
    slowest = max(max(last_warmup_ms.values()), 1e-3)
    return max(iters, min(max_iters, math.ceil(min_ms / slowest)))


@torch.no_grad()
def measure_copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> dict:
    """Device-to-device ``copy_`` of ``nbytes``: TB/s counting read + write (2 * nbytes)."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    destination = torch.empty_like(source)
    calls = {"copy": lambda _i: destination.copy_(source)}
    samples = time_alternating(calls, iters=repeats, warmup=2, device=device)["copy"]
    median_ms = float(np.median(samples))
    del source, destination
    free_device_memory()
    return {"bytes_per_copy": 2 * nbytes, "median_ms": median_ms,
            "tbps": 2 * nbytes / (median_ms * 1e-3) / 1e12}


@torch.no_grad()
def max_abs_diff(output: torch.Tensor, reference: torch.Tensor) -> float:
    if output.shape != reference.shape:
        raise ValueError(f"shape {tuple(output.shape)} vs reference {tuple(reference.shape)}")
    return float((output.float() - reference.float()).abs().max()) if output.numel() else 0.0


def outputs_match(diff: float, reference: torch.Tensor, weights_precision: str) -> bool:
    scale = float(reference.float().abs().max()) if reference.numel() else 0.0
    return diff <= REL_TOLERANCE[weights_precision] * scale + ABS_TOLERANCE


def collect_environment(device: torch.device) -> dict:
    """Versions, device, commit and dirty flag, recorded in every report header."""
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "device": str(device), "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"), **git_state()}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "not installed"
    try:
        import fbgemm_gpu

        env["fbgemm_gpu"] = getattr(fbgemm_gpu, "__version__", "unknown")
    except ImportError:
        env["fbgemm_gpu"] = "not installed"
    finally:
        silence_fbgemm_logging()
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def add_run_arguments(parser, stem: str, iters_help: str) -> None:
    """The options every benchmark takes (its own ones are added by the caller)."""
    parser.add_argument("--smoke", action="store_true", help="tiny configs; runs on CPU")
    parser.add_argument("--configs", default=None, help="comma-separated config names (of --suite)")
    parser.add_argument("--iters", type=int, default=None, help=iters_help)
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per provider")
    parser.add_argument("--min-timed-ms", type=float, default=0.0,
                        help="more rounds for short calls: rounds x the slowest provider's warm-up call "
                             "reaches this many ms (at most --max-iters rounds); 0: --iters rounds")
    parser.add_argument("--max-iters", type=int, default=30, help="the most rounds --min-timed-ms gives")
    parser.add_argument("--batches", type=int, default=None, help="distinct requests cycled")
    parser.add_argument("--copy-gib", type=float, default=None, help="size of the copy-bandwidth probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-out", help=f"directory for {stem}.json/.md")


def fill_defaults(args, smoke: dict, device: dict) -> None:
    """Options left unset take the smoke-mode or device-suite default."""
    for key, value in (smoke if args.smoke else device).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def benchmark_device(smoke: bool) -> torch.device:
    """CUDA for the device suite; the CPU (Triton's interpreter) only in smoke mode."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if not smoke:
        raise SystemExit("the device suite needs CUDA; use --smoke on CPU")
    # Must precede triton's import. `python -m tbe_plugin.benchmarks.<name>` imports the
    # tbe_plugin package first, whose __init__ does the same; this covers main() being
    # called from elsewhere before tbe_plugin is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device("cpu")
