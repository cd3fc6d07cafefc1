"""Each table's hottest rows summed apart from the sort (``RunsLaunch.hot_rows``).

``select_hot_rows`` chooses them from an even sample of the ids of each table's features;
the positions kernel counts how often each sits in each bag of each feature; ``hot_sums``
turns the counts into their gradient sums, ``sums[f] = counts[f] @ grad[:, columns of f]``;
``_hot_update_kernel`` steps
their rows (``benchmarks/probe_hot_dense.py`` times the product against cuBLAS). ``counts`` is
(F, K, B) fp32: how often feature f's hot row k sits in bag b (exact small integers);
``grad`` the (B, sum D) output gradient; feature f's D columns start at ``col_offsets[f]``.

Two kernels, each sum in a fixed order (bitwise the same from run to run): programs of
(feature, slice of SPLIT_B bags, block of BLOCK_D columns) sum their slice with fp32 dots
(``input_precision="ieee"``: full fp32 products, no TF32) into ``partials``; a second kernel
adds a feature's slices in slice order.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.common import next_power_of_2
from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_DIM,
    _META_ROW_BASE,
    _META_ROWS,
    _META_WEIGHT_OFFSET,
    META_DIM,
    META_OUT_OFFSET,
    META_ROW_BASE,
    META_ROWS,
)
from tbe_plugin.ops.optimizers import apply_update, load_row_state
from tbe_plugin.ops.update_operands import _update_operands


class HotTables(NamedTuple):
    """Which features read which table (features sharing a table share its hot rows), on the
    device: ``feature_table`` (F,) each feature's table; ``table_base`` (T,) each table's first
    global row, ascending; ``members`` (T, M) each table's features in increasing order, padded
    with F; ``table_meta`` (T, META_COLS) the metadata of each table's first feature;
    ``out_offsets``/``dims`` (F,) each feature's first output column and D; on the host,
    ``max_rows`` the most rows a table has and ``single`` whether table t is read by feature
    t alone, for every t (then a feature's sums are its table's)."""

    feature_table: torch.Tensor
    table_base: torch.Tensor
    members: torch.Tensor
    table_meta: torch.Tensor
    out_offsets: torch.Tensor
    dims: torch.Tensor
    max_rows: int
    single: bool


def hot_tables(feature_meta: torch.Tensor) -> HotTables:
    """``HotTables`` of a module's feature metadata (tables told apart by their first global
    row). Reads the metadata on the host: one device sync, once per module (the caller keeps
    the result)."""
    columns = feature_meta[:, [META_ROW_BASE, META_ROWS]].tolist()  # one host read
    bases = [base for base, _ in columns]
    max_rows = max((rows for _, rows in columns), default=0)
    table_base = sorted(set(bases))
    index = {base: t for t, base in enumerate(table_base)}
    feature_table = [index[base] for base in bases]
    groups = [[f for f, t in enumerate(feature_table) if t == table] for table in range(len(table_base))]
    width = max((len(g) for g in groups), default=1)
    members = [g + [len(bases)] * (width - len(g)) for g in groups]
    device = feature_meta.device
    first = torch.tensor([g[0] for g in groups], dtype=torch.int64, device=device)
    return HotTables(torch.tensor(feature_table, dtype=torch.int64, device=device),
                     torch.tensor(table_base, dtype=torch.int64, device=device),
                     torch.tensor(members, dtype=torch.int64, device=device).reshape(len(groups), width),
                     feature_meta[first].contiguous(), feature_meta[:, META_OUT_OFFSET].contiguous(),
                     feature_meta[:, META_DIM].contiguous(), max_rows,
                     all(g == [t] for t, g in enumerate(groups)))  # fmt: skip


def select_hot_rows(indices: torch.Tensor, offsets: torch.Tensor, feature_meta: torch.Tensor, tables: HotTables,
                    batch_size: int, hot: int, sample: int, bounds_check: bool, pad: int):  # fmt: skip
    """((T, hot), (F, hot)) int64: per table the global rows most frequent among ``sample`` ids
    of each of its features, taken at evenly spaced positions (fewer distinct rows: the rest
    ``pad``), ascending; then each feature's row of its table's. Ties go to the lower row; ids
    outside their table read as row 0 under ``bounds_check`` (the positions kernel's repair),
    offsets are clamped into the ids. On the device, no host sync; the batch alone decides."""
    F, N, device = feature_meta.shape[0], indices.numel(), indices.device
    bounds = offsets[::batch_size].long().clamp(0, N)
    starts, ends = bounds[:F], torch.maximum(bounds[1 : F + 1], bounds[:F])
    lengths = (ends - starts)[:, None]
    steps = torch.arange(sample, device=device)[None, :]
    pos = (starts[:, None] + steps * lengths // sample).clamp_(max=max(N - 1, 0))
    ids = indices[pos].long() if N else torch.zeros_like(pos)
    if bounds_check:
        ids = torch.where((ids < 0) | (ids >= feature_meta[:, META_ROWS, None]), 0, ids)
    rows = torch.sort(torch.where(lengths > 0, feature_meta[:, META_ROW_BASE, None] + ids, pad).flatten()).values
    # Each distinct row's count over its table's samples: its run's length (rows of different
    # tables never meet: global numbers).
    total = rows.numel()
    index = torch.arange(total, device=device)
    head = torch.ones_like(rows, dtype=torch.bool)
    head[1:] = rows[1:] != rows[:-1]
    # A run's length: where its row's run ends (a binary search) less where it starts. (A
    # reverse running minimum of the heads took 0.33-1.1 ms on the H200 at 90fa92d.)
    ends = torch.searchsorted(rows, rows, right=True)
    counts = torch.where(head & (rows != pad), ends - index, 0)
    # Each table's rows by count, most first (stable: ties stay in row order), then its first `hot`.
    table = (torch.searchsorted(tables.table_base, rows, right=True) - 1).clamp_(min=0)
    key = table * 2**32 + (2**32 - 1 - counts)
    key, order = torch.sort(key, stable=True)
    T = tables.table_base.numel()
    first = torch.searchsorted(key, torch.arange(T + 1, device=device) * 2**32)
    take = first[:T, None] + torch.arange(hot, device=device)[None, :]
    inside = take < first[1:, None]
    take = take.clamp_(max=total - 1)
    chosen = torch.where(inside & (counts[order][take] > 0), rows[order][take], pad)
    per_table = torch.sort(chosen, dim=1).values
    return per_table, per_table[tables.feature_table].contiguous()


@triton.jit
def _smaller(a, b):
    return tl.minimum(a, b)


@triton.jit
def _choose_hot_kernel(
    indices_ptr, offsets_ptr, meta_ptr, members_ptr, per_table_ptr, per_feature_ptr, B, N, F, pad, sample,
    K: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr, LOG_BLOCK: tl.constexpr, CHECK: tl.constexpr,
):  # fmt: skip
    """``select_hot_rows`` for table ``program_id(0)`` in one program, on int32 keys: its M
    member features' ``sample`` ids each (slot ``i``: member ``i // sample``, sample ``i %
    sample``) as rows of the table, sorted; each distinct row's count (the next run's head
    less its own, by a reverse running minimum); the heads keyed by count, then position
    (the lower row first), and sorted, most first; the first K rows kept, sorted ascending, as
    global rows padded with ``pad``; stored for the table and for each of its features. Rows
    of a table are below 2**31 - 1 (int32)."""
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    inside = i < M * sample
    f = tl.load(members_ptr + t * M + i // sample, mask=inside, other=F)
    live = inside & (f < F)
    f = tl.where(live, f, 0)
    start = tl.minimum(tl.maximum(tl.load(offsets_ptr + f * B, mask=live, other=0), 0), N)
    end = tl.maximum(tl.minimum(tl.maximum(tl.load(offsets_ptr + (f + 1) * B, mask=live, other=0), 0), N), start)
    length = (end - start).to(tl.int64)
    pos = tl.minimum(start + (i % sample) * length // sample, tl.maximum(N - 1, 0))
    ok = live & (length > 0)
    ids = tl.load(indices_ptr + pos, mask=ok, other=0)
    if CHECK:  # an id outside its table reads as row 0 (the positions kernel's repair)
        ids = tl.where((ids < 0) | (ids >= tl.load(meta_ptr + f * _META_COLS + _META_ROWS, mask=live, other=0)), 0,
                       ids)  # fmt: skip
    empty = 2147483647
    x = tl.sort(tl.where(ok, ids.to(tl.int32), empty))
    head = (i == 0) | (x != tl.gather(x, tl.maximum(i - 1, 0), 0))
    valid = x != empty
    # A run's count: where the next run starts (a reverse running minimum of the heads'
    # places, one place on) less where it starts; the empty slots are a run of their own.
    after = tl.associative_scan(tl.where(head, i, BLOCK), 0, _smaller, reverse=True)
    count = tl.where(i + 1 < BLOCK, tl.gather(after, tl.minimum(i + 1, BLOCK - 1), 0), BLOCK) - i
    # count <= BLOCK, so (count, BLOCK - 1 - i) packs into 2 * LOG_BLOCK + 1 <= 31 bits.
    key = tl.sort(tl.where(head & valid, (count << LOG_BLOCK) | (BLOCK - 1 - i), 0), descending=True)
    top = (i < K) & (key > 0)
    chosen = tl.sort(tl.where(top, tl.gather(x, BLOCK - 1 - (key & (BLOCK - 1)), 0), empty))
    first = tl.load(members_ptr + t * M)
    base = tl.load(meta_ptr + first * _META_COLS + _META_ROW_BASE)
    rows = tl.where(chosen != empty, base + chosen.to(tl.int64), pad)
    tl.store(per_table_ptr + t * K + i, rows, mask=i < K)
    for m in tl.static_range(M):
        member = tl.load(members_ptr + t * M + m)
        tl.store(per_feature_ptr + member * K + i, rows, mask=(i < K) & (member < F))


CHOOSE_MAX_BLOCK = 4096  # the most sampled ids (members x sample, a power of two) one program sorts


def choose_hot_rows(indices: torch.Tensor, offsets: torch.Tensor, feature_meta: torch.Tensor, tables: HotTables,
                    batch_size: int, hot: int, sample: int, bounds_check: bool, pad: int,
                    kernel: "bool | None" = None):  # fmt: skip
    """``select_hot_rows`` in one kernel launch (a program a table) where it fits: ``sample`` a
    power of two, a table's members times ``sample`` and ``hot`` at most ``CHOOSE_MAX_BLOCK``,
    every table under 2**31 - 1 rows; otherwise ``select_hot_rows`` itself. The same rows
    either way, for ids inside their tables (bounds checked or valid). ``kernel``: None, the
    kernel on CUDA only (the interpreter's scan takes ~30 s for a block of 2048 on the CPU);
    True, wherever it fits (the CPU tests, small samples); False, never."""
    T, M = tables.members.shape
    F = feature_meta.shape[0]
    block = max(next_power_of_2(M * sample), next_power_of_2(hot))
    fits = not sample & (sample - 1) and block <= CHOOSE_MAX_BLOCK and T > 0 and tables.max_rows < 2**31 - 1
    if not fits or not (indices.device.type == "cuda" if kernel is None else kernel):
        return select_hot_rows(indices, offsets, feature_meta, tables, batch_size, hot, sample, bounds_check, pad)
    per_table = torch.empty(T, hot, dtype=torch.int64, device=indices.device)
    per_feature = torch.empty(F, hot, dtype=torch.int64, device=indices.device)  # each feature is one table's
    _choose_hot_kernel[(T,)](
        indices, offsets, feature_meta, tables.members, per_table, per_feature, batch_size, indices.numel(), F, pad,
        sample, K=hot, M=M, BLOCK=block, LOG_BLOCK=block.bit_length() - 1, CHECK=bounds_check,
        num_warps=CHOOSE_WARPS if block >= 1024 else 4,
    )  # fmt: skip
    return per_table, per_feature


CHOOSE_WARPS = 16  # warps of a choosing program of 1024 sampled ids or more (8 ids a thread at 4096)


@triton.jit
def _hot_partials_kernel(
    hot_counts_ptr, grad_ptr, col_offsets_ptr, dims_ptr, partials_ptr, bag_scale_ptr, B, grad_stride, slices,
    K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_B: tl.constexpr, SCALED: tl.constexpr = False,
    TF32X3: tl.constexpr = False,
):  # fmt: skip
    """partials[f, s, :, d-block] = counts[f, :, s-th SPLIT_B bags] @ grad[those bags, f's columns]
    (SCALED: each bag's counts times ``bag_scale[f * B + b]`` first, MEAN's 1/L). TF32X3
    (``RunsLaunch.hot_tf32x3``): the dots on tensor cores as three TF32 products (``hot_sums``)."""
    f = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_D
    dim = tl.load(dims_ptr + f)
    if d0 < dim:
        col0 = tl.load(col_offsets_ptr + f)
        ks = tl.arange(0, K)
        cols = d0 + tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        acc = tl.zeros([K, BLOCK_D], dtype=tl.float32)
        first = s.to(tl.int64) * SPLIT_B
        for b0 in range(0, SPLIT_B, BLOCK_B):
            bags = first + b0 + tl.arange(0, BLOCK_B)
            inside = bags < B
            c = tl.load(hot_counts_ptr + (f * K + ks[:, None]) * B + bags[None, :], mask=inside[None, :], other=0.0)
            if SCALED:  # on the counts (a [K, BLOCK_B] tile): scaling the gradient tile spilled
                c = c * tl.load(bag_scale_ptr + f * B + bags, mask=inside, other=0.0)[None, :]
            g = tl.load(grad_ptr + bags[:, None] * grad_stride + col0 + cols[None, :],
                        mask=inside[:, None] & col_mask[None, :], other=0.0)  # fmt: skip
            if TF32X3:
                acc = tl.dot(c, g.to(tl.float32), acc, input_precision="tf32x3")
            else:
                acc = tl.dot(c, g.to(tl.float32), acc, input_precision="ieee")
        out = partials_ptr + ((f * slices + s) * K + ks[:, None]) * BLOCK_D * tl.num_programs(2) + cols[None, :]
        tl.store(out, acc, mask=col_mask[None, :])


@triton.jit
def _hot_sum_kernel(partials_ptr, sums_ptr, dims_ptr, slices, width, K: tl.constexpr, BLOCK_D: tl.constexpr):
    """sums[f, k, d-block] = partials[f, 0, k] + partials[f, 1, k] + ... in slice order."""
    f = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_D
    dim = tl.load(dims_ptr + f)
    if d0 < dim:
        ks = tl.arange(0, K)
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = cols[None, :] < dim
        total = tl.zeros([K, BLOCK_D], dtype=tl.float32)
        for s in range(0, slices):
            total += tl.load(partials_ptr + ((f * slices + s) * K + ks[:, None]) * width + cols[None, :], mask=mask,
                             other=0.0)  # fmt: skip
        tl.store(sums_ptr + (f * K + ks[:, None]) * width + cols[None, :], total, mask=mask)


def hot_sums(counts: torch.Tensor, grad: torch.Tensor, col_offsets: torch.Tensor, dims: torch.Tensor,
             split_b: int = 1024, block_b: int = 64, block_d: int = 64, num_warps: int = 4,
             bag_scale: "torch.Tensor | None" = None, max_dim: "int | None" = None,
             tf32x3: bool = False) -> torch.Tensor:  # fmt: skip
    """(F, K, max D) fp32: ``counts[f] @ grad[:, col_offsets[f] : col_offsets[f] + dims[f]]``, zero past
    each feature's D. ``counts`` (F, K, B) fp32 with K a power of two >= 16; ``grad`` (B, sum D),
    unit column stride; ``col_offsets``/``dims`` int64 on ``grad``'s device. ``bag_scale``: (F * B,)
    fp32 factors of each bag (MEAN's 1/L), on its counts before the product (the backward puts
    them on each id's gradient row: the same sum up to fp32 rounding). ``max_dim``: at least
    ``dims.max()`` (read from ``dims`` when None: a device sync). Bitwise repeatable.
    ``tf32x3``: each fp32 dot as three TF32 tensor-core products (the hi*hi, hi*lo and lo*hi
    parts of its operands split into TF32 high and low halves, accumulated in fp32): an
    operand's lowest ~2 of its 24 mantissa bits drop (~2**-21 relative; the counts of SUM,
    small integers, are exact), against fp32 FMAs' ~2**-24 a product; the accumulation's own
    rounding over a hot row's thousands of bags is larger. The fp32 FMA path is
    compute-bound at K=64 (ctr-dlrm, H200 at 388cce3: 0.33-0.45 ms, TF32 0.12)."""
    if counts.dim() != 3 or counts.dtype != torch.float32:
        raise ValueError(f"hot_sums: counts must be (F, K, B) fp32, got {counts.dtype} of shape {tuple(counts.shape)}")
    F, K, B = counts.shape
    if K < 16 or K & (K - 1):
        raise ValueError(f"hot_sums: K (hot rows a feature) must be a power of two >= 16 (tl.dot), got {K}")
    if grad.dim() != 2 or grad.shape[0] != B or grad.stride(1) != 1:
        raise ValueError(f"hot_sums: grad must be (B={B}, sum D) with unit column stride, got {tuple(grad.shape)}")
    if split_b % block_b:
        raise ValueError(f"hot_sums: split_b ({split_b}) must be a multiple of block_b ({block_b})")
    if bag_scale is not None and (bag_scale.dtype != torch.float32 or bag_scale.numel() != F * B):
        raise ValueError(f"hot_sums: bag_scale must be fp32 with F*B={F * B} entries, got {bag_scale.dtype} "
                         f"{tuple(bag_scale.shape)}")  # fmt: skip
    if max_dim is None:
        max_dim = int(dims.max()) if F else 0
    blocks = triton.cdiv(max(max_dim, 1), block_d)
    width = blocks * block_d
    slices = triton.cdiv(B, split_b)
    counts, col_offsets, dims = counts.contiguous(), col_offsets.contiguous(), dims.contiguous()
    sums = torch.zeros(F, K, width, dtype=torch.float32, device=grad.device)  # zero past each feature's D
    if F == 0 or B == 0:
        return sums[:, :, :max_dim]
    # Uninitialized: the sum kernel reads only the columns below each feature's D, all written.
    partials = torch.empty(F, slices, K, width, dtype=torch.float32, device=grad.device)
    _hot_partials_kernel[(F, slices, blocks)](
        counts, grad, col_offsets, dims, partials, counts if bag_scale is None else bag_scale.contiguous(), B,
        grad.stride(0), slices, K=K, BLOCK_B=block_b, BLOCK_D=block_d, SPLIT_B=split_b, SCALED=bag_scale is not None,
        TF32X3=tf32x3, num_warps=num_warps,
    )  # fmt: skip
    _hot_sum_kernel[(F, blocks)](partials, sums, dims, slices, width, K=K, BLOCK_D=block_d)
    return sums[:, :, :max_dim]


@triton.jit
def _hot_update_kernel(
    hot_ptr, touched_ptr, sums_ptr, feature_meta_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, step_ptr, hyper_ptr,
    width, pad,
    HOT: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, OPTIMIZER: tl.constexpr,
    WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """One optimizer step on ROWS of table f's hot rows with their summed gradients (``sums``
    and ``feature_meta`` a row a table); slots holding no row (``pad``) or a row the batch did
    not touch are skipped."""
    f = tl.program_id(0).to(tl.int64)
    slots = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row = tl.load(hot_ptr + f * HOT + slots)
    active = (row != pad) & (tl.load(touched_ptr + f * HOT + slots) != 0)
    meta = feature_meta_ptr + f * _META_COLS
    dim = tl.load(meta + _META_DIM)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET) + (row - tl.load(meta + _META_ROW_BASE)) * dim
    w_start = tl.where(active, w_start, 0) // ALIGN * ALIGN
    dims = tl.zeros([ROWS], dtype=tl.int64) + dim // ALIGN * ALIGN
    cols = tl.arange(0, BLOCK_D)
    row_mask = cols[None, :] < dims[:, None]
    w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
    w, m1, m2 = load_row_state(w_ptrs, w_start, row, cols, row_mask, active, momentum1_ptr, momentum2_ptr, OPTIMIZER)
    g = tl.load(sums_ptr + (f * HOT + slots[:, None]) * width + cols[None, :], mask=row_mask & active[:, None],
                other=0.0)  # fmt: skip
    apply_update(
        g, w, m1, m2, active, row_mask, w_ptrs, w_start, row, cols, dims, momentum1_ptr, momentum2_ptr, step_ptr,
        hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip


HOT_UPDATE_ROWS = 16  # hot rows a program of the update kernel steps (hot_rows is a multiple)


def mean_bag_scale(offsets: torch.Tensor, num_indices: int) -> torch.Tensor:
    """(F * B,) fp32: 1 / L of each bag, its offsets clamped into [0, num_indices] and L at
    least 1 (the positions kernel's ``_bag_length`` rule; the same correctly rounded 1/L)."""
    bounds = offsets.long().clamp(0, num_indices)
    lengths = (bounds[1:] - bounds[:-1]).clamp_(min=1)
    return torch.reciprocal(lengths.to(torch.float32))


def hot_step(grad_output, weights, momentum1, momentum2, step, feature_meta, tables: HotTables, hot_rows, hot_counts,
             args, align: int, pad: int, max_dim: int, bag_scale=None, tf32x3: bool = False) -> None:  # fmt: skip
    """The hot rows' share of the backward, after the positions kernel counted them per
    feature: their gradient sums (``hot_sums``; ``bag_scale`` for MEAN), added over each
    table's features in feature order, and one optimizer step on every hot row of a table
    the batch touched. ``hot_rows``: the tables' hot rows (``choose_hot_rows``' first)."""
    F, K, _ = hot_counts.shape
    T = hot_rows.shape[0]
    if F == 0:
        return
    sums = hot_sums(hot_counts, grad_output, tables.out_offsets, tables.dims, bag_scale=bag_scale, max_dim=max_dim,
                    tf32x3=tf32x3)  # fmt: skip
    touched = hot_counts.sum(2)  # > 0 where the batch holds the row (counts are exact integers, >= 0)
    if not tables.single:  # per table: its features' sums added in feature order (members padded with F: zeros)
        sums = torch.cat([sums, sums.new_zeros(1, *sums.shape[1:])])[tables.members].sum(1)
        touched = torch.cat([touched, touched.new_zeros(1, K)])[tables.members].sum(1)
    step, m1, m2, hyper, modes = _update_operands(args, weights, momentum1, momentum2, step, hot_rows, align)
    _hot_update_kernel[(T, K // HOT_UPDATE_ROWS)](
        hot_rows, touched, sums, tables.table_meta, weights, m1, m2, step, hyper, sums.stride(1), pad,
        HOT=K, ROWS=HOT_UPDATE_ROWS, BLOCK_D=max(16, next_power_of_2(max_dim)), **modes,
    )  # fmt: skip
