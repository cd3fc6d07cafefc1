"""A pooled forward with a warp per bag and each id held by one lane (``FLAT`` 3 in a launch
config; ``FLAT`` 4: the same with ``_lean_rows``, one bag a program, the heuristic's tile for
non-bf16 128-column rows in bags of more than 12 ids: ``embedding_forward.WARP_TILES``).

The lockstep kernel (``embedding_forward._pooled_forward_kernel``) reads a [BLOCK_L, BAGS,
BLOCK_D] tile of rows a step; Triton lays its threads along the columns, so every thread
holds every row's id and 64-bit address: at (16, 2, 128) 255 registers a thread and 12%
occupancy on the H200 (Nsight Compute, ``results/ncu_h200_b8c7017_ctr_dlrm_forward.txt``),
against FBGEMM's 32 registers and 86%. Here a program is BAGS warps, a bag each: a bag's
next 32 ids are loaded one a lane, and row j's id reaches every lane of the warp through
``tl.gather`` along the lane axis (a warp shuffle, not a per-thread copy of all 32 ids);
UNROLL rows are in flight a warp, so registers stay few and occupancy high, as in FBGEMM's
forward.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_ROW_BASE,
    _checked_bag_bounds,
    _checked_ids,
    _mean_factors,
    _pooled_column_block,
)
from tbe_plugin.ops.positions import pack_bag_factor

LANES = 32  # ids loaded a round, one a lane


@triton.jit
def _count_repeats(repeat, count, ids, row, lane, j, valid):
    """A round's repeats so far, given row j's id ``row`` broadcast to every lane (``valid``:
    row j is in its bag): lane i is a repeat when an earlier row of the round holds its id,
    and ``count`` is how many of the round's rows hold it."""
    same = (ids == row) & valid
    return repeat | (same & (lane > j)), count + same.to(tl.int32)


@triton.jit
def _round_repeats(ids, r0, length, n_rows, lane, BAGS: tl.constexpr):
    """``_count_repeats`` over a round's rows in a loop of its own (for long unrolled row
    loops, whose registers the counting inline would double: 64 -> 165 at UNROLL 32, sm_90)."""
    repeat = tl.zeros_like(ids) != 0
    count = tl.zeros_like(ids)
    for j in range(0, n_rows):
        row = tl.gather(ids, tl.full((BAGS, 1), 0, tl.int32) + j, axis=1)
        repeat, count = _count_repeats(repeat, count, ids, row, lane[None, :], j, ((r0 + j) < length)[:, None])
    return repeat, count


