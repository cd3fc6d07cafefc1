"""Table-batched embedding backward with the optimizer fused: Triton kernels and launcher.

No dense gradient is ever materialized. The backward of one batch:

1. ``positions._positions_kernel``: for every id (a program per 1024 consecutive positions, its bag
   found by a binary search of the offsets the block spans), its global row (rows of all tables stacked,
   with the forward's bounds repair), its bag and its factor (per-sample weight, 1/L for
   MEAN). Ids outside every bag get a sentinel row. With ``RunsLaunch.forward_positions``
   (on) the training forward's warp kernels write them (``positions.ForwardPositions``).
   With ``RunsLaunch.merge_repeats`` (a candidate, off), ``positions.merged_positions``
   instead: a bag's repeats of a row within a window of positions become one id whose
   factor sums theirs, the kept ids compacted (their count read on the host) or, in place,
   the dropped ones given the sentinel row (``RunsLaunch.merge_compact``).
2. ``torch.sort`` (stable) of the global rows, as int32 when all tables together have
   fewer than 2**31 rows (a radix sort of half the passes): equal rows form contiguous
   runs; the stable order makes every sum below deterministic. ``_sorted_operands_kernel``
   then lays the ids' operands out in sorted order: each row's start in the weights, its D,
   the output-gradient row its bag reads, the factor.
3. ``torch.searchsorted``: where each class of tables (rows of one power-of-two tile,
   numbered one class after another by the module) begins among the sorted ids.
4. ``_chunk_kernel``, per class: chunks of CHUNK sorted ids, each with a halo of CHUNK
   more, gathered at once and summed per run by a segmented scan; every run that starts
   in the chunk and ends by the halo's end is updated there, a longer one is listed.
5. ``_segment_kernel`` and ``_group_kernel`` (twice), per class: the sums of the long
   runs over the segments (SEGMENT ids), groups and supergroups they enter.
6. ``_long_run_kernel``, per class: each long run, a program each, adds its ids up to
   its first segment's end and the sums it covers, FAN_IN a step, and updates its row.
   Memory beyond the sorted operands: one fp32 row (of the widest tile) per segment,
   and 1/FAN_IN of that per level above (8 bytes per id at D=128).

Steps 4 to 6 are the chunk design (``RunsLaunch.design == "chunks"``), in
``tbe_plugin.ops.backward_runs``, their sizes in ``backward_launch``. The default design,
``pieces``, replaces them with ``tbe_plugin.ops.backward_pieces`` (runs cut into pieces at
multiples of ``piece_ids``, a piece a lane, partials of longer runs by a fixed tree;
``pieces_launch``). The optimizer update itself
(``optimizers.apply_update``) sees each touched row once per step with its exact
aggregated gradient, as FBGEMM's exact optimizers do.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_launch import CHUNK_MODES, MAX_CLASSES, RunsLaunch, block_d_of, runs_launch
from tbe_plugin.ops.backward_runs import (
    _chunk_kernel,
    _grad_pointer,
    _group_kernel,
    _listed_chunks_kernel,
    _long_run_kernel,
    _segment_kernel,
)
from tbe_plugin.ops.common import Pooling, cdiv, next_power_of_2
from tbe_plugin.ops.hot_product import hot_step, mean_bag_scale
from tbe_plugin.ops.hot_split import compact_kept, hot_applies, hot_choice, split_applies, split_hot
from tbe_plugin.ops.radix_sort import sort_pairs
from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_DIM,
    _META_OUT_OFFSET,
    _META_ROW_BASE,
    _META_WEIGHT_OFFSET,
)
from tbe_plugin.ops.optimizers import OptimizerArgs
from tbe_plugin.ops.backward_pieces import _marks_at
from tbe_plugin.ops.pieces_launch import (
    MARKS_BLOCK,
    PieceMarks,
    _launch_pieces,
    mark_counts,
    piece_marks,
    short_ids,
)
from tbe_plugin.ops.positions import (
    POSITIONS_BLOCK,
    POSITIONS_WARPS,
    ForwardPositions,
    _positions_kernel,
    bag_length,
    merged_positions,
    positions_window,
    repair_positions,
)
from tbe_plugin.ops.update_operands import _cell_argument, _multiprocessors, _update_operands


@triton.jit
def _sorted_operands_kernel(
    perm_ptr, sorted_rows_ptr, bag_ptr, scale_ptr, feature_meta_ptr,
    sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    B, grad_stride, num_indices, sentinel, flags_ptr, counts_ptr, total_rows,
    UNPOOLED: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr,
    SORTED_BAGS: tl.constexpr = False, PACKED: tl.constexpr = False,
    MARKS: tl.constexpr = False, PIECE: tl.constexpr = 1, SHORT: tl.constexpr = 0, LEAN: tl.constexpr = False,
):  # fmt: skip
    """Per sorted id, what the update kernel needs, stored contiguously in sorted order:
    where its row starts in the flat weights, its D, its output-gradient row (from its bag:
    bag b of a feature reads row b, unpooled id p row p) and its factor. ``perm``: each
    sorted id's position; with SORTED_BAGS (pooled, unscaled) its bag instead, sorted with
    the rows (``radix_sort``): read in order, no gather. PACKED (``positions.merged_positions``):
    ``bag_ptr`` holds an int64 a position, its bag in the low 32 bits and its factor's bits in
    the high 32: one gather of 8 bytes (one sector) for both. MARKS (``RunsLaunch.
    marks_in_operands``; a grid over num_indices + 1 positions, BLOCK the marks kernel's):
    the pieces design's marks too (``backward_pieces._marks_at``: the valid ids are those of
    rows below ``total_rows``), a byte a position at ``flags_ptr`` (bits: piece, multi run,
    short run, head) and the block's counts at ``counts_ptr`` (``pieces_launch.mark_counts``'
    layout), so that the marks kernel runs once, from them. LEAN (``RunsLaunch.lean_operands``,
    without MARKS): the row's start and D only where a piece may start (a head or a multiple
    of PIECE); the gradient offset is stored as ``sorted_grad_offset_ptr``'s type (int32 when
    every offset fits)."""
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(sorted_rows_ptr + q, mask=q < num_indices, other=sentinel)
    if MARKS:
        # The valid ids end where the rows reach total_rows (sorted: the sentinels after them).
        inside = (q < num_indices) & (row < total_rows)
        prev = tl.load(sorted_rows_ptr + q - 1, mask=(q > 0) & (q <= num_indices), other=-2)
        at_end = (q <= num_indices) & ~inside & ((q == 0) | (prev < total_rows))
        head, piece, multi, short = _marks_at(sorted_rows_ptr, q, row, prev, inside, at_end, num_indices, PIECE,
                                              SHORT)  # fmt: skip
        flags = piece.to(tl.int8) + 2 * multi.to(tl.int8) + 4 * short.to(tl.int8) + 8 * head.to(tl.int8)
        tl.store(flags_ptr + q, flags, mask=q <= num_indices)
        block, blocks = tl.program_id(0), tl.num_programs(0)
        tl.store(counts_ptr + block, tl.sum(piece.to(tl.int32), axis=0))
        tl.store(counts_ptr + blocks + block, tl.sum(multi.to(tl.int32), axis=0))
        if SHORT > 0:
            tl.store(counts_ptr + 2 * blocks + block, tl.sum(short.to(tl.int32), axis=0))
    valid = row != sentinel
    if SORTED_BAGS:
        p = q  # unused: pooled and unscaled
        bag = tl.load(perm_ptr + q, mask=valid, other=0)
    elif PACKED:
        p = tl.load(perm_ptr + q, mask=valid, other=0)
        packed = tl.load(bag_ptr + p, mask=valid, other=0)
        bag = (packed & 0xFFFFFFFF).to(tl.int32)
        factor = (packed >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        p = tl.load(perm_ptr + q, mask=valid, other=0)
        bag = tl.load(bag_ptr + p, mask=valid, other=0)  # int32 below 2**31 bags: 32-bit division
    feature = bag // B
    meta = feature_meta_ptr + feature.to(tl.int64) * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    local = row - tl.load(meta + _META_ROW_BASE, mask=valid, other=0)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET, mask=valid, other=0) + local * dim
    # With the marks, the row's start and D only where a piece starts (the pieces design reads
    # them nowhere else): a run's other ids write no bytes for them.
    if MARKS:
        starts = valid & piece
    elif LEAN:  # a superset of the pieces' starts (backward_pieces._marks_at): heads and grid points
        before = tl.load(sorted_rows_ptr + q - 1, mask=(q > 0) & (q < num_indices), other=-2)
        starts = valid & ((row != before) | (q % PIECE == 0))
    else:
        starts = valid
    tl.store(sorted_w_start_ptr + q, w_start, mask=starts)
    tl.store(sorted_dim_ptr + q, dim.to(tl.int32), mask=starts)
    if UNPOOLED:
        grad_offset = p * grad_stride
    else:
        b = (bag - feature * B).to(tl.int64)
        grad_offset = b * grad_stride + tl.load(meta + _META_OUT_OFFSET, mask=valid, other=0)
    tl.store(sorted_grad_offset_ptr + q, grad_offset, mask=valid)
    if PACKED:
        tl.store(sorted_scale_ptr + q, factor, mask=valid)
    elif SCALED:
        tl.store(sorted_scale_ptr + q, tl.load(scale_ptr + p, mask=valid, other=0.0), mask=valid)


@triton.jit
def _psw_grad_kernel(
    grad_ptr, grad_stride, weights_ptr, feature_meta_ptr, rows_ptr, bag_ptr, offsets_ptr,
    out_ptr, B, num_indices, sentinel, grad_cell_ptr,
    MEAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GRAD_CELL: tl.constexpr,
):  # fmt: skip
    """d loss / d per_sample_weight[p] = <grad of p's bag, p's weight row> (/ L for MEAN)."""
    grad_ptr = _grad_pointer(grad_ptr, grad_cell_ptr, GRAD_CELL)
    p = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=sentinel)
    valid = row != sentinel
    bag = tl.load(bag_ptr + p, mask=valid, other=0).to(tl.int64)
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
        acc = tl.div_rn(acc, bag_length(offsets_ptr, bag, valid, num_indices).to(tl.float32))
    tl.store(out_ptr + p, acc, mask=p < num_indices)


SORTED_OPERANDS_BLOCK = 1024
# RunsLaunch.marks_in_operands: the sorted-operands kernel counts the marks per block of the marks kernel's size.
assert SORTED_OPERANDS_BLOCK == MARKS_BLOCK
SORTED_OPERANDS_WARPS = 8  # 57 registers (ptxas, sm_90); 4 warps took 96 with the bag's division
PSW_CONFIG = dict(BLOCK_N=32, num_warps=8)  # 2 warps spilled 2.3 KB a thread
# Global rows are sorted as int32 below this many rows in all, int64 from there on.
INT32_KEYS_BELOW = torch.iinfo(torch.int32).max
# RunsLaunch.lean_operands: gradient offsets as int32 when the output gradient has fewer elements.
INT32_OFFSETS_BELOW = 2**31


class BackwardPlan(NamedTuple):
    """What a batch's backward needs of its ids alone (``plan_backward``): no gradient, no
    weights, no optimizer state, so that it may be computed before the gradient exists
    (the module does it in the forward, on a side stream: ``training.plan_in_forward``)."""

    sorted_operands: tuple  # (sorted rows, weight start, D, gradient offset, factor), in sorted order
    class_pos: torch.Tensor  # where each class's sorted ids begin
    marks: Optional[PieceMarks]  # the pieces design's marks (None: the chunk design)
    rows: Optional[torch.Tensor]  # each id's global row and bag, unsorted, for the per-sample
    bags: Optional[torch.Tensor]  # weights' gradient (None when it is not asked for)
    hot: Optional[tuple]  # RunsLaunch.hot_rows: (tables, hot rows, hot counts); None: off
    sentinel: int
    grad_shape: Tuple[int, int]  # the output gradient's rows and row stride it was planned for
    scaled: bool  # whether each sorted id carries a factor (MEAN, per-sample weights, merged repeats)


def plan_backward(
    feature_meta: torch.Tensor,
    total_rows: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    bounds_check: bool,
    optimizer: int,
    grad_shape: Tuple[int, int],
    launch: Optional[RunsLaunch] = None,
    classes: Optional[Sequence[int]] = None,
    max_dim: int = 0,
    graphed: bool = False,
    forward_positions: Optional[ForwardPositions] = None,
) -> BackwardPlan:
    """Steps 1 to 3 of the backward and the pieces design's marks: each id's global row,
    bag and factor, their stable sort, the sorted operands, where each class begins.
    ``grad_shape``: the rows and row stride of the output gradient to come (contiguous:
    the forward output's shape); ``classes`` and ``max_dim`` as ``backward_update``'s;
    ``graphed``: for a captured graph's batch (no hot rows); ``forward_positions``: the
    positions the forward wrote (``forward_positions_apply``), taken for step 1 where
    written. The batch must have ids and bags."""
    device = indices.device
    launch = launch or runs_launch()
    classes = classes or (block_d_of(max_dim), 0)
    num_features = feature_meta.shape[0]
    B = (offsets.numel() - 1) // num_features
    N = indices.numel()
    total_bags = num_features * B
    key_dtype = sort_key_dtype(total_rows)
    radix = launch.radix_sort and key_dtype == torch.int32 and N < 2**31
    # Ids outside every bag: sorted last, skipped. The radix sort sorts only the bits that
    # hold every row and the sentinel, the least all-ones value above the rows.
    key_bits = max(1, int(total_rows).bit_length())
    sentinel = (1 << key_bits) - 1 if radix else torch.iinfo(key_dtype).max
    mean = pooling == Pooling.MEAN
    weighted = per_sample_weights is not None
    scaled = mean or weighted
    bag_dtype = torch.int32 if total_bags < 2**31 else torch.int64
    # Each feature's hottest rows summed apart (RunsLaunch.hot_rows), where it applies; with
    # hot_split the other ids compacted before the sort.
    hot = launch.hot_rows if hot_applies(launch, pooling, weighted, graphed, N) else 0
    kept_counts = None  # each block's count of the ids the split leaves, where the split kernel ran
    split = bool(hot) and split_applies(launch, device)
    early = forward_positions.hot if forward_positions is not None else None  # chosen beside the lookup
    if hot and early is not None and early[3].shape[1] == hot:
        tables, hot_rows, feature_hot_rows, hot_counts = early
    else:
        tables, hot_rows, feature_hot_rows, hot_counts = hot_choice(feature_meta, indices, offsets, B, hot,
                                                                    launch.hot_sample, bounds_check, total_rows)
    if forward_positions is not None and forward_positions.written:
        # Step 1 from the forward (RunsLaunch.forward_positions; forward_merge: a bag's repeats
        # merged in place, the bag and factor packed); rewritten here where the offsets are irregular.
        if forward_positions.rows.dtype != key_dtype or forward_positions.sentinel != sentinel or radix or (
                hot and forward_positions.merge) or (scaled and not forward_positions.merge):
            raise ValueError("plan_backward: forward_positions were made for another key type or sort")
        rows, bags = forward_positions.rows, forward_positions.bags
        repair_positions(feature_meta, indices, offsets, B, total_bags, mean, bounds_check, rows, bags)
        if forward_positions.merge:  # the bag and factor packed
            N, scaled, scale, packed = rows.numel(), True, bags, True
        else:  # (SUM without per-sample weights: no factor)
            packed, scale = False, torch.empty(1, dtype=torch.float32, device=device)
        if hot:  # the hot ids counted and given the sentinel row, in place (RunsLaunch.hot_split)
            kept_counts = split_hot(rows, bags, feature_hot_rows, hot_counts, B, sentinel)
    elif _merge_applies(launch, pooling, psw_requires_grad, graphed, radix, hot, total_bags, N, device):
        # Repeats of a row in a bag merged (RunsLaunch.merge_repeats): fewer ids, each scaled.
        rows, bags = merged_positions(feature_meta, indices, offsets, per_sample_weights, B, total_bags, key_dtype,
                                      mean, bounds_check, launch.merge_repeats, compact=launch.merge_compact,
                                      sentinel=sentinel)  # fmt: skip
        N, scaled, scale, packed = rows.numel(), True, bags, True  # the bags' int64 hold their factors
    else:
        packed = False
        rows = torch.empty(N, dtype=key_dtype, device=device)  # every position written (the sentinel outside bags)
        bags = torch.empty(N, dtype=bag_dtype, device=device)
        scale = torch.empty(N if scaled else 1, dtype=torch.float32, device=device)
        psw = per_sample_weights if weighted else scale
        window = positions_window(offsets, N, POSITIONS_BLOCK)
        _positions_kernel[(window.numel() - 1,)](
            feature_meta, indices, offsets, window, psw, rows, bags, scale, B, total_bags, N, sentinel,
            rows if feature_hot_rows is None else feature_hot_rows, rows if hot_counts is None else hot_counts,
            MEAN=mean, WEIGHTED=weighted, CHECK=bounds_check, BLOCK=POSITIONS_BLOCK, HOT=hot,
            LOG_HOT=hot.bit_length() - 1 if hot else 0, num_warps=POSITIONS_WARPS,
        )  # fmt: skip
    if split:  # only the ids left go on (one host read of their count)
        rows, bags, kept_scale = compact_kept(rows, bags, scale if scaled and not packed else None, sentinel,
                                              kept_counts)  # fmt: skip
        N, scale = rows.numel(), scale if kept_scale is None else kept_scale
    # With the radix sort, the sorted ids carry their bag (pooled, unscaled: all the update
    # needs of an id) or their int32 position.
    sorted_bags = radix and pooling != Pooling.NONE and not scaled
    if sorted_bags:
        sorted_rows, perm = sort_pairs(rows, bags, key_bits, launch.radix_sizes)
    elif radix:
        positions = torch.arange(N, dtype=torch.int32, device=device)
        sorted_rows, perm = sort_pairs(rows, positions, key_bits, launch.radix_sizes)
    else:
        sorted_rows, perm = torch.sort(rows, stable=True)
    sorted_w_start = torch.empty(N, dtype=torch.int64, device=device)
    sorted_dim = torch.empty(N, dtype=torch.int32, device=device)
    # RunsLaunch.lean_operands: int32 gradient offsets where every offset of the gradient fits.
    lean = launch.lean_operands  # (the pieces design's: RunsLaunch checks)
    offset_dtype = torch.int32 if lean and grad_shape[0] * grad_shape[1] < INT32_OFFSETS_BELOW else torch.int64
    sorted_grad_offset = torch.empty(N, dtype=offset_dtype, device=device)
    sorted_scale = torch.empty(N if scaled else 1, dtype=torch.float32, device=device)
    # The pieces design's marks found here too (RunsLaunch.marks_in_operands): the marks kernel then runs once.
    in_operands = launch.marks_in_operands and launch.design == "pieces"
    short = short_ids(launch, optimizer, pooling != Pooling.NONE, N) if in_operands else 0
    if in_operands:
        flags, counts = torch.empty(N + 1, dtype=torch.int8, device=device), mark_counts(N, short, device)
    else:
        flags = counts = sorted_dim  # never read: no allocation on the default path
    _sorted_operands_kernel[(cdiv(N + 1 if in_operands else N, SORTED_OPERANDS_BLOCK),)](
        perm, sorted_rows, bags, scale, feature_meta, sorted_w_start, sorted_dim, sorted_grad_offset, sorted_scale,
        B, grad_shape[1], N, sentinel, flags, counts, total_rows, UNPOOLED=pooling == Pooling.NONE, SCALED=scaled,
        BLOCK=SORTED_OPERANDS_BLOCK, SORTED_BAGS=sorted_bags, PACKED=packed, MARKS=in_operands,
        PIECE=launch.piece_ids, SHORT=short, LEAN=lean and not in_operands, num_warps=SORTED_OPERANDS_WARPS,
    )  # fmt: skip
    sorted_operands = (sorted_rows, sorted_w_start, sorted_dim, sorted_grad_offset, sorted_scale)
    # Where each class's sorted ids begin (one search per class: the ids are sorted).
    class_pos = torch.searchsorted(sorted_rows, _class_rows(classes, total_rows, sorted_rows.dtype, device))
    marks = None
    if launch.design == "pieces":
        marks = piece_marks(sorted_operands, class_pos, len(classes) // 2, launch, optimizer,
                            pooling != Pooling.NONE, scaled, *grad_shape,
                            flags=(flags, counts) if in_operands else None)  # fmt: skip
    kept = (rows, bags) if psw_requires_grad else (None, None)
    return BackwardPlan(sorted_operands, class_pos, marks, *kept, (tables, hot_rows, hot_counts) if hot else None,
                        sentinel, tuple(grad_shape), scaled)  # fmt: skip


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
    launch: Optional[RunsLaunch] = None,
    classes: Optional[Sequence[int]] = None,
    grad_cell: Optional[torch.Tensor] = None,
    plan: Optional[BackwardPlan] = None,
) -> Optional[torch.Tensor]:
    """Applies one optimizer step to every row the batch touched; returns the gradient
    of ``per_sample_weights`` when asked (computed from the weights before the step).

    ``align``: a power of two dividing every table's D (``vector_alignment``): rows of the
    weights, the output gradient and element-wise state start at its multiples.
    ``momentum1``/``momentum2`` are laid out as the module keeps them: element-wise state
    exactly like the flat weights, row-wise state one value per global row. ``launch``:
    the per-run kernels' sizes (``runs_launch()`` when None). ``classes``: (BLOCK_D, first
    global row) of each class of tables, flat, classes in row order (one class of the
    widest tile when None: then rows may be numbered in any order). ``grad_cell``: an int64
    device tensor whose first element is the address the kernels read the output gradient
    at (a captured graph's, ``backward_graphs``; ``grad_output`` then gives its shape, strides
    and type only), pieces design only. ``plan``: this batch's ``plan_backward``, made
    earlier with the same arguments (made here when None or made for another gradient
    layout)."""
    device = weights.device
    num_features = feature_meta.shape[0]
    B = (offsets.numel() - 1) // num_features
    N = indices.numel()
    if N == 0 or B == 0:
        return torch.zeros(N, dtype=torch.float32, device=device) if psw_requires_grad else None
    grad_output = grad_output.contiguous()
    launch = launch or runs_launch()
    if grad_cell is not None and launch.design != "pieces":
        raise ValueError(f"backward_update: grad_cell is for the pieces design, not {launch.design!r}")
    classes = classes or (block_d_of(max_dim), 0)
    grad_shape = (grad_output.shape[0], grad_output.stride(0))
    # A plan made for another gradient layout (a one-row gradient may keep any row stride)
    # or without the rows the per-sample weights' gradient reads is made again.
    if plan is not None and (plan.grad_shape != grad_shape or (psw_requires_grad and plan.rows is None)):
        plan = None
    if plan is None:
        plan = plan_backward(feature_meta, total_rows, indices, offsets, per_sample_weights, psw_requires_grad,
                             pooling, bounds_check, args.optimizer, grad_shape, launch, classes,
                             graphed=grad_cell is not None)  # fmt: skip
    mean = pooling == Pooling.MEAN
    if plan.hot is not None:
        tables, hot_rows, hot_counts = plan.hot
        hot_step(grad_output, weights, momentum1, momentum2, step, feature_meta, tables, hot_rows, hot_counts, args,
                 align, total_rows, max_dim, mean_bag_scale(offsets, N) if mean else None,
                 launch.hot_tf32x3)  # fmt: skip
    psw_grad = None
    if psw_requires_grad:
        psw_grad = torch.empty(N, dtype=torch.float32, device=device)
        block_d = max(16, next_power_of_2(max_dim))
        _psw_grad_kernel[(cdiv(N, PSW_CONFIG["BLOCK_N"]),)](
            grad_output, grad_output.stride(0), weights, feature_meta, plan.rows, plan.bags, offsets,
            psw_grad, B, N, plan.sentinel, _cell_argument(grad_cell, grad_output), MEAN=mean,
            BLOCK_D=min(block_d, 128), GRAD_CELL=grad_cell is not None, **PSW_CONFIG,
        )  # fmt: skip
    while grad_output.stride(0) % align:
        align //= 2
    _launch_runs(grad_output, plan, weights, momentum1, momentum2, step, args, align, total_rows, classes, launch,
                 grad_cell)  # fmt: skip
    return psw_grad


_CLASS_ROWS: dict = {}


def sort_key_dtype(total_rows: int) -> torch.dtype:
    """The dtype of the sort's keys (global rows and the sentinel) for ``total_rows`` rows."""
    return torch.int32 if total_rows < INT32_KEYS_BELOW else torch.int64


