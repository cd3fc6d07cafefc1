"""Table-batched embedding forward: Triton kernels, their launchers and the custom op.

Layout (FBGEMM's convention): the rows of every table live back to back in one flat
``weights`` buffer; table ``t`` starts at ``weights_offsets[t]`` and row ``r`` of it at
``weights_offsets[t] + r * D_t``. Features map to tables; ``indices`` holds the ids of all
bags, feature-major, and bag ``f * B + b`` spans ``indices[offsets[f*B+b] : offsets[f*B+b+1]]``.

Per-feature metadata travels as one int64 tensor ``feature_meta[F, 4]`` with columns
(weight offset, rows, D, output column offset). Pooled outputs are ``[B, sum of D]``;
unpooled (``Pooling.NONE``) outputs are ``[len(indices), max D]``, one row per id.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.bounds import raise_if_fatal, warn_once
from tbe_plugin.ops.common import BoundsCheck, Pooling, cdiv, next_power_of_2
from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_DIM,
    _META_OUT_OFFSET,
    _META_ROWS,
    _META_WEIGHT_OFFSET,
    META_ROWS,
    _checked_bag_bounds,
    _checked_ids,
    _mean_factors,
    _pooled_column_block,
)
from tbe_plugin.ops.forward_flat import _bag_marks_kernel, _flat_pooled_forward_kernel
from tbe_plugin.ops.forward_warp import LANES, _warp_pooled_forward_kernel


@triton.jit
def _pooled_forward_kernel(
    weights_ptr,
    feature_meta_ptr,
    work_ptr,  # [num_work, 2]: (feature, first column of this D-chunk)
    indices_ptr,
    offsets_ptr,
    per_sample_weights_ptr,
    out_ptr,
    status_ptr,
    B,
    total_bags,
    num_indices,
    out_stride,
    MEAN: tl.constexpr,
    WEIGHTED: tl.constexpr,
    CHECK: tl.constexpr,
    ALIGN: tl.constexpr,  # every row start is a multiple of ALIGN elements
    BAGS: tl.constexpr,  # bags per program
    BLOCK_L: tl.constexpr,  # ids per bag read per step
    BLOCK_D: tl.constexpr,  # columns per program
    PREFETCH: tl.constexpr,  # load the next step's ids while this step's rows are read
    DIRECT: tl.constexpr,  # a program column per feature, one column block each: no work items
):
    pid_bag = tl.program_id(0)
    feature, d_start, weight_offset, rows, dim, out_col = _pooled_column_block(
        feature_meta_ptr, work_ptr, tl.program_id(1), ALIGN, BLOCK_D, DIRECT
    )

    b = pid_bag * BAGS + tl.arange(0, BAGS)
    b_mask = b < B
    bag = feature * B + b
    start, end = _checked_bag_bounds(
        offsets_ptr, bag, b_mask, num_indices, total_bags, status_ptr, CHECK
    )
    length = end - start
    max_len = tl.max(length, axis=0)
    if MEAN and BLOCK_L > 1:
        # With several ids a step each row is scaled by 1/L as it is read (as the
        # backward's factor): scaling the sums at the end held the lengths in a second
        # layout, reloaded the offsets and spilled (ptxas sm_90, the L~20 tile: fp16 0 ->
        # 128 bytes a thread, fp32 112 -> 392); with one id a step, the end spills less.
        inv = _mean_factors(length)

    cols = d_start + tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    acc = tl.zeros((BAGS, BLOCK_D), dtype=tl.float32)
    # Tiles are [BLOCK_L, BAGS, BLOCK_D]: Triton lays threads along D, then warps along
    # bags, so the sum over a bag's ids stays inside each thread's registers.
    steps = tl.arange(0, BLOCK_L)
    if PREFETCH:
        # A step's row loads wait on its ids: without PREFETCH every step pays two memory
        # latencies one after the other (ids, then rows); with it the next step's ids are
        # in flight beside this step's rows, so a step pays about one.
        first_mask = steps[:, None] < length[None, :]
        next_ids = _checked_ids(indices_ptr, start[None, :] + steps[:, None], first_mask, rows, status_ptr, CHECK)
    for l0 in range(0, max_len, BLOCK_L):
        l = l0 + steps
        slot_mask = l[:, None] < length[None, :]  # [BLOCK_L, BAGS]
        pos = start[None, :] + l[:, None]
        if PREFETCH:
            ids = next_ids
        else:
            ids = _checked_ids(indices_ptr, pos, slot_mask, rows, status_ptr, CHECK)
        # Written as a multiple of ALIGN so that Triton can prove row starts aligned
        # and read rows with vector loads.
        row_start = (weight_offset // ALIGN + ids * (dim // ALIGN)) * ALIGN
        ptrs = weights_ptr + row_start[:, :, None] + cols[None, None, :]
        vals = tl.load(
            ptrs, mask=slot_mask[:, :, None] & col_mask[None, None, :], other=0.0
        ).to(tl.float32)
        if PREFETCH:
            ahead = (l + BLOCK_L)[:, None]
            next_ids = _checked_ids(indices_ptr, start[None, :] + ahead, ahead < length[None, :], rows, status_ptr,
                                    CHECK)  # fmt: skip
        if WEIGHTED:
            w = tl.load(per_sample_weights_ptr + pos, mask=slot_mask, other=0.0)
            vals = vals * w.to(tl.float32)[:, :, None]
        if MEAN and BLOCK_L > 1:
            vals = vals * inv[None, :, None]
        acc += tl.sum(vals, axis=0)
    if MEAN and BLOCK_L == 1:
        acc = acc * _mean_factors(length)[:, None]
    # The row stride (the sum of the D) is a multiple of ALIGN too: vector stores.
    out_ptrs = out_ptr + b[:, None].to(tl.int64) * (out_stride // ALIGN * ALIGN) + out_col + cols[None, :]
    tl.store(
        out_ptrs,
        acc.to(out_ptr.dtype.element_ty),
        mask=b_mask[:, None] & col_mask[None, :],
    )


@triton.jit
def _offsets_check_kernel(
    offsets_ptr, status_ptr, total_bags, num_indices, BLOCK: tl.constexpr
):
    """Checks every bag's offsets (the unpooled kernel reads ids, not bags)."""
    bag = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _checked_bag_bounds(
        offsets_ptr, bag, bag < total_bags, num_indices, total_bags, status_ptr, True
    )