@triton.jit
def _warp_rows(acc, weights_ptr, ids, w_round, r0, length, n_rows, weight_offset, dim, cols, col_mask, repeat, count,
               lane, WEIGHTED: tl.constexpr, ALIGN: tl.constexpr, BAGS: tl.constexpr, UNROLL: tl.constexpr,
               REPEATS: tl.constexpr):  # fmt: skip
    """Adds to ``acc`` ([BAGS, BLOCK_D]) the rows of a round's ``ids`` ([BAGS, ROUND], an id a
    lane; positions r0.. of each bag), the first ``n_rows`` of them, one row after another.
    REPEATS: also each lane's repeat flag and count in the round (``_count_repeats``)."""
    for j0 in range(0, n_rows, UNROLL):
        for u in tl.static_range(UNROLL):
            j = j0 + u
            which = tl.full((BAGS, 1), 0, tl.int32) + j
            row = tl.gather(ids, which, axis=1)  # [BAGS, 1]: row j's id, from the lane holding it
            valid = (r0 + j) < length  # [BAGS]
            row_start = (weight_offset // ALIGN + row.to(tl.int64) * (dim // ALIGN)) * ALIGN
            vals = tl.load(weights_ptr + row_start + cols[None, :], mask=valid[:, None] & col_mask[None, :],
                           other=0.0).to(tl.float32)  # fmt: skip
            if WEIGHTED:
                vals = vals * tl.gather(w_round, which, axis=1)
            acc += vals
            if REPEATS:
                repeat, count = _count_repeats(repeat, count, ids, row, lane[None, :], j, valid[:, None])
    return acc, repeat, count


@triton.jit
def _lean_row(weights_ptr, ids, w_round, j, base, vectors, cols, mask, WEIGHTED: tl.constexpr, ALIGN: tl.constexpr):
    """Row j of a round (an id a lane) in fp32, [1, BLOCK_D], and its id ([1, 1]): its start
    a 32 x 32 -> 64-bit unsigned multiply (ids are rows of their table, below 2**31);
    ``mask`` None loads it whole (FULL: every column block is a whole row)."""
    which = tl.full((1, 1), 0, tl.int32) + j
    row = tl.gather(ids, which, axis=1)  # [1, 1]: row j's id, from the lane holding it
    row_start = (base + (row.to(tl.uint32).to(tl.uint64) * vectors).to(tl.int64)) * ALIGN
    if mask is None:
        vals = tl.load(weights_ptr + row_start + cols[None, :]).to(tl.float32)
    else:
        vals = tl.load(weights_ptr + row_start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if WEIGHTED:  # the weight as a scalar: a [1, 1] operand moved each row through shared memory
        vals = vals * tl.sum(tl.gather(w_round, which, axis=1))
    return vals, row


@triton.jit
def _lean_rows(acc, weights_ptr, ids, w_round, n_rows, weight_offset, dim, cols, col_mask, repeat, count, lane,
               WEIGHTED: tl.constexpr, ALIGN: tl.constexpr, UNROLL: tl.constexpr, FULL: tl.constexpr,
               REPEATS: tl.constexpr):  # fmt: skip
    """``_warp_rows`` for one bag a program (BAGS 1), with fewer instructions a row: the rows
    before the last group of UNROLL are all in the bag, so their loads carry no row mask
    (and no mask at all with FULL); the last group's rows are masked by a 32-bit count. The
    same rows added in the same order: the same bits as ``_warp_rows``."""
    n_rows = n_rows.to(tl.int32)
    n_full = n_rows // UNROLL * UNROLL
    vectors = (dim // ALIGN).to(tl.uint32).to(tl.uint64)  # a row's length in ALIGN-element vectors
    base = weight_offset // ALIGN
    for j0 in range(0, n_full, UNROLL):
        for u in tl.static_range(UNROLL):
            vals, row = _lean_row(weights_ptr, ids, w_round, j0 + u, base, vectors, cols,
                                  None if FULL else col_mask[None, :], WEIGHTED, ALIGN)  # fmt: skip
            acc += vals
            if REPEATS:
                repeat, count = _count_repeats(repeat, count, ids, row, lane[None, :], j0 + u, (j0 + u) < n_rows)
    for j0 in range(n_full, n_rows, UNROLL):  # the last group, part in the bag
        for u in tl.static_range(UNROLL):
            vals, row = _lean_row(weights_ptr, ids, w_round, j0 + u, base, vectors, cols,
                                  ((j0 + u) < n_rows) & col_mask[None, :], WEIGHTED, ALIGN)  # fmt: skip
            acc += vals
            if REPEATS:
                repeat, count = _count_repeats(repeat, count, ids, row, lane[None, :], j0 + u, (j0 + u) < n_rows)
    return acc, repeat, count


@triton.jit
def _warp_round(indices_ptr, per_sample_weights_ptr, status_ptr, start, length, r0, rows, lane,
                CHECK: tl.constexpr, WEIGHTED: tl.constexpr):  # fmt: skip
    """A round of ids ([BAGS, ROUND], positions r0.. of each bag; as int32: rows within a
    table fit) and their per-sample weights (the ids again when not WEIGHTED: unused)."""
    pos = start[:, None] + r0 + lane[None, :]  # [BAGS, ROUND]: a bag a warp, an id a lane
    in_bag = (r0 + lane)[None, :] < length[:, None]
    ids = _checked_ids(indices_ptr, pos, in_bag, rows, status_ptr, CHECK).to(tl.int32)
    w_round = ids
    if WEIGHTED:
        w_round = tl.load(per_sample_weights_ptr + pos, mask=in_bag, other=0.0).to(tl.float32)
    return ids, w_round, pos, in_bag


@triton.jit
def _store_positions(rows_out_ptr, bags_out_ptr, ids, pos, in_bag, repeat, count, row_base, bag, length,
                     sentinel, MEAN: tl.constexpr, MERGE: tl.constexpr):  # fmt: skip
    """The backward's first step for a round (``embedding_backward.plan_backward``): each
    position's global row and its bag (int32). MERGE (as ``positions.merged_positions`` in
    place writes it): the ``sentinel`` row for a repeat of an earlier id of its round and,
    for the others, the bag and factor packed in one int64 (the round's count of the id,
    times 1/L for MEAN)."""
    bags = bag[:, None] + tl.zeros_like(ids)
    if MERGE:
        keep = in_bag & ~repeat
        row = tl.where(keep, row_base + ids.to(tl.int64), sentinel)
        tl.store(rows_out_ptr + pos, row.to(rows_out_ptr.dtype.element_ty), mask=in_bag)
        factor = count.to(tl.float32)
        if MEAN:
            factor = factor * tl.div_rn(1.0, tl.maximum(length, 1).to(tl.float32))[:, None]
        tl.store(bags_out_ptr + pos, pack_bag_factor(bags, factor), mask=keep)
    else:
        tl.store(rows_out_ptr + pos, (row_base + ids.to(tl.int64)).to(rows_out_ptr.dtype.element_ty), mask=in_bag)
        tl.store(bags_out_ptr + pos, bags.to(tl.int32), mask=in_bag)


@triton.jit
def _warp_store(out_ptr, acc, b, b_mask, length, out_stride, out_col, cols, col_mask, MEAN: tl.constexpr):
    """A group's sums (MEAN: times 1/L) into its bags' output rows."""
    if MEAN:
        acc = acc * _mean_factors(length)[:, None]
    out_ptrs = out_ptr + b[:, None].to(tl.int64) * out_stride + out_col + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=b_mask[:, None] & col_mask[None, :])


@triton.jit
def _warp_pooled_forward_kernel(
    weights_ptr,
    feature_meta_ptr,
    work_ptr,
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
    ALIGN: tl.constexpr,
    BAGS: tl.constexpr,  # bags a program at once, a warp each (num_warps == BAGS)
    UNROLL: tl.constexpr,  # rows read at once a warp
    BLOCK_D: tl.constexpr,
    DIRECT: tl.constexpr,
    ROUND: tl.constexpr,  # ids a bag loaded a round (32: one a lane)
    LEAN: tl.constexpr = False,  # BAGS 1 only: _lean_rows
    FULL: tl.constexpr = False,  # LEAN only: every column block is a whole row (D == BLOCK_D, DIRECT)
    rows_out_ptr=None,  # POSITIONS: each position's global row (``_store_positions``)
    bags_out_ptr=None,  # POSITIONS: its bag (int32); MERGE: bag and factor, packed (int64)
    sentinel=0,  # MERGE: the row of a repeat
    POSITIONS: tl.constexpr = False,  # the backward's positions (``_store_positions``)
    MERGE: tl.constexpr = False,  # POSITIONS: a round's repeats merged
):
    pid_bag = tl.program_id(0)
    feature, d_start, weight_offset, rows, dim, out_col = _pooled_column_block(
        feature_meta_ptr, work_ptr, tl.program_id(1), ALIGN, BLOCK_D, DIRECT
    )
    cols = d_start + tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    lane = tl.arange(0, ROUND)
    out_stride = out_stride // ALIGN * ALIGN
    b = pid_bag * BAGS + tl.arange(0, BAGS)
    b_mask = b < B
    start, end = _checked_bag_bounds(offsets_ptr, feature * B + b, b_mask, num_indices, total_bags, status_ptr,
                                     CHECK)  # fmt: skip
    length = end - start
    max_len = tl.max(length, axis=0)
    acc = tl.zeros((BAGS, BLOCK_D), dtype=tl.float32)
    row_base = 0
    if POSITIONS:
        row_base = tl.load(feature_meta_ptr + feature * _META_COLS + _META_ROW_BASE)
    for r0 in range(0, max_len, ROUND):
        ids, w_round, pos, in_bag = _warp_round(indices_ptr, per_sample_weights_ptr, status_ptr, start, length, r0,
                                                rows, lane, CHECK, WEIGHTED)  # fmt: skip
        repeat = tl.zeros_like(ids) != 0  # none yet
        count = tl.zeros_like(ids)
        n_rows = tl.minimum(max_len - r0, ROUND)
        INLINE: tl.constexpr = MERGE and UNROLL <= 8  # repeats counted as the rows are read
        if LEAN:
            acc, repeat, count = _lean_rows(acc, weights_ptr, ids, w_round, n_rows, weight_offset, dim, cols, col_mask,
                                            repeat, count, lane, WEIGHTED, ALIGN, UNROLL, FULL, INLINE)  # fmt: skip
        else:
            acc, repeat, count = _warp_rows(acc, weights_ptr, ids, w_round, r0, length, n_rows, weight_offset, dim,
                                            cols, col_mask, repeat, count, lane, WEIGHTED, ALIGN, BAGS, UNROLL,
                                            INLINE)  # fmt: skip
        if MERGE and not INLINE:
            repeat, count = _round_repeats(ids, r0, length, n_rows, lane, BAGS)
        if POSITIONS:
            if d_start == 0:  # the program of the bags' first column block
                _store_positions(rows_out_ptr, bags_out_ptr, ids, pos, in_bag, repeat, count, row_base,
                                 feature * B + b, length, sentinel, MEAN, MERGE)  # fmt: skip
    _warp_store(out_ptr, acc, b, b_mask, length, out_stride, out_col, cols, col_mask, MEAN)
