"""Synthetic TBE workloads: the project's one Zipf id generator and production-shaped tables.

What alpha means. A table of E rows draws each id independently: the id has popularity
rank k (k = 1 is the hottest row) with probability

    P(rank = k) = k^-alpha / H(E, alpha),    H(E, alpha) = sum_{j=1..E} j^-alpha,  k = 1..E,

the Zipf law truncated at the table's E rows, so any alpha >= 0 is valid: alpha = 0 is
uniform, alpha = 1.0..1.3 is the range click-through logs show. (numpy's ``zipf`` is the
untruncated law and needs alpha > 1; wrapping its draws modulo E piles the tail onto the
first rows.) Ranks map to rows by a fixed bijection per table, ``row = (a * (k - 1) + b)
mod E`` with gcd(a, E) = 1 and (a, b) drawn from the sampler's seed: hot rows lie scattered
over the table, as hashed ids do, and no E-sized permutation is ever built.

Sampling (``ZipfSampler``) is inverse-CDF on one uniform float64 per id: ranks up to
``EXACT_HEAD_RANKS`` use the exact cumulative sums; the tail's mass and inverse come from
the integral of x^-alpha over [k - 1/2, k + 1/2] (the midpoint rule), whose relative error
per rank is about alpha(alpha + 1) / (24 k^2). Every rank's probability therefore matches
the law within a relative 2 * alpha(alpha + 1) / (24 * EXACT_HEAD_RANKS^2), below 1e-8 for
alpha <= 2 (alpha = 0 is exact). Memory: one float64 CDF of EXACT_HEAD_RANKS entries
(64 KiB) per table and device, built lazily, whatever E is.

``TableWorkload`` and ``Workload`` describe a batch shape (rows, dim, pooling law, skew per
table; batch size, precision, pooling mode); ``generate_batch`` draws one batch in FBGEMM's
layout; ``skew_stats`` says how skewed a batch is; ``ctr_mix`` and ``ctr_tables_dlrm`` build
the production-shaped table sets. Imports torch and numpy only; the benchmarks and
``pipelines`` import it.
"""

import dataclasses
import functools
import math

import numpy as np
import torch

EXACT_HEAD_RANKS = 8192
"""Ranks whose cumulative probability is summed exactly; the tail beyond is integrated."""
WEIGHT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}
POOLING_LAWS = ("fixed", "poisson")
POOLING_MODES = ("sum", "mean")
HOT_ROW_FRACTION = 0.01
"""``skew_stats``' "hot" rows: this fraction of each table's rows, the most frequent first."""
TOP_ROWS = (16, 64, 256)
"""Row counts per table whose share of the lookups ``skew_stats`` reports (``top_rows_share``)."""
CTR_MIX_MAX_WEIGHT_BYTES = 25 * 10**9
"""``ctr_mix`` refuses table sets whose weights exceed this at their precision: ours and
FBGEMM's copies plus rowwise-Adagrad states and a batch must fit one 141 GB H200."""


def zipf_pmf(num_rows: int, alpha: float) -> torch.Tensor:
    """The law itself, exactly: entry k - 1 is P(rank = k), float64, summing to 1."""
    _check_law(num_rows, alpha)
    weights = torch.arange(1, num_rows + 1, dtype=torch.float64).pow(-alpha)
    return weights / weights.sum()


def _check_law(num_rows: int, alpha: float) -> None:
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")


def _power_integral(start: float, stop: float, alpha: float) -> float:
    """Integral of x^-alpha over [start, stop], written with expm1 so that alpha near 1
    loses no digits."""
    log_ratio = math.log(stop / start)
    exponent = 1.0 - alpha
    if exponent == 0.0:
        return log_ratio
    return start**exponent * math.expm1(exponent * log_ratio) / exponent


