"""The pooled forward over a program's ids as one flat range (``FLAT`` launch configs).

``embedding_forward._pooled_forward_kernel`` reads its BAGS bags in lockstep: step s reads
ids s*BLOCK_L .. of every bag, so a program takes as many steps as its longest bag needs,
and on Poisson bags of mixed means most of its slots are masked (slots used at (16 bags, 2
ids a step): 76% on the end-to-end tables, 66% on ctr-mix; CPU count on
``workloads.generate_batch``). The BAGS bags of a program are consecutive bags of one
feature, so their ids are one contiguous range of ``indices``: this kernel steps through
that range BLOCK_L ids at a time whatever the bags (97-98% of its slots used on the same
batches), and sums each step's rows per bag by a segmented scan along the step (a thread
holds a step's rows of its columns, so the scan is a sequential sum in registers: a bag's
rows are added in order, FBGEMM's order). A bag's sum is stored at its last id; the sum of
a bag still open at a step's end carries into the next step's first row. Empty bags are
stored as zeros first.

With bounds checks on, a program whose offsets needed repair (out of range, decreasing)
may have bags that are not consecutive ranges: such a program sums its bags one by one.

Measured on the H200 (6b14428, ``results/tune_forward_h200_6b14428_flat.json``): 4-7% slower
than the lockstep tiles on uniform ids of fixed length, 1.6-3.8x slower on skewed ids (the
end-to-end tables: 1.10 ms against 0.70). A launch option (FLAT, the seventh launch value);
no heuristic picks it.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.backward_runs import _segmented_add
from tbe_plugin.ops.indexing import _checked_bag_bounds, _checked_ids, _mean_factors, _pooled_column_block


@triton.jit
def _flat_pooled_forward_kernel(
    weights_ptr,
    feature_meta_ptr,
    work_ptr,  # [num_work, 2]: (feature, first column of this D-chunk)
    indices_ptr,
    offsets_ptr,
    per_sample_weights_ptr,
    marks_ptr,  # MARKS: [num_indices + 1] int32 of ``_bag_marks_kernel``
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
    BAGS: tl.constexpr,  # consecutive bags per program
    BLOCK_L: tl.constexpr,  # ids of the program's range read per step
    BLOCK_D: tl.constexpr,  # columns per program
    PREFETCH: tl.constexpr,  # load the next step's ids while this step's rows are read
    DIRECT: tl.constexpr,  # a program column per feature, one column block each: no work items
    MARKS: tl.constexpr,  # where bags open and close read from marks_ptr, not found among the BAGS bounds
):
    pid_bag = tl.program_id(0)
    feature, d_start, weight_offset, rows, dim, out_col = _pooled_column_block(
        feature_meta_ptr, work_ptr, tl.program_id(1), ALIGN, BLOCK_D, DIRECT
    )
    row_stride = out_stride // ALIGN * ALIGN

    local = tl.arange(0, BAGS)
    b = pid_bag * BAGS + local
    b_mask = b < B
    bag = feature * B + b
    start, end = _checked_bag_bounds(
        offsets_ptr, bag, b_mask, num_indices, total_bags, status_ptr, CHECK
    )
    length = end - start
    cols = d_start + tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    out_dtype = out_ptr.dtype.element_ty
    empty = b_mask & (length == 0)
    tl.store(out_ptr + b[:, None].to(tl.int64) * row_stride + out_col + cols[None, :],
             tl.zeros((BAGS, BLOCK_D), dtype=out_dtype), mask=empty[:, None] & col_mask[None, :])  # fmt: skip
    repaired = 0
    if MARKS:
        repaired = tl.load(marks_ptr + num_indices)  # offsets somewhere in the batch not a valid partition
    elif CHECK:
        raw_start = tl.load(offsets_ptr + bag, mask=b_mask, other=0).to(tl.int64)
        raw_end = tl.load(offsets_ptr + bag + 1, mask=b_mask, other=0).to(tl.int64)
        repaired = tl.sum((b_mask & ((raw_start != start) | (raw_end != end))).to(tl.int32), axis=0)
    steps = tl.arange(0, BLOCK_L)
    if repaired > 0:
        _bags_one_by_one(weights_ptr, indices_ptr, per_sample_weights_ptr, out_ptr, status_ptr, start, end,
                         b_mask & (length > 0), pid_bag * BAGS, weight_offset, rows, dim, out_col, row_stride, cols,
                         col_mask, MEAN, WEIGHTED, CHECK, ALIGN, BAGS, BLOCK_L, BLOCK_D)  # fmt: skip
    else:
        # Unrepaired offsets: bag j + 1 starts where bag j ends, the bags tile [first, stop);
        # an empty bag starts where the next one does and owns no id.
        first = tl.min(tl.where(b_mask, start, num_indices), axis=0)
        stop = tl.max(tl.where(b_mask, end, 0), axis=0)
        nonempty = b_mask & (length > 0)
        if MEAN and not MARKS:
            factors = _mean_factors(length)
        carry = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if PREFETCH:
            next_ids = _checked_ids(indices_ptr, first + steps, first + steps < stop, rows, status_ptr, CHECK)
            if MARKS:
                next_marks = tl.load(marks_ptr + first + steps, mask=first + steps < stop, other=0)
        for p0 in range(first, stop, BLOCK_L):
            pos = p0 + steps
            pos_mask = pos < stop
            if PREFETCH:
                ids = next_ids
            else:
                ids = _checked_ids(indices_ptr, pos, pos_mask, rows, status_ptr, CHECK)
            vals = _gather_rows(weights_ptr, per_sample_weights_ptr, weight_offset, ids, pos, dim, cols, pos_mask,
                                col_mask, WEIGHTED, ALIGN)  # fmt: skip
            if MARKS:
                if PREFETCH:
                    marks = next_marks
                else:
                    marks = tl.load(marks_ptr + pos, mask=pos_mask, other=0)
            if PREFETCH:
                ahead = pos + BLOCK_L
                next_ids = _checked_ids(indices_ptr, ahead, ahead < stop, rows, status_ptr, CHECK)
                if MARKS:
                    next_marks = tl.load(marks_ptr + ahead, mask=ahead < stop, other=0)
            if MARKS:
                opens = marks & 1
                closes = marks >= 2
                out_b = ((marks >> 1) - 1).to(tl.int64)
            else:
                # Where each nonempty bag opens and closes in this step (an id opens at most one
                # bag and closes at most one): the bag a closing id ends names the output row.
                opens = tl.sum(((start[None, :] == pos[:, None]) & nonempty[None, :]).to(tl.int32), axis=1)
                at_end = (end[None, :] - 1 == pos[:, None]) & nonempty[None, :]
                closes = tl.sum(at_end.to(tl.int32), axis=1) > 0
                out_b = (pid_bag * BAGS + tl.sum(tl.where(at_end, local[None, :], 0), axis=1)).to(tl.int64)
            vals = vals + tl.where(steps[:, None] == 0, carry[None, :], 0.0)
            _, sums = tl.associative_scan((tl.broadcast_to(opens[:, None], (BLOCK_L, BLOCK_D)), vals), 0,
                                          _segmented_add)  # fmt: skip
            if MEAN:
                if MARKS:
                    closing = feature * B + out_b
                    bag_start = tl.load(offsets_ptr + closing, mask=closes, other=0)
                    scale = _mean_factors(tl.load(offsets_ptr + closing + 1, mask=closes, other=0) - bag_start)
                else:
                    scale = tl.sum(tl.where(at_end, factors[None, :], 0.0), axis=1)
                sums_out = sums * scale[:, None]
            else:
                sums_out = sums
            tl.store(out_ptr + out_b[:, None] * row_stride + out_col + cols[None, :], sums_out.to(out_dtype),
                     mask=(closes & pos_mask)[:, None] & col_mask[None, :])  # fmt: skip
            # The last row's bag goes on into the next step unless it closed here.
            tail = steps == BLOCK_L - 1
            closed = tl.sum((tail & closes).to(tl.int32), axis=0) > 0
            carry = tl.where(closed, 0.0, tl.sum(tl.where(tail[:, None], sums, 0.0), axis=0))


@triton.jit
def _gather_rows(weights_ptr, per_sample_weights_ptr, weight_offset, ids, pos, dim, cols, pos_mask, col_mask,
                 WEIGHTED: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """The rows of a step's ``ids`` (at ``pos``), their ``cols``, in fp32 and times their
    per-sample weights when WEIGHTED: [ids, cols], masked rows 0."""
    row_start = (weight_offset // ALIGN + ids * (dim // ALIGN)) * ALIGN
    vals = tl.load(weights_ptr + row_start[:, None] + cols[None, :],
                   mask=pos_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)  # fmt: skip
    if WEIGHTED:
        w = tl.load(per_sample_weights_ptr + pos, mask=pos_mask, other=0.0)
        vals = vals * w.to(tl.float32)[:, None]
    return vals


@triton.jit
def _bags_one_by_one(weights_ptr, indices_ptr, per_sample_weights_ptr, out_ptr, status_ptr, start, end, nonempty,
                     first_b, weight_offset, rows, dim, out_col, row_stride, cols, col_mask, MEAN: tl.constexpr,
                     WEIGHTED: tl.constexpr, CHECK: tl.constexpr, ALIGN: tl.constexpr, BAGS: tl.constexpr,
                     BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """A program's non-empty bags summed one after another, each over its own (repaired) range."""
    local = tl.arange(0, BAGS)
    steps = tl.arange(0, BLOCK_L)
    for j in range(0, BAGS):
        here = (local == j) & nonempty
        if tl.sum(here.to(tl.int32), axis=0) > 0:
            s = tl.sum(tl.where(here, start, 0), axis=0)
            e = tl.sum(tl.where(here, end, 0), axis=0)
            acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
            for p0 in range(s, e, BLOCK_L):
                pos = p0 + steps
                pos_mask = pos < e
                ids = _checked_ids(indices_ptr, pos, pos_mask, rows, status_ptr, CHECK)
                vals = _gather_rows(weights_ptr, per_sample_weights_ptr, weight_offset, ids, pos, dim, cols, pos_mask,
                                    col_mask, WEIGHTED, ALIGN)  # fmt: skip
                acc += tl.sum(vals, axis=0)
            if MEAN:
                acc = acc * _mean_factors(e - s)
            tl.store(out_ptr + (first_b + j).to(tl.int64) * row_stride + out_col + cols,
                     acc.to(out_ptr.dtype.element_ty), mask=col_mask)  # fmt: skip


