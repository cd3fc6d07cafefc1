"""Table-batched embedding backward with the optimizer fused: Triton kernels and launcher.

No dense gradient is ever materialized. The backward of one batch:

1. ``_positions_kernel``: for every id, its global row (rows of all tables stacked, with
   the forward's bounds repair) and its bag. Ids outside every bag get a sentinel row.
2. ``torch.sort`` (stable) of the global rows, as int32 when all tables together have
   fewer than 2**31 rows (a radix sort of half the passes): equal rows form contiguous
   runs; the stable order makes every sum below deterministic.
3. ``_chunk_kernel``: fixed chunks of CHUNK sorted ids. Each gathers the output-gradient
   rows of its ids (scaled by per-sample weight and 1/L for MEAN), sums them per run with
   a segmented scan, and applies the optimizer to every run that starts and ends inside
   the chunk. For runs that cross a chunk boundary it writes the chunk's piece.
4. ``_crossing_kernel``: one program per run that crosses chunks (hot rows), adding its
   pieces SPAN chunks at a time and applying the optimizer. A hot row never serializes a
   chunk, and its own sum takes len / (CHUNK * SPAN) steps.

The optimizer update itself (``optimizers.apply_update``) sees each touched row once
per step with its exact aggregated gradient, as FBGEMM's exact optimizers do.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

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
from tbe_plugin.ops.optimizers import OptimizerArgs, apply_update



@triton.jit
def _positions_kernel(
    feature_meta_ptr, indices_ptr, offsets_ptr, rows_out_ptr, bag_out_ptr, scratch_ptr,
    B, total_bags, num_indices,
    CHECK: tl.constexpr, BAGS: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """Global row and bag of every id, bag by bag (the forward's tiling)."""
    feature = tl.program_id(1).to(tl.int64)
    meta = feature_meta_ptr + feature * _META_COLS
    rows = tl.load(meta + _META_ROWS)
    row_base = tl.load(meta + _META_ROW_BASE)
    b = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
    b_mask = b < B
    bag = feature * B + b
    start, end = _checked_bag_bounds(offsets_ptr, bag, b_mask, num_indices, total_bags, scratch_ptr, CHECK)
    length = end - start
    for l0 in range(0, tl.max(length, axis=0), BLOCK_L):
        l = l0 + tl.arange(0, BLOCK_L)
        mask = l[:, None] < length[None, :]
        pos = start[None, :] + l[:, None]
        ids = _checked_ids(indices_ptr, pos, mask, rows, scratch_ptr, CHECK)
        tl.store(rows_out_ptr + pos, row_base + ids, mask=mask)
        tl.store(bag_out_ptr + pos, bag[None, :] + tl.zeros_like(pos), mask=mask)


@triton.jit
def _segmented_sum(v1, h1, v2, h2):
    """Combine of a segmented inclusive scan: a head (h != 0) restarts the running sum."""
    return tl.where(h2 != 0, v2, v1 + v2), h1 | h2


@triton.jit
def _gather_gradients(
    grad_ptr, grad_stride, perm_ptr, bag_ptr, offsets_ptr, psw_ptr, feature_meta_ptr,
    scratch_ptr, q, valid, cols, B, total_bags, num_indices,
    UNPOOLED: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr,
):  # fmt: skip
    """Per sorted id q: its gradient row [len(q), BLOCK_D] (fp32), and its feature."""
    p = tl.load(perm_ptr + q, mask=valid, other=0)
    bag = tl.load(bag_ptr + p, mask=valid, other=0)
    feature = bag // B
    meta = feature_meta_ptr + feature * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    col_mask = valid[:, None] & (cols[None, :] < dim[:, None])
    if UNPOOLED:
        base = p * grad_stride
    else:
        base = (bag % B) * grad_stride + tl.load(meta + _META_OUT_OFFSET, mask=valid, other=0)
    g = tl.load(grad_ptr + base[:, None] + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
    scale = tl.full(p.shape, 1.0, tl.float32)
    if WEIGHTED:
        scale *= tl.load(psw_ptr + p, mask=valid, other=0.0).to(tl.float32)
    if MEAN:
        start, end = _checked_bag_bounds(offsets_ptr, bag, valid, num_indices, total_bags, scratch_ptr, CHECK)
        scale *= tl.div_rn(1.0, tl.maximum(end - start, 1).to(tl.float32))
    return g * scale[:, None], feature


@triton.jit
def _chunk_kernel(
    grad_ptr, grad_stride, sorted_rows_ptr, perm_ptr, bag_ptr, offsets_ptr, psw_ptr,
    feature_meta_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, pieces_ptr, scratch_ptr,
    step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
    B, total_bags, num_indices, sentinel,
    UNPOOLED: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    chunk = tl.program_id(0).to(tl.int64)
    q = chunk * CHUNK + tl.arange(0, CHUNK)
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    valid = row != sentinel
    prev = tl.load(sorted_rows_ptr + q - 1, mask=valid & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=valid & (q + 1 < num_indices), other=-1)
    head = valid & (row != prev)
    tail = valid & (row != nxt)
    cols = tl.arange(0, BLOCK_D)
    g, feature = _gather_gradients(
        grad_ptr, grad_stride, perm_ptr, bag_ptr, offsets_ptr, psw_ptr, feature_meta_ptr,
        scratch_ptr, q, valid, cols, B, total_bags, num_indices, UNPOOLED, MEAN, WEIGHTED, CHECK,
    )  # fmt: skip
    heads = (head[:, None] & (cols[None, :] >= 0)).to(tl.int32)
    run_sum, seen_head = tl.associative_scan((g, heads), 0, _segmented_sum)
    # seen_head: a head lies between the chunk start and q, so q's run began in this chunk.
    started_here = tl.max(seen_head, axis=1) > 0
    last = tl.max(tl.where(valid, q, -1), axis=0)

    complete = tail & started_here
    apply_update(
        run_sum, complete, row, feature, cols, feature_meta_ptr, weights_ptr, momentum1_ptr,
        momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
        OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip
    # Pieces of crossing runs: [chunk, 0] the first run's part (when it began earlier),
    # [chunk, 1] the last run's part (when it goes on after this chunk).
    first_piece = valid & ~started_here & (tail | (q == last))
    last_piece = (q == last) & ~tail
    piece_ptrs = pieces_ptr + chunk * 2 * BLOCK_D + cols[None, :]
    tl.store(piece_ptrs + 0 * q[:, None], run_sum, mask=first_piece[:, None])
    tl.store(piece_ptrs + BLOCK_D + 0 * q[:, None], run_sum, mask=last_piece[:, None])


@triton.jit
def _crossing_kernel(
    sorted_rows_ptr, perm_ptr, bag_ptr, feature_meta_ptr, weights_ptr, momentum1_ptr,
    momentum2_ptr, pieces_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
    B, num_indices, sentinel,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    """The run that begins in this chunk and goes on past it: add its pieces, update."""
    chunk = tl.program_id(0).to(tl.int64)
    first = chunk * CHUNK
    last = tl.minimum(first + CHUNK, num_indices) - 1
    row = tl.load(sorted_rows_ptr + last)
    after = tl.load(sorted_rows_ptr + last + 1, mask=last + 1 < num_indices, other=-1)
    before = tl.load(sorted_rows_ptr + first - 1, mask=first > 0, other=-1)
    if (row != sentinel) & (after == row) & (before != row):
        cols = tl.arange(0, BLOCK_D)
        total = tl.load(pieces_ptr + chunk * 2 * BLOCK_D + BLOCK_D + cols)
        # The pieces that follow, SPAN chunks per step: chunk k belongs to the run while
        # every chunk before it (from chunk + 1) hands the run on to the next chunk.
        num_chunks = (num_indices + CHUNK - 1) // CHUNK
        span = tl.arange(0, SPAN)
        next_chunk = chunk + 1
        going_on = row == row  # a tensor, as the loop reassigns it
        while going_on:
            ks = next_chunk + span
            exists = ks < num_chunks
            ends = tl.minimum(ks * CHUNK + CHUNK, num_indices) - 1
            tail_row = tl.load(sorted_rows_ptr + ends, mask=exists, other=-1)
            beyond = tl.load(sorted_rows_ptr + ends + 1, mask=exists & (ends + 1 < num_indices), other=-1)
            hands_on = exists & (tail_row == row) & (beyond == row)
            stop = tl.min(tl.where(hands_on, SPAN, span), axis=0)  # last chunk of the run
            member = exists & (span <= stop)
            piece = tl.load(
                pieces_ptr + ks[:, None] * 2 * BLOCK_D + cols[None, :], mask=member[:, None], other=0.0
            )
            total += tl.sum(piece, axis=0)
            going_on = stop == SPAN
            next_chunk += SPAN
        p = tl.load(perm_ptr + last)
        feature = tl.load(bag_ptr + p) // B
        one = tl.arange(0, 1)
        apply_update(
            total[None, :], one >= 0, row + one, feature + one, cols, feature_meta_ptr,
            weights_ptr, momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2,
            weight_decay, seed, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
        )  # fmt: skip


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


# Ids per chunk times BLOCK_D stays at 2048 elements over 8 warps: the gradient tile, its
# scan and the optimizer's row tiles then fit in registers (no spills at sm_90 for any
# optimizer, D 32..512, by ptxas); 32 x 128 over 4 warps spilled 0.6-1.2 KB a thread.
CHUNK_ELEMENTS = 2048
CHUNK_WARPS = 8
CROSSING_SPAN = 16  # chunks of a hot row's pieces summed per step
CROSSING_WARPS = 4
POSITIONS_CONFIG = dict(BAGS=16, BLOCK_L=2, num_warps=1)
PSW_CONFIG = dict(BLOCK_N=32, num_warps=8)  # 2 warps spilled 2.3 KB a thread
# Global rows are sorted as int32 below this many rows in all, int64 from there on.
INT32_KEYS_BELOW = torch.iinfo(torch.int32).max


def backward_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    momentum1: Optional[torch.Tensor],
    momentum2: Optional[torch.Tensor],
    step: Optional[torch.Tensor],
    feature_meta: torch.Tensor,
    max_dim: int,
    total_rows: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    bounds_check: bool,
    args: OptimizerArgs,
) -> Optional[torch.Tensor]:
    """Applies one optimizer step to every row the batch touched; returns the gradient
    of ``per_sample_weights`` when asked (computed from the weights before the step)."""
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
    scratch = new_status(device)  # the forward already reported bad input
    key_dtype = torch.int32 if total_rows < INT32_KEYS_BELOW else torch.int64
    sentinel = torch.iinfo(key_dtype).max  # ids outside every bag: sorted last, skipped
    rows = torch.full((N,), sentinel, dtype=key_dtype, device=device)
    bags = torch.zeros(N, dtype=torch.int64, device=device)
    _positions_kernel[(triton.cdiv(B, POSITIONS_CONFIG["BAGS"]), num_features)](
        feature_meta, indices, offsets, rows, bags, scratch, B, total_bags, N,
        CHECK=bounds_check, **POSITIONS_CONFIG,
    )  # fmt: skip
    block_d = max(16, triton.next_power_of_2(max_dim))
    mean = pooling == Pooling.MEAN
    if psw_requires_grad:
        psw_grad = torch.empty(N, dtype=torch.float32, device=device)
        _psw_grad_kernel[(triton.cdiv(N, PSW_CONFIG["BLOCK_N"]),)](
            grad_output, grad_output.stride(0), weights, feature_meta, rows, bags, offsets,
            psw_grad, scratch, B, total_bags, N, sentinel,
            MEAN=mean, CHECK=bounds_check, BLOCK_D=min(block_d, 128), **PSW_CONFIG,
        )  # fmt: skip
    sorted_rows, perm = torch.sort(rows, stable=True)
    chunk = max(2, CHUNK_ELEMENTS // block_d)
    num_chunks = triton.cdiv(N, chunk)
    pieces = torch.empty(num_chunks * 2 * block_d, dtype=torch.float32, device=device)
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
    )
    psw = per_sample_weights if per_sample_weights is not None else grad_output
    _chunk_kernel[(num_chunks,)](
        grad_output, grad_output.stride(0), sorted_rows, perm, bags, offsets, psw,
        feature_meta, weights, m1, m2, pieces, scratch, step, *hyper, B, total_bags, N, sentinel,
        UNPOOLED=pooling == Pooling.NONE, MEAN=mean, WEIGHTED=per_sample_weights is not None,
        CHECK=bounds_check, num_warps=CHUNK_WARPS, **modes,
    )  # fmt: skip
    _crossing_kernel[(num_chunks,)](
        sorted_rows, perm, bags, feature_meta, weights, m1, m2, pieces, step, *hyper, B, N, sentinel,
        SPAN=CROSSING_SPAN, num_warps=CROSSING_WARPS, **modes,
    )  # fmt: skip
    return psw_grad
