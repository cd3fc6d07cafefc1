"""Table-batched embedding backward with the optimizer fused: Triton kernels and launcher.

No dense gradient is ever materialized. The backward of one batch:

1. ``_positions_kernel``: for every id, its global row (rows of all tables stacked, with
   the forward's bounds repair), its feature, where its output-gradient row starts and
   its factor (per-sample weight, 1/L for MEAN). Ids outside every bag get a sentinel row.
2. ``torch.sort`` (stable) of the global rows, as int32 when all tables together have
   fewer than 2**31 rows (a radix sort of half the passes): equal rows form contiguous
   runs; the stable order makes every sum below deterministic. ``_sorted_operands_kernel``
   then lays the ids' operands out in sorted order, with each row's start in the weights.
3. ``_chunk_kernel``: fixed chunks of CHUNK sorted ids. Each gathers its output-gradient
   rows at once, sums them per run of one row with a segmented scan (a fixed tree: no
   chain of loads however long the run) and applies the optimizer to every run that
   starts in the chunk and ends in it or in the next one. Chunks of more than SCAN_MAX_IDS
   ids use ``_chunk_walk_kernel`` (each run walked by its first lane), faster there.
4. ``_segment_kernel``: per segment of SEGMENT sorted ids that a run enters from before, the
   sum of that run's gradient rows in the segment; ``_block_kernel``: the same per block
   of SPAN segments, from the segments' sums. All in parallel.
5. ``_crossing_kernel``: each run longer than that (hot rows) sums its ids to the end of
   its segment, then the sums of the segments and blocks it enters, SPAN at a time, and
   applies the optimizer. A hot row never serializes a chunk, and its own sum takes about
   SEGMENT / STEP + 2 + len / (SEGMENT * SPAN * SPAN) steps, in a fixed order. Memory
   beyond the sorted operands: one fp32 row per segment and per block (8.5 bytes per id
   at D=128, 34 at D=256, 68 at D=512).

Steps 3 to 5 are in ``tbe_plugin.ops.backward_runs``. The optimizer update itself
(``optimizers.apply_update``) sees each touched row once per step with its exact
aggregated gradient, as FBGEMM's exact optimizers do.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_runs import (
    _block_kernel,
    _chunk_kernel,
    _chunk_walk_kernel,
    _crossing_kernel,
    _segment_kernel,
)
from tbe_plugin.ops.common import Pooling, new_status
from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_DIM,
    _META_OUT_OFFSET,
    _META_ROW_BASE,
    _META_ROWS,
    _META_WEIGHT_OFFSET,
    _checked_bag_bounds,
    _checked_ids,
)
from tbe_plugin.ops.optimizers import OptimizerArgs


@triton.jit
def _positions_kernel(
    feature_meta_ptr, indices_ptr, offsets_ptr, psw_ptr, rows_out_ptr, feature_out_ptr,
    grad_offset_out_ptr, scale_out_ptr, bag_out_ptr, scratch_ptr,
    B, total_bags, num_indices, grad_stride,
    UNPOOLED: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr,
    WRITE_BAGS: tl.constexpr, BAGS: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """Per id, bag by bag (the forward's tiling): its global row (the sort key, with the
    forward's bounds repair), its feature, where its output-gradient row starts, and the
    factor on that row (per-sample weight, 1/L for MEAN)."""
    feature = tl.program_id(1).to(tl.int64)
    meta = feature_meta_ptr + feature * _META_COLS
    rows = tl.load(meta + _META_ROWS)
    row_base = tl.load(meta + _META_ROW_BASE)
    out_offset = tl.load(meta + _META_OUT_OFFSET)
    b = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
    b_mask = b < B
    bag = feature * B + b
    start, end = _checked_bag_bounds(offsets_ptr, bag, b_mask, num_indices, total_bags, scratch_ptr, CHECK)
    length = end - start
    inv_len = tl.div_rn(1.0, tl.maximum(length, 1).to(tl.float32))
    for l0 in range(0, tl.max(length, axis=0), BLOCK_L):
        l = l0 + tl.arange(0, BLOCK_L)
        mask = l[:, None] < length[None, :]
        pos = start[None, :] + l[:, None]
        ids = _checked_ids(indices_ptr, pos, mask, rows, scratch_ptr, CHECK)
        tl.store(rows_out_ptr + pos, row_base + ids, mask=mask)
        tl.store(feature_out_ptr + pos, feature.to(tl.int32) + tl.zeros_like(pos).to(tl.int32), mask=mask)
        if UNPOOLED:
            grad_offset = pos * grad_stride
        else:
            grad_offset = b[None, :].to(tl.int64) * grad_stride + out_offset + 0 * pos
        tl.store(grad_offset_out_ptr + pos, grad_offset, mask=mask)
        if WEIGHTED or MEAN:
            scale = tl.full(pos.shape, 1.0, tl.float32)
            if WEIGHTED:
                scale *= tl.load(psw_ptr + pos, mask=mask, other=0.0).to(tl.float32)
            if MEAN:
                scale *= inv_len[None, :]
            tl.store(scale_out_ptr + pos, scale, mask=mask)
        if WRITE_BAGS:
            tl.store(bag_out_ptr + pos, bag[None, :] + tl.zeros_like(pos), mask=mask)


@triton.jit
def _sorted_operands_kernel(
    perm_ptr, sorted_rows_ptr, feature_ptr, grad_offset_ptr, scale_ptr, feature_meta_ptr,
    sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    num_indices, sentinel, SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Per sorted id, what the update kernel needs, stored contiguously in sorted order:
    where its row starts in the flat weights, its D, its output-gradient row and factor."""
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(sorted_rows_ptr + q, mask=q < num_indices, other=sentinel)
    valid = row != sentinel
    p = tl.load(perm_ptr + q, mask=valid, other=0)
    meta = feature_meta_ptr + tl.load(feature_ptr + p, mask=valid, other=0) * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    local = row - tl.load(meta + _META_ROW_BASE, mask=valid, other=0)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET, mask=valid, other=0) + local * dim
    tl.store(sorted_w_start_ptr + q, w_start, mask=valid)
    tl.store(sorted_dim_ptr + q, dim.to(tl.int32), mask=valid)
    tl.store(sorted_grad_offset_ptr + q, tl.load(grad_offset_ptr + p, mask=valid, other=0), mask=valid)
    if SCALED:
        tl.store(sorted_scale_ptr + q, tl.load(scale_ptr + p, mask=valid, other=0.0), mask=valid)