class ZipfSampler:
    """Ids of one table drawn from the truncated Zipf law of the module docstring.

    ``seed`` fixes the rank-to-row bijection (where the hot rows lie); the ids themselves
    come from the generator passed to ``sample``, so a (seed, generator state) pair gives
    the same ids on every call. CPU and CUDA generators give different streams.
    """

    def __init__(self, num_rows: int, alpha: float, seed: int) -> None:
        _check_law(num_rows, alpha)
        self.num_rows, self.alpha, self.seed = num_rows, float(alpha), seed
        rng = np.random.default_rng([seed, num_rows])
        self.stride, self.shift = 1, 0
        if num_rows > 1:
            self.stride = int(rng.integers(1, num_rows))
            while math.gcd(self.stride, num_rows) != 1:
                self.stride = int(rng.integers(1, num_rows))
            self.shift = int(rng.integers(0, num_rows))
        self.head_ranks = min(num_rows, EXACT_HEAD_RANKS)
        head_weights = torch.arange(1, self.head_ranks + 1, dtype=torch.float64).pow(-self.alpha)
        # The tail is the ranks head_ranks + 1 .. E, rank k standing for [k - 1/2, k + 1/2).
        self._tail_start, self._tail_stop = self.head_ranks + 0.5, num_rows + 0.5
        tail_mass = 0.0
        if num_rows > self.head_ranks:
            tail_mass = _power_integral(self._tail_start, self._tail_stop, self.alpha)
        total = float(head_weights.sum()) + tail_mass
        self._head_cdf_cpu = torch.cumsum(head_weights, 0) / total
        self.tail_probability = tail_mass / total
        if self.tail_probability == 0.0:
            self._head_cdf_cpu[-1] = 1.0  # no rounding may leave u above the last rank
        # The tail's inverse CDF: position = log1p(w * expm1(e * log_ratio)) / e with
        # e = 1 - alpha (w * log_ratio when e = 0), rank = floor(tail_start * exp(position) + 1/2).
        self.tail_exponent = 1.0 - self.alpha
        self.tail_log_ratio = math.log(self._tail_stop / self._tail_start)
        self.tail_expm1 = math.expm1(self.tail_exponent * self.tail_log_ratio)
        self._head_cdf: dict[torch.device, torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"ZipfSampler(num_rows={self.num_rows}, alpha={self.alpha}, seed={self.seed})"

    def _cdf_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._head_cdf:
            self._head_cdf[device] = self._head_cdf_cpu.to(device)
        return self._head_cdf[device]

    def ranks_from_uniform(self, uniform: torch.Tensor) -> torch.Tensor:
        """Inverse CDF: the rank (1-based, int64) of each u in [0, 1) (float64)."""
        if uniform.dtype != torch.float64:
            raise ValueError(f"uniform must be float64 (tail resolution), got {uniform.dtype}")
        cdf = self._cdf_on(uniform.device)
        ranks = torch.searchsorted(cdf, uniform, right=True)  # 0-based; head_ranks = "in the tail"
        if self.tail_probability == 0.0:
            return ranks.clamp_(max=self.head_ranks - 1) + 1
        head_probability = 1.0 - self.tail_probability
        within_tail = ((uniform - head_probability) / self.tail_probability).clamp_(0.0, 1.0)
        if self.tail_exponent == 0.0:
            position = within_tail * self.tail_log_ratio
        else:
            position = torch.log1p(within_tail * self.tail_expm1) / self.tail_exponent
        tail_ranks = torch.floor(self._tail_start * torch.exp(position) + 0.5)
        tail_ranks = tail_ranks.clamp_(self.head_ranks + 1, self.num_rows).to(torch.int64)
        return torch.where(ranks >= self.head_ranks, tail_ranks, ranks + 1)

    def rank_to_row(self, ranks: torch.Tensor) -> torch.Tensor:
        """Row of each 1-based rank (int64): the affine bijection of the module docstring."""
        # (stride * (rank - 1)) < E^2 < 2^63 for any table below 3e9 rows: no overflow.
        return (ranks.to(torch.int64) - 1).mul_(self.stride).add_(self.shift).remainder_(self.num_rows)

    def row_to_rank(self, rows: torch.Tensor) -> torch.Tensor:
        """The inverse of ``rank_to_row``."""
        inverse = pow(self.stride, -1, self.num_rows) if self.num_rows > 1 else 0
        return (rows.to(torch.int64) - self.shift).remainder_(self.num_rows).mul_(inverse).remainder_(
            self.num_rows).add_(1)

    def sample(self, count: int, generator: torch.Generator, device: torch.device | str | None = None
               ) -> torch.Tensor:
        """``count`` ids (rows, int64) on ``device`` (default: the generator's device)."""
        device = torch.device(device) if device is not None else generator.device
        if generator.device.type != device.type:
            raise ValueError(f"generator is on {generator.device}, ids asked on {device}")
        uniform = torch.rand(count, generator=generator, dtype=torch.float64, device=device)
        return self.rank_to_row(self.ranks_from_uniform(uniform))


UNIFORM_BITS = 53
"""``torch.rand``'s float64 draws are multiples of 2^-53 (CPU and CUDA): ``ZipfTables``
compares them as integers."""


class ZipfTables:
    """The ``ZipfSampler`` s of many tables as one sampler: a batch's ids of every table
    in a fixed number of kernels, whatever the number of tables (a per-table loop costs
    some twenty launches a table, which on a GPU the host pays every batch).

    For the same uniforms it gives exactly the ranks of each table's own sampler: the
    heads' CDFs are concatenated as integers ``t * 2^53 + ceil(cdf * 2^53)`` and searched
    with ``t * 2^53 + u * 2^53``, which orders a uniform u of table t against its own
    CDF as the float comparison does (u is a multiple of 2^-53, ``UNIFORM_BITS``); the
    tails use the same float64 operations with each table's constants gathered per id.
    """

    def __init__(self, samplers: "list[ZipfSampler] | tuple[ZipfSampler, ...]") -> None:
        if not samplers:
            raise ValueError("ZipfTables needs at least one sampler")
        self.samplers = tuple(samplers)
        scale = float(2**UNIFORM_BITS)
        heads, firsts, first = [], [], 0
        for t, sampler in enumerate(self.samplers):
            cdf = torch.ceil(sampler._head_cdf_cpu * scale).to(torch.int64)
            heads.append(cdf + t * 2**UNIFORM_BITS)
            firsts.append(first)
            first += sampler.head_ranks
        self._head_keys_cpu = torch.cat(heads)
        per_table = {
            "first": torch.tensor(firsts, dtype=torch.int64),
            "head_ranks": torch.tensor([s.head_ranks for s in self.samplers], dtype=torch.int64),
            "rows": torch.tensor([s.num_rows for s in self.samplers], dtype=torch.int64),
            "stride": torch.tensor([s.stride for s in self.samplers], dtype=torch.int64),
            "shift": torch.tensor([s.shift for s in self.samplers], dtype=torch.int64),
            "has_tail": torch.tensor([s.tail_probability > 0.0 for s in self.samplers]),
        }
        for name, value in (
            ("head_probability", lambda s: 1.0 - s.tail_probability),
            ("tail_probability", lambda s: s.tail_probability if s.tail_probability > 0.0 else 1.0),
            ("exponent", lambda s: s.tail_exponent),
            ("log_ratio", lambda s: s.tail_log_ratio),
            ("expm1", lambda s: s.tail_expm1),
            ("tail_start", lambda s: s._tail_start),
        ):  # one float64 per table each, gathered per id as contiguous vectors
            per_table[name] = torch.tensor([value(s) for s in self.samplers], dtype=torch.float64)
        self._per_table_cpu = per_table
        self._any_alpha_one = any(s.tail_exponent == 0.0 for s in self.samplers)  # the tail's log branch
        self._any_tail = any(s.tail_probability > 0.0 for s in self.samplers)
        self._on: dict = {}

    def _tables_on(self, device: torch.device):
        if device not in self._on:
            self._on[device] = (self._head_keys_cpu.to(device), {k: v.to(device) for k, v in self._per_table_cpu.items()})
        return self._on[device]

    def ranks_from_uniform(self, uniform: torch.Tensor, table_of: torch.Tensor) -> torch.Tensor:
        """The rank (1-based, int64) of each u in [0, 1) (float64, a multiple of 2^-53) in
        the table ``table_of`` (int64, per u) names: ``samplers[t].ranks_from_uniform``."""
        if uniform.dtype != torch.float64:
            raise ValueError(f"uniform must be float64 (tail resolution), got {uniform.dtype}")
        keys, per = self._tables_on(uniform.device)
        base = table_of * 2**UNIFORM_BITS
        found = torch.searchsorted(keys, base + (uniform * float(2**UNIFORM_BITS)).to(torch.int64), right=True)
        head_ranks = per["head_ranks"][table_of]
        ranks = (found - per["first"][table_of]).clamp_(max=head_ranks)  # 0-based; head_ranks = "in the tail"
        if not self._any_tail:
            return ranks.clamp_(max=head_ranks - 1) + 1
        within_tail = ((uniform - per["head_probability"][table_of]) / per["tail_probability"][table_of]).clamp_(0.0, 1.0)
        exponent = per["exponent"][table_of]
        if self._any_alpha_one:
            safe = torch.where(exponent == 0.0, 1.0, exponent)
            position = torch.where(exponent == 0.0, within_tail * per["log_ratio"][table_of],
                                   torch.log1p(within_tail * per["expm1"][table_of]) / safe)  # fmt: skip
        else:
            position = torch.log1p(within_tail * per["expm1"][table_of]) / exponent
        tail_ranks = torch.floor(per["tail_start"][table_of] * torch.exp(position) + 0.5)
        tail_ranks = torch.minimum(torch.maximum(tail_ranks, (head_ranks + 1).double()),
                                   per["rows"][table_of].double()).to(torch.int64)  # fmt: skip
        in_tail = (ranks >= head_ranks) & per["has_tail"][table_of]
        return torch.where(in_tail, tail_ranks, ranks.clamp_(max=head_ranks - 1) + 1)

    def rank_to_row(self, ranks: torch.Tensor, table_of: torch.Tensor) -> torch.Tensor:
        """Each table's affine bijection (``ZipfSampler.rank_to_row``), per id."""
        _, per = self._tables_on(ranks.device)
        return ((ranks - 1) * per["stride"][table_of] + per["shift"][table_of]).remainder_(per["rows"][table_of])

    def sample(self, counts: "list[int]", generator: torch.Generator, device: torch.device | str | None = None,
               vectorized: bool | None = None) -> torch.Tensor:
        """``counts[t]`` ids (rows, int64) of each table t, table after table, from one
        float64 uniform each drawn in that order. ``vectorized`` (default: on CUDA) maps
        them in one set of kernels; otherwise table by table (on a CPU, where a kernel is a
        function call, that is ~2x faster: no per-id table constants, shorter searches).
        Both give the same ids."""
        device = torch.device(device) if device is not None else generator.device
        if len(counts) != len(self.samplers):
            raise ValueError(f"{len(counts)} counts for {len(self.samplers)} tables")
        total = sum(counts)
        uniform = torch.rand(total, generator=generator, dtype=torch.float64, device=device)
        if not (device.type == "cuda" if vectorized is None else vectorized):
            return torch.cat([s.rank_to_row(s.ranks_from_uniform(u)) for s, u in zip(self.samplers,
                                                                                    uniform.split(counts))])
        table_of = torch.repeat_interleave(torch.arange(len(counts), device=device),
                                           torch.tensor(counts, device=device), output_size=total)  # fmt: skip
        return self.rank_to_row(self.ranks_from_uniform(uniform, table_of), table_of)


@functools.lru_cache(maxsize=64)
def zipf_tables(laws: "tuple[tuple[int, float], ...]") -> ZipfTables:
    """The samplers of tables 0..T-1 with (rows, alpha) ``laws``, as one (cached)."""
    return ZipfTables([table_sampler(rows, alpha, t) for t, (rows, alpha) in enumerate(laws)])


@functools.lru_cache(maxsize=512)
def table_sampler(num_rows: int, alpha: float, table: int) -> ZipfSampler:
    """The sampler of table number ``table`` (its index seeds the bijection, so a table's
    hot rows stay where they are from batch to batch), cached across batches."""
    return ZipfSampler(num_rows, alpha, seed=table)


@dataclasses.dataclass(frozen=True)
class TableWorkload:
    """One table: its shape, its bag-length law and the skew of its ids."""

    rows: int
    """Rows E of the table."""
    dim: int
    """Embedding dimension D."""
    mean_pooling: float
    """Mean ids per bag (the pooling factor)."""
    pooling: str = "poisson"
    """Bag-length law: ``fixed`` (every bag exactly round(mean_pooling) ids) or ``poisson``
    (lengths ~ Poisson(mean_pooling), independent per bag)."""
    max_pooling: int | None = None
    """Cap on a bag's length (lengths above it are clipped to it); None: no cap."""
    alpha: float = 0.0
    """Zipf exponent of the ids (module docstring); 0 = uniform."""

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if not (math.isfinite(self.mean_pooling) and self.mean_pooling >= 0):
            raise ValueError(f"mean_pooling must be finite and >= 0, got {self.mean_pooling}")
        if self.pooling not in POOLING_LAWS:
            raise ValueError(f"pooling must be one of {POOLING_LAWS}, got {self.pooling!r}")
        if self.max_pooling is not None:
            if self.max_pooling < 0:
                raise ValueError(f"max_pooling must be None or >= 0, got {self.max_pooling}")
            if self.pooling == "fixed" and self.max_pooling < round(self.mean_pooling):
                raise ValueError(f"max_pooling {self.max_pooling} is below the fixed length "
                                 f"{round(self.mean_pooling)}: set mean_pooling instead")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {self.alpha}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A batch shape for every table of one TBE: what ``generate_batch`` draws."""

    name: str
    """Key in reports (e.g. ``ctr-mix``)."""
    tables: tuple[TableWorkload, ...]
    """One entry per table (one feature per table), in the batch's table-major order."""
    batch_size: int
    """Bags per table B."""
    weights_precision: str = "fp32"
    """One of ``WEIGHT_DTYPES``."""
    pooling_mode: str = "sum"
    """``sum`` or ``mean``."""
    weighted: bool = False
    """Draw per-sample weights (fp32, uniform in [0, 1))."""
    index_dtype: str = "int64"
    """Dtype of indices and offsets: ``int64`` or ``int32``."""

    def __post_init__(self) -> None:
        if not isinstance(self.tables, tuple) or not self.tables:
            raise ValueError(f"workload {self.name}: tables must be a non-empty tuple")
        for t, table in enumerate(self.tables):
            if not isinstance(table, TableWorkload):
                raise ValueError(f"workload {self.name}: tables[{t}] is a {type(table).__name__}")
        if self.batch_size < 1:
            raise ValueError(f"workload {self.name}: batch_size must be >= 1, got {self.batch_size}")
        if self.weights_precision not in WEIGHT_DTYPES:
            raise ValueError(f"workload {self.name}: weights_precision {self.weights_precision!r} "
                             f"not in {list(WEIGHT_DTYPES)}")
        if self.pooling_mode not in POOLING_MODES:
            raise ValueError(f"workload {self.name}: pooling_mode {self.pooling_mode!r} not in {POOLING_MODES}")
        if self.weighted and self.pooling_mode != "sum":
            raise ValueError(f"workload {self.name}: per-sample weights need pooling_mode sum")
        if self.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"workload {self.name}: index_dtype {self.index_dtype!r} not in {list(INDEX_DTYPES)}")

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def rows(self) -> list[int]:
        return [table.rows for table in self.tables]

    @property
    def dims(self) -> list[int]:
        return [table.dim for table in self.tables]

    @property
    def weight_dtype(self) -> torch.dtype:
        return WEIGHT_DTYPES[self.weights_precision]

    @property
    def weight_bytes(self) -> int:
        """Bytes of all tables' weights at ``weights_precision``."""
        return sum(t.rows * t.dim for t in self.tables) * self.weight_dtype.itemsize

    @property
    def expected_lookups(self) -> float:
        """Mean ids per batch (caps ignored: an upper bound where ``max_pooling`` clips)."""
        return self.batch_size * sum(
            round(t.mean_pooling) if t.pooling == "fixed" else t.mean_pooling for t in self.tables)

    def describe(self) -> str:
        """One line: T, B, and the ranges of rows, D, pooling and alpha over the tables."""
        def span(values, fmt) -> str:
            low, high = min(values), max(values)
            return format(low, fmt) if low == high else f"{low:{fmt}}..{high:{fmt}}"

        laws = "/".join(sorted({t.pooling for t in self.tables}))
        extra = " weighted" if self.weighted else ""
        return (f"T={self.num_tables} B={self.batch_size} L~{laws}({span([t.mean_pooling for t in self.tables], '.3g')}) "
                f"E={span(self.rows, '.2g')} D={span(self.dims, 'd')} "
                f"alpha={span([t.alpha for t in self.tables], '.3g')} {self.weights_precision} {self.pooling_mode}{extra}")