@triton.jit
def _bag_marks_kernel(offsets_ptr, marks_ptr, B, total_bags, num_indices, BLOCK: tl.constexpr):
    """``marks`` (zeros on entry, ``num_indices + 1`` int32) for the flat kernel's MARKS mode:
    at a bag's first id bit 0 set, at its last id (b + 1) << 1, b the bag's output row (one
    id can carry both); ``marks[num_indices]`` set when some bag's offsets are out of range
    or decreasing (or the last does not end at ``num_indices``), where bags may overlap:
    every program then sums its bags one by one. Valid offsets partition the ids, so no two
    bags mark one id."""
    g = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = g < total_bags
    start = tl.load(offsets_ptr + g, mask=mask, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + g + 1, mask=mask, other=0).to(tl.int64)
    bad = mask & ((start < 0) | (end < start) | (end > num_indices) | ((g == total_bags - 1) & (end != num_indices)))
    if tl.sum(bad.to(tl.int32), axis=0) > 0:
        tl.atomic_max(marks_ptr + num_indices, 1)
    marked = mask & ~bad & (end > start)
    close = (((g % B) + 1) << 1).to(tl.int32)
    single = end - start == 1
    tl.store(marks_ptr + start, tl.where(single, close | 1, 1), mask=marked)
    tl.store(marks_ptr + end - 1, close, mask=marked & ~single)