@triton.jit
def _psw_grad_kernel(
    grad_ptr, grad_stride, weights_ptr, feature_meta_ptr, rows_ptr, bag_ptr, offsets_ptr,
    out_ptr, scratch_ptr, B, total_bags, num_indices, sentinel,
    MEAN: tl.constexpr, CHECK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """d loss / d per_sample_weight[p] = <grad of p's bag, p's weight row> (/ L for MEAN)."""
    p = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=sentinel)
    valid = row != sentinel
    bag = tl.load(bag_ptr + p, mask=valid, other=0)
    meta = feature_meta_ptr + (bag // B) * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    local = row - tl.load(meta + _META_ROW_BASE, mask=valid, other=0)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET, mask=valid, other=0) + local * dim
    g_start = (bag % B) * grad_stride + tl.load(meta + _META_OUT_OFFSET, mask=valid, other=0)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for d0 in range(0, tl.max(dim, axis=0), BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = valid[:, None] & (cols[None, :] < dim[:, None])
        w = tl.load(weights_ptr + w_start[:, None] + cols[None, :], mask=mask, other=0.0)
        g = tl.load(grad_ptr + g_start[:, None] + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * g.to(tl.float32), axis=1)
    if MEAN:
        start, end = _checked_bag_bounds(offsets_ptr, bag, valid, num_indices, total_bags, scratch_ptr, CHECK)
        acc = tl.div_rn(acc, tl.maximum(end - start, 1).to(tl.float32))
    tl.store(out_ptr + p, acc, mask=p < num_indices)


# Ids per chunk times BLOCK_D, and warps: 512 elements over 2 warps (4 ids at D=128). Chunks
# of up to SCAN_MAX_IDS ids sum their runs by a segmented scan (``_chunk_kernel``), larger
# ones (smaller D) by walking (``_chunk_walk_kernel``). Backward of rowwise Adagrad on the
# H200 (T=32, B=8192, L=20, D=128, E=1e6; ms, with the earlier per-chunk pieces for long
# runs): scan 2.92 at 4 ids / 2 warps, walk 3.20; at 8 ids / 4 warps scan 3.80, walk 3.35;
# 2 ids / 1 warp 3.81 against 2.97 (segments). The chunk kernels do not spill at sm_90.
CHUNK_ELEMENTS = 512
CHUNK_WARPS = 2
SCAN_MAX_IDS = 4
MIN_CHUNK = 2
SORTED_OPERANDS_BLOCK = 1024
SORTED_OPERANDS_WARPS = 4
CROSSING_SPAN = 16  # segments per block, and segments' or blocks' sums added per step
CROSSING_WARPS = 4  # spills 24-48 bytes at D=128, yet faster than 8 (H200: Zipf 3.62 ms against 4.11)
SEGMENT_WARPS = 4  # 8 warps: 4.32 ms at Zipf against 3.79
SEGMENTS_PER_PROGRAM = 1  # 4: Zipf 4.11 ms against 3.76, B=65536 26.3 against 25.7
CROSSING_CHUNKS_PER_PROGRAM = 64  # chunks checked for a long run's start per program
STEP_ELEMENTS = 8192  # gradient elements per gather of a long run (64 rows of D=128)
# Segments of a long run's sums hold one gather, but at least this many ids, so that their
# sums' memory (4 * D / ids bytes per lookup) stays bounded at large D. At D <= 256 (every
# configuration timed on the H200) a segment is one gather; from D=512 on, several.
MIN_SEGMENT_IDS = 32
POSITIONS_CONFIG = dict(BAGS=64, BLOCK_L=4, num_warps=4)  # measured best of 4 on the H200
PSW_CONFIG = dict(BLOCK_N=32, num_warps=8)  # 2 warps spilled 2.3 KB a thread
# Global rows are sorted as int32 below this many rows in all, int64 from there on.
INT32_KEYS_BELOW = torch.iinfo(torch.int32).max


def chunk_launch_config(block_d: int) -> tuple:
    """(ids per chunk, warps) of the update kernel: CHUNK_ELEMENTS per chunk over
    CHUNK_WARPS, but at least MIN_CHUNK ids; a larger tile (rows wider than
    CHUNK_ELEMENTS / MIN_CHUNK) gets a warp per 512 elements, up to 16."""
    chunk = max(MIN_CHUNK, CHUNK_ELEMENTS // block_d)
    if chunk * block_d <= CHUNK_ELEMENTS:
        return chunk, CHUNK_WARPS
    return chunk, min(16, chunk * block_d // 512)


_SCRATCH: dict = {}


def _scratch_status(device: torch.device) -> torch.Tensor:
    """A status vector per device that the backward's bounds checks write and nobody reads
    (one allocation and fill per process instead of three small ops a step)."""
    key = str(device)
    if key not in _SCRATCH:
        _SCRATCH[key] = new_status(device)
    return _SCRATCH[key]


def long_run_step(block_d: int) -> int:
    """Sorted ids per gather of a long run's sum (``_segment_kernel``, ``_crossing_kernel``)."""
    return max(1, STEP_ELEMENTS // block_d)


def segment_ids(block_d: int) -> int:
    """Sorted ids per segment of the long runs' sums: a gather, at least MIN_SEGMENT_IDS
    (a power of two, so a multiple of the gather)."""
    return max(long_run_step(block_d), MIN_SEGMENT_IDS)


def backward_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    momentum1: Optional[torch.Tensor],
    momentum2: Optional[torch.Tensor],
    step: Optional[torch.Tensor],
    feature_meta: torch.Tensor,
    max_dim: int,
    total_rows: int,
    align: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    bounds_check: bool,
    args: OptimizerArgs,
) -> Optional[torch.Tensor]:
    """Applies one optimizer step to every row the batch touched; returns the gradient
    of ``per_sample_weights`` when asked (computed from the weights before the step).

    ``align``: a power of two dividing every table's D (``vector_alignment``): rows of the
    weights, the output gradient and element-wise state start at its multiples.
    ``momentum1``/``momentum2`` are laid out as the module keeps them: element-wise state
    exactly like the flat weights, row-wise state one value per global row."""
    device = weights.device
    num_features = feature_meta.shape[0]
    B = (offsets.numel() - 1) // num_features
    N = indices.numel()
    psw_grad = None
    if N == 0 or B == 0:
        if psw_requires_grad:
            psw_grad = torch.zeros(N, dtype=torch.float32, device=device)
        return psw_grad
    total_bags = num_features * B
    grad_output = grad_output.contiguous()
    scratch = _scratch_status(device)  # written, never read: the forward reported bad input
    key_dtype = torch.int32 if total_rows < INT32_KEYS_BELOW else torch.int64
    sentinel = torch.iinfo(key_dtype).max  # ids outside every bag: sorted last, skipped
    mean = pooling == Pooling.MEAN
    weighted = per_sample_weights is not None
    scaled = mean or weighted
    rows = torch.full((N,), sentinel, dtype=key_dtype, device=device)
    feature = torch.empty(N, dtype=torch.int32, device=device)
    grad_offset = torch.empty(N, dtype=torch.int64, device=device)
    scale = torch.empty(N if scaled else 1, dtype=torch.float32, device=device)
    bags = torch.empty(N if psw_requires_grad else 1, dtype=torch.int64, device=device)
    psw = per_sample_weights if weighted else scale
    _positions_kernel[(triton.cdiv(B, POSITIONS_CONFIG["BAGS"]), num_features)](
        feature_meta, indices, offsets, psw, rows, feature, grad_offset, scale, bags, scratch,
        B, total_bags, N, grad_output.stride(0),
        UNPOOLED=pooling == Pooling.NONE, MEAN=mean, WEIGHTED=weighted, CHECK=bounds_check,
        WRITE_BAGS=psw_requires_grad, **POSITIONS_CONFIG,
    )  # fmt: skip
    block_d = max(16, triton.next_power_of_2(max_dim))
    if psw_requires_grad:
        psw_grad = torch.empty(N, dtype=torch.float32, device=device)
        _psw_grad_kernel[(triton.cdiv(N, PSW_CONFIG["BLOCK_N"]),)](
            grad_output, grad_output.stride(0), weights, feature_meta, rows, bags, offsets,
            psw_grad, scratch, B, total_bags, N, sentinel,
            MEAN=mean, CHECK=bounds_check, BLOCK_D=min(block_d, 128), **PSW_CONFIG,
        )  # fmt: skip
    sorted_rows, perm = torch.sort(rows, stable=True)
    sorted_w_start = torch.empty(N, dtype=torch.int64, device=device)
    sorted_dim = torch.empty(N, dtype=torch.int32, device=device)
    sorted_grad_offset = torch.empty_like(grad_offset)
    sorted_scale = torch.empty_like(scale)
    _sorted_operands_kernel[(triton.cdiv(N, SORTED_OPERANDS_BLOCK),)](
        perm, sorted_rows, feature, grad_offset, scale, feature_meta, sorted_w_start, sorted_dim,
        sorted_grad_offset, sorted_scale, N, sentinel,
        SCALED=scaled, BLOCK=SORTED_OPERANDS_BLOCK, num_warps=SORTED_OPERANDS_WARPS,
    )  # fmt: skip
    while grad_output.stride(0) % align:
        align //= 2
    chunk, chunk_warps = chunk_launch_config(block_d)
    num_chunks = triton.cdiv(N, chunk)
    if step is None:
        step = rows  # never read: only Adam and LAMB take a step count
    m1 = momentum1 if momentum1 is not None else weights
    m2 = momentum2 if momentum2 is not None else weights
    hyper = (args.learning_rate, args.eps, args.beta1, args.beta2, args.weight_decay, args.seed)
    modes = dict(
        OPTIMIZER=args.optimizer,
        WEIGHT_DECAY_MODE=args.weight_decay_mode,
        STOCHASTIC_ROUNDING=args.stochastic_rounding,
        CHUNK=chunk,
        BLOCK_D=block_d,
        ALIGN=align,
        SCALED=scaled,
    )
    sorted_operands = (sorted_rows, sorted_w_start, sorted_dim, sorted_grad_offset, sorted_scale)
    chunk_kernel = _chunk_kernel if chunk <= SCAN_MAX_IDS else _chunk_walk_kernel
    chunk_kernel[(num_chunks,)](
        grad_output, *sorted_operands, weights, m1, m2, step, *hyper, N, sentinel,
        num_warps=chunk_warps, **modes,
    )  # fmt: skip
    run_step = long_run_step(block_d)
    segment = segment_ids(block_d)
    num_segments = triton.cdiv(N, segment)
    num_blocks = triton.cdiv(num_segments, CROSSING_SPAN)
    segment_sums = torch.empty(num_segments * block_d, dtype=torch.float32, device=device)
    block_sums = torch.empty(num_blocks * block_d, dtype=torch.float32, device=device)
    _segment_kernel[(triton.cdiv(num_segments, SEGMENTS_PER_PROGRAM),)](
        grad_output, sorted_rows, sorted_dim, sorted_grad_offset, sorted_scale, segment_sums, N, sentinel,
        SCALED=scaled, BLOCK_D=block_d, SEGMENT=segment, STEP=run_step, ALIGN=align,
        SEGMENTS_PER_PROGRAM=SEGMENTS_PER_PROGRAM,
        num_warps=SEGMENT_WARPS,
    )  # fmt: skip
    _block_kernel[(num_blocks,)](
        sorted_rows, segment_sums, block_sums, N, sentinel,
        BLOCK_D=block_d, SEGMENT=segment, SPAN=CROSSING_SPAN, num_warps=CROSSING_WARPS,
    )  # fmt: skip
    _crossing_kernel[(triton.cdiv(num_chunks, CROSSING_CHUNKS_PER_PROGRAM),)](
        grad_output, *sorted_operands, weights, m1, m2, segment_sums, block_sums, step, *hyper, N, sentinel,
        SPAN=CROSSING_SPAN, CHUNKS_PER_PROGRAM=CROSSING_CHUNKS_PER_PROGRAM, SEGMENT=segment, STEP=run_step,
        num_warps=CROSSING_WARPS, **modes,
    )  # fmt: skip
    return psw_grad