def forward_positions_apply(launch: RunsLaunch, pooling: int, weighted: bool, psw_requires_grad: bool,
                            num_ids: int, total_bags: int) -> bool:  # fmt: skip
    """Whether the training forward may write this batch's positions (``RunsLaunch.
    forward_positions``, ``forward_merge``): SUM (MEAN with the merge, whose packed factor
    carries 1/L), no per-sample weights, ``torch.sort``, no hot rows (but split ones,
    ``hot_split``, without the forward's merge) or merge of the backward's own, fewer than
    2**31 ids and bags (a bag and a factor packed in 64 bits). The caller adds what it knows: an eager batch, its plan made in the
    forward, not a captured graph's."""
    if not (launch.forward_positions or launch.forward_merge) or pooling == Pooling.NONE or weighted:
        return False
    if psw_requires_grad or (pooling == Pooling.MEAN and not launch.forward_merge):  # (MEAN's factor: packed)
        return False
    if launch.radix_sort or launch.merge_repeats:
        return False
    if launch.hot_rows and (not launch.hot_split or launch.forward_merge):  # (the split reads int32 bags)
        return False
    return 0 < num_ids < 2**31 and total_bags < 2**31


def _merge_applies(launch: RunsLaunch, pooling: int, psw_requires_grad: bool, graphed: bool, radix: bool, hot: int,
                   total_bags: int, num_ids: int, device: torch.device) -> bool:  # fmt: skip
    """Whether ``RunsLaunch.merge_repeats`` applies: pooled (SUM or MEAN) ids whose per-sample
    weights need no gradient (it reads each id's own row and bag), an eager batch of
    ``merge_min_ids`` ids or more (not a captured graph's), ``torch.sort``, no hot rows,
    fewer than 2**31 bags; compacted (``merge_compact``), on a stream the host may wait for."""
    if not launch.merge_repeats or pooling == Pooling.NONE or psw_requires_grad or graphed or radix or hot:
        return False
    if num_ids < launch.merge_min_ids:
        return False
    if total_bags >= 2**31:  # a bag and a factor packed in 64 bits
        return False
    if not launch.merge_compact:
        return True
    return device.type != "cuda" or not torch.cuda.is_current_stream_capturing()


