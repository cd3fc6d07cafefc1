"""Device-side helpers shared by the forward and backward kernels.

The per-feature metadata layout, and the bag-bounds and id checks that implement
``BoundsCheckMode`` inside the kernels (count into the status vector, repair as FBGEMM).

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.common import (
    NO_POSITION,
    STATUS_BAD_IDS,
    STATUS_BAD_OFFSETS,
    STATUS_FIRST_BAD_BAG,
    STATUS_FIRST_BAD_ID_POS,
)

# Columns of the per-feature metadata tensor ``feature_meta[F, META_COLS]`` (int64).
(
    META_WEIGHT_OFFSET,  # where the feature's table starts in the flat weights
    META_ROWS,  # rows of that table
    META_DIM,  # its D
    META_OUT_OFFSET,  # first output column of the feature (pooled)
    META_ROW_BASE,  # global row number of the table's row 0 (rows of all tables stacked)
    META_MOMENTUM1_OFFSET,  # where the table's momentum1 starts (rowwise or elementwise)
    META_MOMENTUM2_OFFSET,  # where the table's momentum2 starts
) = range(7)
META_COLS = 8

# Triton reads module globals only as constexpr.
_META_WEIGHT_OFFSET = tl.constexpr(META_WEIGHT_OFFSET)
_META_ROWS = tl.constexpr(META_ROWS)
_META_DIM = tl.constexpr(META_DIM)
_META_OUT_OFFSET = tl.constexpr(META_OUT_OFFSET)
_META_ROW_BASE = tl.constexpr(META_ROW_BASE)
_META_MOMENTUM1_OFFSET = tl.constexpr(META_MOMENTUM1_OFFSET)
_META_MOMENTUM2_OFFSET = tl.constexpr(META_MOMENTUM2_OFFSET)
_META_COLS = tl.constexpr(META_COLS)
_NO_POSITION = tl.constexpr(NO_POSITION)
_STATUS_BAD_IDS = tl.constexpr(STATUS_BAD_IDS)
_STATUS_FIRST_BAD_ID_POS = tl.constexpr(STATUS_FIRST_BAD_ID_POS)
_STATUS_BAD_OFFSETS = tl.constexpr(STATUS_BAD_OFFSETS)
_STATUS_FIRST_BAD_BAG = tl.constexpr(STATUS_FIRST_BAD_BAG)


@triton.jit
def _checked_bag_bounds(
    offsets_ptr, bag, bag_mask, num_indices, total_bags, status_ptr, CHECK: tl.constexpr
):
    """Start and end of each bag; with CHECK, clamped into [0, num_indices] and ordered.

    A bag whose offsets are out of range or decreasing (or, for the last bag, whose end
    is not ``num_indices``) is counted in the status vector and read as its clamped range.
    """
    start = tl.load(offsets_ptr + bag, mask=bag_mask, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=bag_mask, other=0).to(tl.int64)
    if CHECK:
        bad = (start < 0) | (end < start) | (end > num_indices)
        bad = bag_mask & (bad | ((bag == total_bags - 1) & (end != num_indices)))
        n_bad = tl.sum(bad.to(tl.int32), axis=0)
        if n_bad > 0:
            tl.atomic_add(status_ptr + _STATUS_BAD_OFFSETS, n_bad.to(tl.int64))
            first = tl.min(tl.where(bad, bag, _NO_POSITION), axis=0)
            tl.atomic_min(status_ptr + _STATUS_FIRST_BAD_BAG, first)
        # FBGEMM's repair: the last bag ends at num_indices, every start is clamped
        # into [0, N] and every end into [start, N]. (FBGEMM repairs sequentially, so
        # after a *decreasing* offset its later bags can differ from this per-bag
        # repair; both warn, and FATAL raises.)
        end = tl.where(bag_mask & (bag == total_bags - 1), num_indices, end)
        start = tl.minimum(tl.maximum(start, 0), num_indices)
        end = tl.minimum(tl.maximum(end, start), num_indices)
    return start, end


@triton.jit
def _checked_ids(indices_ptr, pos, mask, rows, status_ptr, CHECK: tl.constexpr):
    """Ids at ``pos`` as int64; with CHECK, an id outside [0, rows) is counted and read as 0."""
    ids = tl.load(indices_ptr + pos, mask=mask, other=0).to(tl.int64)
    if CHECK:
        bad = mask & ((ids < 0) | (ids >= rows))
        n_bad = tl.sum(bad.to(tl.int32))
        if n_bad > 0:
            tl.atomic_add(status_ptr + _STATUS_BAD_IDS, n_bad.to(tl.int64))
            first = tl.min(tl.where(bad, pos, _NO_POSITION))
            tl.atomic_min(status_ptr + _STATUS_FIRST_BAD_ID_POS, first)
        ids = tl.where(bad, 0, ids)
    return ids


@triton.jit
def _mean_factors(length):
    """MEAN's factor per bag: 1/L, 0 for an empty bag."""
    return tl.where(length > 0, tl.div_rn(1.0, tl.maximum(length, 1).to(tl.float32)), 0.0)


@triton.jit
def _pooled_column_block(feature_meta_ptr, work_ptr, pid_work, ALIGN: tl.constexpr, BLOCK_D: tl.constexpr,
                         DIRECT: tl.constexpr):  # fmt: skip
    """A pooled forward program's feature and columns: (feature, first column, the table's
    weight offset, rows, D, first output column). ``DIRECT``: the program column is the
    feature (one column block a feature), one dependent load fewer before the offsets.

    Values loaded from memory tell Triton nothing of their divisibility, and a load is a
    vector load only where its pointers are aligned and its mask constant over the vector:
    every D, column start and output column is a multiple of ALIGN (a column start of
    BLOCK_D), so writing them as such (no-op arithmetic) lets ``cols < dim`` hold over ALIGN
    columns and turns the row gathers from ALIGN scalar loads into one 16-byte load (sm_90
    PTX: ld.global.b32 -> ld.global.v4.b32)."""
    if DIRECT:
        feature = pid_work.to(tl.int64)
        d_start = feature * 0  # int64, as the loaded one
    else:
        feature = tl.load(work_ptr + 2 * pid_work)
        d_start = tl.load(work_ptr + 2 * pid_work + 1) // BLOCK_D * BLOCK_D
    meta = feature_meta_ptr + feature * _META_COLS
    weight_offset = tl.load(meta + _META_WEIGHT_OFFSET)
    rows = tl.load(meta + _META_ROWS)
    dim = tl.load(meta + _META_DIM) // ALIGN * ALIGN
    out_col = tl.load(meta + _META_OUT_OFFSET) // ALIGN * ALIGN
    return feature, d_start, weight_offset, rows, dim, out_col