@triton.jit
def _unpooled_forward_kernel(
    weights_ptr,
    feature_meta_ptr,
    indices_ptr,
    offsets_ptr,
    per_sample_weights_ptr,
    out_ptr,
    status_ptr,
    B,
    num_features,
    num_indices,
    out_stride,
    out_width,
    WEIGHTED: tl.constexpr,
    CHECK: tl.constexpr,
    ALIGN: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,  # ceil(log2(num_features)) + 1
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One output row per id: the row of its table, times its per-sample weight."""
    pos = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    pos_mask = pos < num_indices
    # The feature of each id: the last feature whose first offset is <= its position.
    lo = tl.zeros((BLOCK_N,), dtype=tl.int64)
    hi = tl.zeros((BLOCK_N,), dtype=tl.int64) + num_features  # exclusive
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        first = tl.load(offsets_ptr + mid * B, mask=pos_mask & (mid < hi), other=0)
        go_right = (first.to(tl.int64) <= pos) & (mid < hi)
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    feature = tl.maximum(lo - 1, 0)
    meta = feature_meta_ptr + feature * _META_COLS
    weight_offset = tl.load(meta + _META_WEIGHT_OFFSET, mask=pos_mask, other=0)
    rows = tl.load(meta + _META_ROWS, mask=pos_mask, other=1)
    dim = tl.load(meta + _META_DIM, mask=pos_mask, other=0) // ALIGN * ALIGN  # vector loads (pooled kernel)
    out_width = out_width // ALIGN * ALIGN  # max D, and the row stride: multiples of ALIGN
    out_stride = out_stride // ALIGN * ALIGN
    ids = _checked_ids(indices_ptr, pos, pos_mask, rows, status_ptr, CHECK)
    row_start = (weight_offset // ALIGN + ids * (dim // ALIGN)) * ALIGN
    # Columns past a narrow table's D are written as zeros, up to the output's width.
    for d0 in range(0, out_width, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = pos_mask[:, None] & (cols[None, :] < dim[:, None])
        vals = tl.load(weights_ptr + row_start[:, None] + cols[None, :], mask=mask, other=0.0)
        vals = vals.to(tl.float32)
        if WEIGHTED:
            w = tl.load(per_sample_weights_ptr + pos, mask=pos_mask, other=0.0)
            vals = vals * w.to(tl.float32)[:, None]
        tl.store(
            out_ptr + pos[:, None].to(tl.int64) * out_stride + cols[None, :],
            vals.to(out_ptr.dtype.element_ty),
            mask=pos_mask[:, None] & (cols[None, :] < out_width),
        )


WIDE_TILE = 512  # the column block of wide 2-byte rows (``wide_rows``)


def wide_rows(avg_len: float, elem_size: int) -> bool:
    """Whether rows of 512 columns and more are read whole (a 512-column block, ``WIDE_TILE``)
    rather than in 128-column blocks: 2-byte rows in bags of 7-48 ids, the shape swept. H200
    at 8ab989e (``tune_forward``, the suite's wide-d512-fp16: D=512 fp16, Poisson(20) bags,
    Zipf 1.05): 128-column blocks (16, 2, 128) 0.762 ms, whole rows (1, 8, 512) with PREFETCH
    0.514 (FBGEMM 0.740): four programs a bag each reloaded the bag's ids and offsets and
    read a quarter row (256 bytes) an id. The sweep's fastest, (2, 4, 512) at 0.447, spills
    8-16 bytes a thread for fp16 (ptxas, sm_90); (1, 8, 512) spills nothing (fp16 160
    registers, bf16 215)."""
    return elem_size == 2 and 6 < avg_len <= 48


def pooled_tile(dim: int, wide: bool = False) -> int:
    """The pooled kernel's column block for rows of ``dim``: a power of two, 16 to 128, or
    ``WIDE_TILE`` for rows of 512 columns and more when ``wide`` (``wide_rows``)."""
    if wide and next_power_of_2(dim) >= WIDE_TILE:
        return WIDE_TILE
    return max(16, min(next_power_of_2(dim), 128))


# Bags of 7-48 ids, by (bytes a weight, column tile), where the common tile (16 bags, 2 ids a
# step, ids a step ahead) is not the one to use. 2-byte rows of 128 columns: a module's
# 16-bit rows of D=128 are 16-byte aligned (ALIGN 8, ``vector_alignment``) and read 16 bytes
# a load, where (16, 2) spills 144-200 bytes a thread for fp16 and (16, 2) with three
# stages (bf16's tile) 136-208 for bf16 (ptxas, sm_90); (8, 1) spills nothing (118-167
# registers). H200 at bcfddd2 (``tune_forward``, ms): L=20 uniform fp16 0.431 -> 0.400, bf16
# 0.501 -> 0.414; ctr-mix-fp16's 128-column launch (D 128 and 256, Poisson bags) 1.027 ->
# 0.814. 4-byte rows of 64 columns: ctr-mix's D=64 launch 0.242 -> 0.182 with (8, 4)
# (160 registers against 224; the only such launch swept).
L20_TILES = {(2, 128): (8, 1, 128, 1, 1, 1), (4, 64): (8, 4, 64, 1, 1, 1)}

# 128-column rows where a warp a bag (``forward_warp``) beats the lockstep tile, by (bytes a
# weight): (mean ids a bag above which, tile). FLAT 4 (lean rows, a bag a program), H200 at
# 564485e/e45ba40 (``tune_forward``, ms, lockstep or FLAT 3 -> FLAT 4 (1, 8)): fp32 ctr-dlrm
# (Poisson(1-60), mean 31) 0.619 -> 0.536, ctr-mix's 128/256-column class (batch mean 13.7,
# Zipf 1.0-1.3) 0.760 -> 0.725, L=20 uniform 0.676 -> 0.650, L=20 Zipf 1.15 0.245 -> 0.232;
# L=10 Zipf 1.15 lost (0.154 -> 0.181) and L=10 uniform was near even (0.359 -> 0.352), so
# bags of up to 12 ids stay in lockstep. fp16: ctr-mix-fp16's class 0.803 -> 0.708, L=20
# 0.350 (FLAT 3 (1, 32)) -> 0.352, L=10 0.227 -> 0.229. (1, 32) instead of (1, 8) lost on
# the skewed Poisson classes (ctr-dlrm 0.631, ctr-mix-fp16 0.913). H200 at 667690e: bf16
# rows, L=20 uniform, their lockstep tile (8, 1) 0.417 -> 0.356 (FLAT 4 (1, 32) 0.349);
# per-sample weights (the weight a scalar since 7477d0c), lockstep -> FLAT 4 (1, 8): L=20
# uniform fp32 0.684 -> 0.661, L=20 Zipf 1.15 0.270 -> 0.264 (L=10: 0.359 -> 0.359; below the
# threshold anyway). Bags of more than 48 ids: ``LONG_WARP_TILE`` (bf16 and weighted there
# unmeasured: fp16's and fp32's result taken for them).
WARP_TILES = {4: (12, (1, 8, 128, 1, 1, 0, 4)), 2: (12, (1, 8, 128, 1, 1, 0, 4))}

# Bags of more than 48 ids of 128-column rows: FLAT 4 with 32 rows in flight a warp. H200 at
# 564485e/e45ba40 (``tune_forward``, ms): long-bags (fp16, Poisson(100-200), Zipf 1.1)
# 0.649 -> 0.488; L=100 uniform fp32 3.020 -> 3.021 (every tile there within 1% of 2.99).
LONG_WARP_TILE = (1, 32, 128, 1, 1, 0, 4)


def pooled_launch_config(avg_len: float, max_dim: int, elem_size: int, bf16: bool = False, warp: bool = True):
    """(BAGS, BLOCK_L, BLOCK_D, num_warps, num_stages, PREFETCH) for a pooled launch, by
    shape class. (``forward_into`` also takes five values, PREFETCH then 0, and seven: the
    seventh FLAT, 1 for the flat-range kernel of ``forward_flat``, 2 for it with bag marks,
    3 for the warp-a-bag kernel of ``forward_warp``, BLOCK_L then its rows in flight a warp.)

    Each program is one warp reading a [BLOCK_L, BAGS, BLOCK_D] tile of rows per step:
    many short bags per program when bags are short, a long BLOCK_L when they are long.
    From sweeps on an H200 (``tbe_plugin.benchmarks.tune_forward``): one warp per
    program won at every shape, with 16-32 ids per step and 128-column blocks. Bags of
    7-48 ids load each step's ids a step ahead (PREFETCH, one stage): at a79d7ca that took
    the end-to-end tables' forward from 0.838 to 0.695 ms and ctr-mix's from 1.649 to
    1.442 (``tune_forward`` on Poisson bags); the shorter and longer classes were not
    swept with it and keep three stages. Not for bf16 rows: with PREFETCH the kernel spills
    104 bytes a thread there (fp16: none; ptxas, sm_90) and the suite's bf16 forward went
    from 0.497 to 0.684 ms (f39d6dc), so bf16 keeps the three-stage tile. Wide 2-byte rows
    (``wide_rows``) read whole: a warp a bag, 8 ids a step, ids a step ahead. 16-bit rows
    of 128-column blocks and fp32 rows of 64 in bags of 7-48 ids: ``L20_TILES``. No config
    picks the flat-range kernel (``forward_flat``): on skewed ids it ran 1.6-3.8x slower
    than these tiles (H200, ``results/tune_forward_h200_6b14428_flat.json``). 128-column
    rows in bags averaging more than ``WARP_TILES``' threshold (12 ids) take a warp a bag
    (``forward_warp``; the seventh value 4), ``LONG_WARP_TILE`` above 48, unless ``warp`` is
    False (tables that may hold 2**31 rows: ``module_launch_config``).
    """
    block_d = pooled_tile(max_dim, wide_rows(avg_len, elem_size))
    if block_d >= WIDE_TILE:
        return 1, 8, block_d, 1, 1, 1
    if avg_len <= 1.5:
        return 16, 1, block_d, 1, 3, 0
    if avg_len <= 3:
        return 16, 2, block_d, 1, 3, 0
    if avg_len <= 6:
        return 8, 4, block_d, 1, 3, 0
    lean = warp and block_d == 128 and elem_size in WARP_TILES
    if avg_len <= 48:
        if lean and avg_len > WARP_TILES[elem_size][0]:
            return WARP_TILES[elem_size][1]
        if (elem_size, block_d) in L20_TILES:
            return L20_TILES[elem_size, block_d]
        return (16, 2, block_d, 1, 3, 0) if bf16 else (16, 2, block_d, 1, 1, 1)
    return LONG_WARP_TILE if lean else (1, 32, block_d, 1, 3, 0)


def module_launch_config(avg_len: float, tile: int, weights: torch.Tensor, dims: Sequence[int]):
    """``pooled_launch_config`` for a class of a module's features (column ``tile``), but the
    lockstep tile for weights that may hold a table of 2**31 rows or more (``weights.numel()
    // min(dims)``: the warp kernel holds ids as int32; never one of its classes on a GPU of
    today, 2**31 rows of D >= 65). Bags with per-sample weights take the same tiles (FLAT 4
    lost there at 9e0aa30, 0.833 ms against the lockstep tile's 0.657, while each row's
    product with its weight went through shared memory with a barrier; 7477d0c took the
    weight as a scalar, and FLAT 4 won at 667690e: ``WARP_TILES``)."""
    warp = weights.numel() // max(1, min(dims)) < 2**31
    return pooled_launch_config(avg_len, tile, weights.element_size(), weights.dtype == torch.bfloat16, warp)


def build_work_items(dims: torch.Tensor, block_d: int) -> torch.Tensor:
    """[(feature, first column)] for every BLOCK_D-wide chunk of every feature's row."""
    items = [
        (f, d0)
        for f, d in enumerate(dims.tolist())
        for d0 in range(0, max(d, 1), block_d)
    ]
    return torch.tensor(items, dtype=torch.int64).reshape(-1, 2)


def forward_into(
    out: torch.Tensor,
    weights: torch.Tensor,
    feature_meta: torch.Tensor,
    work_items: Optional[torch.Tensor],
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    status: torch.Tensor,
    pooling: int,
    bounds_check: int,
    align: int,
    config,
    positions=None,
) -> bool:
    """Launch the forward kernel writing into a preallocated ``out`` (no checks here but
    that its rows start at multiples of ``align``, which the kernels promise Triton; FLAT 3
    assumes every table has fewer than 2**31 rows, as ``launch_forward`` checks).
    Pooled: ``work_items`` None launches a program column per feature, for a batch whose
    every row fits one column block (``launch_forward`` decides). ``positions``
    (``positions.ForwardPositions``): where the warp kernels (FLAT 3 and 4) also write the
    backward's positions of these features' ids; returns whether they were written."""
    if out.stride(0) % align or out.stride(-1) != 1:
        raise ValueError(f"forward output: rows must be contiguous and their stride a multiple of {align} "
                         f"elements, got strides {tuple(out.stride())}")  # fmt: skip
    num_features = feature_meta.shape[0]
    B = (offsets.numel() - 1) // num_features
    num_indices = indices.numel()
    check = bounds_check != BoundsCheck.NONE
    weighted = per_sample_weights is not None
    psw = per_sample_weights if weighted else indices  # placeholder pointer, never read
    if pooling == Pooling.NONE:
        if check and B > 0:
            total_bags = num_features * B
            _offsets_check_kernel[(cdiv(total_bags, 1024),)](
                offsets, status, total_bags, num_indices, BLOCK=1024
            )
        if num_indices == 0:
            return False
        block_n, block_d, num_warps = config
        grid = (cdiv(num_indices, block_n),)
        _unpooled_forward_kernel[grid](
            weights, feature_meta, indices, offsets, psw, out, status,
            B, num_features, num_indices, out.stride(0), out.shape[1],
            WEIGHTED=weighted, CHECK=check, ALIGN=align,
            SEARCH_STEPS=max(1, num_features.bit_length()),
            BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps,
        )  # fmt: skip
        return False
    if B == 0:
        return False
    bags, block_l, block_d, num_warps, num_stages, *extra = config
    prefetch = bool(extra and extra[0])
    # 0: lockstep; 1: flat ranges; 2: flat ranges with bag marks; 3: a warp a bag (``forward_warp``:
    # BAGS bags a program, BLOCK_L rows at once a warp); 4: the same, one bag a program, with
    # fewer instructions a row (``forward_warp._lean_rows``)
    flat = extra[1] if len(extra) > 1 else 0
    if flat not in (0, 1, 2, 3, 4):
        raise ValueError(f"forward launch config {tuple(config)}: its seventh value (FLAT) must be 0, 1, 2, 3 or "
                         f"4, got {flat!r}")
    if len(extra) > 2 or (flat >= 3 and prefetch) or (flat == 4 and bags != 1):
        raise ValueError(f"forward launch config {tuple(config)}: at most seven values, the warp kernel (FLAT 3 "
                         f"and 4) takes no PREFETCH (its sixth value must be 0), and FLAT 4 one bag a program")
    direct = work_items is None  # every feature, one column block each (launch_forward knows)
    grid = (cdiv(B, bags), num_features if direct else work_items.shape[0])
    modes = dict(MEAN=pooling == Pooling.MEAN, WEIGHTED=weighted, CHECK=check, ALIGN=align,
                 BAGS=bags, BLOCK_L=block_l, BLOCK_D=block_d, PREFETCH=prefetch, DIRECT=direct,
                 num_warps=num_warps, num_stages=num_stages)  # fmt: skip
    if not flat:
        _pooled_forward_kernel[grid](
            weights, feature_meta, feature_meta if direct else work_items, indices, offsets, psw, out, status,
            B, num_features * B, num_indices, out.stride(0), **modes,
        )  # fmt: skip
        return False
    if flat >= 3:
        written = positions is not None and not weighted
        extra = dict(rows_out_ptr=positions.rows, bags_out_ptr=positions.bags, sentinel=positions.sentinel,
                     POSITIONS=True, MERGE=positions.merge) if written else {}  # fmt: skip
        _warp_pooled_forward_kernel[grid](
            weights, feature_meta, feature_meta if direct else work_items, indices, offsets, psw, out, status,
            B, num_features * B, num_indices, out.stride(0), MEAN=modes["MEAN"], WEIGHTED=weighted, CHECK=check,
            ALIGN=align, BAGS=bags, UNROLL=block_l, BLOCK_D=block_d, DIRECT=direct, ROUND=LANES, LEAN=flat == 4,
            # Every row one column block, and B x sum(D) = B x F x BLOCK_D: every D is BLOCK_D.
            FULL=flat == 4 and direct and out.shape[1] == num_features * block_d,
            num_warps=num_warps, num_stages=num_stages, **extra,
        )  # fmt: skip
        return written
    marks = indices  # placeholder pointer, never read
    if flat == 2:
        marks = torch.zeros(num_indices + 1, dtype=torch.int32, device=indices.device)
        _bag_marks_kernel[(cdiv(num_features * B, 1024),)](offsets, marks, B, num_features * B, num_indices,
                                                           BLOCK=1024)  # fmt: skip
    _flat_pooled_forward_kernel[grid](
        weights, feature_meta, feature_meta if direct else work_items, indices, offsets, psw, marks, out, status,
        B, num_features * B, num_indices, out.stride(0), MARKS=flat == 2, **modes,
    )  # fmt: skip
    return False


def unpooled_launch_config(max_dim: int, elem_size: int):
    """(BLOCK_N, BLOCK_D, num_warps) for the unpooled kernel: ~8 KB of rows per step."""
    block_d = max(16, min(next_power_of_2(max_dim), 512 // elem_size))
    block_n = max(1, min(64, 8192 // (block_d * elem_size)))
    return block_n, block_d, 4


_work_items_cache: Dict[Tuple[Tuple[int, ...], int, torch.device], torch.Tensor] = {}


def _work_items(dims: Sequence[int], block_d: int, device: torch.device,
                features: Optional[Tuple[int, ...]] = None) -> torch.Tensor:  # fmt: skip
    """The work items of ``features`` (all when None), cached per device."""
    key = (tuple(dims), block_d, device, features)
    items = _work_items_cache.get(key)
    if items is None:
        items = build_work_items(torch.tensor(list(dims)), block_d)
        if features is not None:
            items = items[torch.isin(items[:, 0], torch.tensor(features, dtype=items.dtype))]
        items = items.to(device)
        _work_items_cache[key] = items
    return items


def pooled_tile_classes(dims: Sequence[int], wide: bool = False) -> Tuple[Tuple[int, Tuple[int, ...]], ...]:
    """Features grouped by the column tile their rows need (``pooled_tile``: a power of two,
    16 to 128, or 512 for wide rows when ``wide``): [(tile, features)], smallest tile first.
    A launch per group, so that a table of D=16 does not run in a 128-column tile beside a
    table of D=128 (mixed D). Cached per dims (the launcher asks every step)."""
    return _tile_classes(tuple(dims), wide)


@functools.lru_cache(maxsize=256)
def _tile_classes(dims: Tuple[int, ...], wide: bool) -> Tuple[Tuple[int, Tuple[int, ...]], ...]:
    groups: Dict[int, List[int]] = {}
    for f, d in enumerate(dims):
        groups.setdefault(pooled_tile(d, wide), []).append(f)
    return tuple((tile, tuple(features)) for tile, features in sorted(groups.items()))


def output_shape(num_indices, num_bags_plus_one, dims: Sequence[int], pooling: int):
    if pooling == Pooling.NONE:
        return (num_indices, max(dims))
    return ((num_bags_plus_one - 1) // len(dims), sum(dims))


def launch_forward(
    weights: torch.Tensor,
    feature_meta: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    status: torch.Tensor,
    dims: List[int],
    pooling: int,
    bounds_check: int,
    output_dtype: torch.dtype,
    align: int,
    positions=None,
) -> torch.Tensor:
    """The forward of a table batch: pooled ``[B, sum(dims)]`` or unpooled ``[N, max(dims)]``.

    ``feature_meta`` is ``[F, META_COLS]`` int64 (see ``indexing``) and ``dims`` the
    per-feature D on the host; inputs are assumed validated (``bounds.validate_forward_inputs``)
    except for what ``bounds_check`` covers: the kernels count problems into ``status``,
    and FATAL raises here. ``positions`` (``positions.ForwardPositions``, pooled, training):
    the backward's positions written too where every class's kernel writes them
    (``positions.written``).
    """
    shape = output_shape(indices.numel(), offsets.numel(), dims, pooling)
    # The kernels write every element: each (bag, column) of a pooled output belongs to
    # exactly one program, and each unpooled row to the program of its id.
    out = torch.empty(shape, dtype=output_dtype, device=weights.device)
    elem = weights.element_size()
    if pooling == Pooling.NONE:
        config = unpooled_launch_config(max(dims), elem)
        forward_into(out, weights, feature_meta, None, indices, offsets, per_sample_weights, status, pooling,
                     bounds_check, align, config)  # fmt: skip
    else:
        num_bags = shape[0] * len(dims)
        avg_len = indices.numel() / max(num_bags, 1)
        classes = pooled_tile_classes(dims, wide_rows(avg_len, elem))
        written = []
        for tile, features in classes:
            config = module_launch_config(avg_len, tile, weights, dims)
            # One class whose rows fit one column block: a program column per feature.
            direct = len(classes) == 1 and max(dims) <= config[2]
            work = None if direct else _work_items(dims, config[2], weights.device,
                                                   features if len(classes) > 1 else None)  # fmt: skip
            written.append(forward_into(out, weights, feature_meta, work, indices, offsets, per_sample_weights,
                                        status, pooling, bounds_check, align, config, positions))  # fmt: skip
        if positions is not None:
            positions.written = bool(written) and all(written)
    raise_if_fatal(status, bounds_check, indices, offsets, feature_meta[:, META_ROWS])
    return out


def _tbe_forward_impl(
    weights: torch.Tensor,
    feature_meta: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    status: torch.Tensor,
    dims: List[int],
    pooling: int,
    bounds_check: int,
    output_dtype: torch.dtype,
    align: int,
) -> torch.Tensor:
    """``forward_and_warn`` (the registered op's implementation: its schema has no place for
    the training forward's positions)."""
    return forward_and_warn(weights, feature_meta, indices, offsets, per_sample_weights, status, dims, pooling,
                            bounds_check, output_dtype, align)  # fmt: skip


def forward_and_warn(weights, feature_meta, indices, offsets, per_sample_weights, status, dims, pooling, bounds_check,
                     output_dtype, align, positions=None) -> torch.Tensor:  # fmt: skip
    """``launch_forward``, then the WARNING mode's warn-once on the persistent status."""
    out = launch_forward(weights, feature_meta, indices, offsets, per_sample_weights, status, dims, pooling,
                         bounds_check, output_dtype, align, positions)  # fmt: skip
    warn_once(status, bounds_check)
    return out


tbe_forward_op = torch.library.custom_op(
    "tbe_plugin::tbe_forward", _tbe_forward_impl, mutates_args=("status",)
)


@tbe_forward_op.register_fake
def _(weights, feature_meta, indices, offsets, per_sample_weights, status, dims,
      pooling, bounds_check, output_dtype, align):  # fmt: skip
    shape = output_shape(indices.shape[0], offsets.shape[0], dims, pooling)
    return weights.new_empty(shape, dtype=output_dtype)


def tbe_forward(*args) -> torch.Tensor:
    """The TBE forward: the registered op under ``torch.compile``, a direct call in eager.

    Both run ``_tbe_forward_impl``; the dispatcher of a custom op that mutates an input
    costs about 60 us a call on the host, more than the kernel of a small batch, so
    eager calls skip it. Arguments as for ``tbe_forward_op``.
    """
    if torch.compiler.is_compiling():
        return tbe_forward_op(*args)
    return _tbe_forward_impl(*args)