def bag_lengths(table: TableWorkload, batch_size: int, generator: torch.Generator, device) -> torch.Tensor:
    """Ids per bag of one table (int64, ``batch_size`` entries), per its pooling law."""
    if table.pooling == "fixed":
        lengths = torch.full((batch_size,), round(table.mean_pooling), dtype=torch.int64, device=device)
    else:
        means = torch.full((batch_size,), float(table.mean_pooling), dtype=torch.float64, device=device)
        lengths = torch.poisson(means, generator=generator).to(torch.int64)
    if table.max_pooling is not None:
        lengths.clamp_(max=table.max_pooling)
    return lengths


def generate_batch(workload: Workload, seed: int, device: torch.device | str
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One batch ``(indices, offsets, per_sample_weights or None)`` in FBGEMM's layout.

    Bags are table-major (bag b of table t is bag t * B + b), ``offsets`` has T * B + 1
    entries, indices and offsets have ``workload.index_dtype``. Every random draw comes
    from one generator seeded with ``seed`` on ``device``, in a fixed order (per table: its
    lengths, then its ids; then the weights), so a (workload, seed, device type) triple
    always gives the same batch. Table t's hot rows are placed by seed t, the same in every
    batch.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    lengths, ids = [], []
    for t, table in enumerate(workload.tables):
        table_lengths = bag_lengths(table, workload.batch_size, generator, device)
        count = int(table_lengths.sum())
        lengths.append(table_lengths)
        ids.append(table_sampler(table.rows, table.alpha, t).sample(count, generator, device))
    index_dtype = INDEX_DTYPES[workload.index_dtype]
    indices = torch.cat(ids)
    if index_dtype == torch.int32 and indices.numel() >= 2**31:
        raise ValueError(f"workload {workload.name}: {indices.numel()} lookups overflow int32 offsets; "
                         "use index_dtype int64")
    offsets = torch.zeros(workload.num_tables * workload.batch_size + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.cat(lengths), 0, out=offsets[1:])
    weights = None
    if workload.weighted:
        weights = torch.rand(indices.numel(), generator=generator, dtype=torch.float32, device=device)
    return indices.to(index_dtype), offsets.to(index_dtype), weights


@torch.no_grad()
def skew_stats(workload: Workload, indices: torch.Tensor, offsets: torch.Tensor) -> dict:
    """How skewed one batch is, pooled over its tables.

    ``lookups``: ids in the batch; ``distinct_fraction``: distinct (table, row) pairs /
    lookups; ``hot1pct_share``: share of the lookups that hit the ceil(HOT_ROW_FRACTION * E_t)
    most frequent rows of each table t in this batch; ``max_run``: most lookups of one row;
    ``distinct_per_table``: distinct rows of each table; ``top_rows_share``: for K in
    ``TOP_ROWS`` (a string key each), the share of the lookups that hit the K most frequent
    rows of each table (what a path that treats a fixed number of hot rows per table apart
    would take over). ``workload`` may be anything with
    ``name``, ``num_tables``, ``batch_size`` and ``rows`` (the benchmarks' configs are).
    """
    bounds = offsets[:: workload.batch_size].tolist()
    if len(bounds) != workload.num_tables + 1:
        raise ValueError(f"offsets has {offsets.numel()} entries; workload {workload.name} needs "
                         f"{workload.num_tables * workload.batch_size + 1}")
    distinct, hot, max_run = [], 0, 0
    top = dict.fromkeys(TOP_ROWS, 0)
    for t, rows in enumerate(workload.rows):
        ids = indices[bounds[t] : bounds[t + 1]]
        if ids.numel() == 0:
            distinct.append(0)
            continue
        counts = torch.unique(ids, return_counts=True)[1]
        distinct.append(counts.numel())
        descending = torch.sort(counts, descending=True).values
        hot += int(descending[: math.ceil(HOT_ROW_FRACTION * rows)].sum())
        max_run = max(max_run, int(descending[0]))
        for k in TOP_ROWS:
            top[k] += int(descending[:k].sum())
    lookups = indices.numel()
    return {"lookups": lookups, "distinct_fraction": sum(distinct) / max(lookups, 1),
            "hot1pct_share": hot / max(lookups, 1), "max_run": max_run, "distinct_per_table": distinct,
            "top_rows_share": {str(k): v / max(lookups, 1) for k, v in top.items()}}


def _log_uniform_rows(rng: np.random.Generator, count: int, low: float, high: float) -> np.ndarray:
    return np.exp(rng.uniform(math.log(low), math.log(high), size=count)).round().astype(np.int64)


def ctr_mix(num_tables: int = 100, batch_size: int = 16384, weights_precision: str = "fp32",
            dims: tuple[int, ...] = (16, 32, 64, 128, 256), seed: int = 0,
            max_weight_bytes: int = CTR_MIX_MAX_WEIGHT_BYTES) -> Workload:
    """A click-through model's sparse side: ``num_tables`` tables, rows log-uniform in
    1e5..5e6, Poisson pooling with per-table means uniform in 1..30, per-table alpha
    uniform in 1.0..1.3, deterministic per ``seed``.

    D is tied to size as real CTR models do: the tables sorted by rows are cut into
    len(dims) equal groups, the biggest tables getting the smallest D (then the tables are
    shuffled). That bounds the memory: at the defaults (seed 0) the weights take 16.5 GB in
    fp32 (8.3 GB fp16; seeds 0..9: 16-22 GB), where untied D would average ~50 GB. A draw whose weights exceed
    ``max_weight_bytes`` raises, naming it.
    """
    if num_tables < 1:
        raise ValueError(f"num_tables must be >= 1, got {num_tables}")
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"dims must be a non-empty tuple of positive ints, got {dims}")
    rng = np.random.default_rng([seed, 0xC7])
    rows = np.sort(_log_uniform_rows(rng, num_tables, 1e5, 5e6))[::-1]
    by_size = sorted(dims)
    table_dims = [by_size[rank * len(by_size) // num_tables] for rank in range(num_tables)]
    order = rng.permutation(num_tables)
    means = rng.uniform(1.0, 30.0, size=num_tables)
    alphas = rng.uniform(1.0, 1.3, size=num_tables)
    tables = tuple(
        TableWorkload(rows=int(rows[i]), dim=table_dims[i], mean_pooling=float(means[t]),
                      pooling="poisson", alpha=float(alphas[t]))
        for t, i in enumerate(order)
    )
    suffix = "" if weights_precision == "fp32" else f"-{weights_precision}"
    workload = Workload(f"ctr-mix{suffix}", tables, batch_size, weights_precision=weights_precision)
    if workload.weight_bytes > max_weight_bytes:
        raise ValueError(f"ctr_mix(seed={seed}, num_tables={num_tables}) weighs {workload.weight_bytes / 1e9:.1f} "
                         f"GB, above max_weight_bytes={max_weight_bytes / 1e9:.1f} GB")
    return workload


def ctr_tables_dlrm(num_tables: int = 30, dim: int = 128, seed: int = 0) -> tuple[TableWorkload, ...]:
    """DLRM-shaped CTR tables: every table of dim ``dim`` (DLRM's interaction needs one D),
    rows log-uniform in 1e5..5e6, Poisson pooling with means uniform in 1..60, alpha
    uniform in 1.05..1.3, deterministic per ``seed``. At the defaults the weights take
    16.1 GB in fp32 (the table set of issue 14's end-to-end measurement)."""
    if num_tables < 1:
        raise ValueError(f"num_tables must be >= 1, got {num_tables}")
    rng = np.random.default_rng([seed, 0xD1])
    rows = _log_uniform_rows(rng, num_tables, 1e5, 5e6)
    means = rng.uniform(1.0, 60.0, size=num_tables)
    alphas = rng.uniform(1.05, 1.3, size=num_tables)
    return tuple(TableWorkload(rows=int(r), dim=dim, mean_pooling=float(m), pooling="poisson", alpha=float(a))
                 for r, m, a in zip(rows, means, alphas))