def _class_rows(classes: Sequence[int], total_rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The classes' first global rows and the total, as sort keys on the device (kept:
    no host-to-device copy a step)."""
    key = (tuple(classes), total_rows, dtype, str(device))
    if key not in _CLASS_ROWS:
        _CLASS_ROWS[key] = torch.tensor([*classes[1::2], total_rows], dtype=dtype, device=device)
    return _CLASS_ROWS[key]


LIST_BLOCK = 1024  # positions per program of _listed_chunks_kernel
_CLASS_CHUNKS: dict = {}


def _listed_chunks(sorted_rows, class_pos, per_class):
    """The chunks where a run starts (their first positions, class after class, in order),
    and where each class's begin among them: two passes of ``_listed_chunks_kernel``
    (count, then write at the running totals) over the sorted rows."""
    device, N = sorted_rows.device, sorted_rows.numel()
    chunk_ids = tuple(c.chunk_ids for c in per_class)
    key = (chunk_ids, str(device))
    if key not in _CLASS_CHUNKS:
        padded = list(chunk_ids) + [1] * (MAX_CLASSES - len(chunk_ids))
        _CLASS_CHUNKS[key] = torch.tensor(padded, dtype=torch.int32, device=device)
    class_chunk = _CLASS_CHUNKS[key]
    blocks = cdiv(N, LIST_BLOCK)
    counts = torch.empty(blocks, dtype=torch.int32, device=device)
    # At most one chunk per CHUNK ids of each class, plus a partial chunk per class.
    chunk_list = torch.full((N // min(chunk_ids) + len(chunk_ids) + 1,), torch.iinfo(torch.int64).max,
                            dtype=torch.int64, device=device)  # fmt: skip
    common = (sorted_rows, class_pos, class_chunk)
    _listed_chunks_kernel[(blocks,)](*common, counts, chunk_list, len(per_class), WRITE=False, BLOCK=LIST_BLOCK)
    counts = torch.cumsum(counts, 0, dtype=torch.int32)
    _listed_chunks_kernel[(blocks,)](*common, counts, chunk_list, len(per_class), WRITE=True, BLOCK=LIST_BLOCK)
    return chunk_list, torch.searchsorted(chunk_list, class_pos)


def _launch_runs(grad_output, plan, weights, momentum1, momentum2, step, args, align, total_rows, classes, launch,
                 grad_cell) -> None:  # fmt: skip
    """Steps 4 to 6 (``backward_runs``) on the batch's ``plan_backward``: per class of
    tables, the chunks; then per class the long runs' segment and group sums and the long
    runs themselves."""
    sorted_operands, scaled = plan.sorted_operands, plan.scaled
    sorted_rows = sorted_operands[0]
    device, N = weights.device, sorted_rows.numel()
    block_ds = list(classes[0::2])
    if len(block_ds) > MAX_CLASSES:
        raise ValueError(f"{len(block_ds)} classes of row tiles; at most {MAX_CLASSES}")
    class_pos = plan.class_pos
    per_class = [launch.for_block_d(bd) for bd in block_ds]
    if launch.design == "pieces":
        class_rows = [b - a for a, b in zip(classes[1::2], [*classes[3::2], total_rows])]
        _launch_pieces(grad_output, sorted_operands, weights, momentum1, momentum2, step, args, scaled, align,
                       class_pos, per_class, class_rows, launch, plan.marks, grad_cell)  # fmt: skip
        return
    segment, fan_in = launch.segment_ids, launch.fan_in
    long_count = torch.zeros(MAX_CLASSES, dtype=torch.int32, device=device)
    # A long run outlasts its chunk and halo: at most one per CHUNK + 2 ids.
    long_runs = torch.empty(N // (min(c.chunk_ids for c in per_class) + 2) + 1, dtype=torch.int64, device=device)
    stride = max(block_ds)
    slots = [cdiv(N, unit) + len(block_ds) + 1 for unit in (segment, segment * fan_in, segment * fan_in ** 2)]
    segment_sums, group_sums, supergroup_sums = (
        torch.empty(n * stride, dtype=torch.float32, device=device) for n in slots
    )
    step, m1, m2, hyper, modes = _update_operands(args, weights, momentum1, momentum2, step, sorted_rows, align)
    sms = _multiprocessors(device)
    mode = 2 - CHUNK_MODES.index(launch.chunk_mode_for(len(per_class)))  # the kernel's MODE: 2 list, 1 loop, 0 grid
    chunk_list, list_pos = _listed_chunks(sorted_rows, class_pos, per_class) if mode == 2 else (long_runs, class_pos)
    for klass, sizes in enumerate(per_class):
        chunks = cdiv(N, sizes.chunk_ids)
        _chunk_kernel[(min(chunks, sms * launch.chunk_programs_per_sm) if mode else chunks,)](
            grad_output, *sorted_operands, weights, m1, m2, long_runs, long_count, class_pos, chunk_list, list_pos,
            klass, step, hyper,
            SCALED=scaled, CHUNK=sizes.chunk_ids, BLOCK_D=sizes.block_d, MODE=mode,
            HALO=sizes.chunk_ids if launch.chunk_halo else 0, BARRIER=sizes.chunk_warps > 1,
            num_warps=sizes.chunk_warps, **modes,
        )  # fmt: skip
    if N <= 2 * min(c.chunk_ids for c in per_class):
        return  # every run ends by its chunk's halo: none is long
    batch = launch.batch
    loop_grid = (min(cdiv(N, segment * batch), sms * launch.loop_programs_per_sm),)
    for klass, sizes in enumerate(per_class):
        if N > segment:
            _segment_kernel[loop_grid](
                grad_output, sorted_rows, *sorted_operands[2:], segment_sums, class_pos, klass, stride,
                SCALED=scaled, BLOCK_D=sizes.block_d, CHUNK=sizes.chunk_ids, SEGMENT=segment, STEP=sizes.step_ids,
                ALIGN=align, BATCH=batch, num_warps=sizes.loop_warps,
            )  # fmt: skip
        for level, (children, parents) in enumerate(((segment_sums, group_sums), (group_sums, supergroup_sums))):
            unit = segment * fan_in**level
            if N > unit * fan_in:
                _group_kernel[loop_grid](
                    sorted_rows, children, parents, class_pos, klass, unit, stride,
                    BLOCK_D=sizes.block_d, CHUNK=sizes.chunk_ids, FAN_IN=fan_in, BATCH=batch,
                    num_warps=sizes.loop_warps,
                )  # fmt: skip
        _long_run_kernel[(sms * launch.loop_programs_per_sm,)](
            grad_output, *sorted_operands, weights, m1, m2, segment_sums, group_sums, supergroup_sums, long_runs,
            long_count, class_pos, klass, stride, step, hyper,
            SCALED=scaled, BLOCK_D=sizes.block_d, SEGMENT=segment, STEP=sizes.step_ids, FAN_IN=fan_in,
            num_warps=sizes.loop_warps, **modes,
        )  # fmt: skip
