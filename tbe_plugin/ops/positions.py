"""The backward's first step, shared by its two forms: each id's bag and global row
(``bag_rows``, ``_positions_kernel``), ``RunsLaunch.merge_repeats``: the ids of a bag that
repeat a row merged into one before the sort (``merged_positions``), and the positions the
training forward writes (``ForwardPositions``, ``RunsLaunch.forward_positions``) made right
for irregular offsets (``repair_positions``).

A bag's repeats of a row all read the bag's output-gradient row: for the row's gradient,
``k`` of them add ``k`` times that row (times each one's factor). Merged, they are one id
whose factor is the sum of theirs (``k`` for SUM), so that the sort, the sorted operands,
the marks and the pieces handle one id instead of ``k``. The merge looks within aligned
windows of ``merge_repeats`` consecutive positions (each window's pairs compared at once:
an id is dropped when an earlier position of its window holds the same bag and row; the
first keeps the sum of their factors, added in the window's fixed reduction order), so
repeats further apart stay separate ids: every window's result depends on its positions
alone, and the sums are bitwise repeatable. ctr-dlrm's batches (``workloads``, seed 0) keep
76.5% of their ids at windows of 32 positions, 72.8% at 64, 69.0% with whole bags.

Two forms (``RunsLaunch.merge_compact``). Compacted: the kept ids written in the order of
their positions (a counting pass, a running total, a writing pass), so that the sort sees
them alone; it needs their number on the host, one device-to-host read of the total, so
this form is off where the host may not wait (a captured graph). In place: a dropped id
keeps its position with the sentinel row, which the sort puts after every kept id; the sort
sees every position, and nothing waits for the device. The kept ids come out of the stable
sort in the same order either way: the same plan past the sort, bitwise.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.common import cdiv
from tbe_plugin.ops.hot_split import count_hot
from tbe_plugin.ops.indexing import _META_COLS, _META_ROW_BASE, _META_ROWS


@triton.jit
def bag_length(offsets_ptr, bag, valid, num_indices):
    """A bag's length for MEAN, at least 1: its offsets clamped into [0, num_indices] (for
    valid offsets, their difference; the backward's rule for invalid ones, which the
    forward has reported, and the same for a batch padded to its graph's bucket)."""
    start = tl.load(offsets_ptr + bag, mask=valid, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=valid, other=0).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), num_indices)
    end = tl.minimum(tl.maximum(end, 0), num_indices)
    return tl.maximum(end - start, 1)


@triton.jit
def bag_rows(feature_meta_ptr, indices_ptr, offsets_ptr, window_ptr, block, p, inside, B, total_bags,
             CHECK: tl.constexpr):  # fmt: skip
    """For the positions ``p`` of program ``block``: (bag, valid, feature, global row). The
    bag is the last one starting at or before the position, by a binary search of the
    offsets between the bags of the block's first and last positions, ``window_ptr[block]``
    and ``window_ptr[block + 1]`` (``positions_window``): log2 of the bags a block spans,
    ~6 dependent rounds at 20 ids a bag, instead of log2 of all the bags, 19 at B=16384 and
    30 features. Not valid: outside ``inside`` or in no bag (bag 0 then). With CHECK an id
    outside its table reads as row 0 (the forward's repair)."""
    # upper_bound(offsets[0 .. total_bags], p) - 1, for every position at once. The answer
    # lies between the upper bounds of the block's first position and of the next block's
    # (torch.searchsorted, one query a block): each round halves that window.
    first = tl.load(window_ptr + block)
    last = tl.load(window_ptr + block + 1)
    lo = tl.zeros(p.shape, dtype=tl.int64) + first
    hi = tl.zeros(p.shape, dtype=tl.int64) + last
    span = last - first
    while span > 0:
        active = lo < hi
        mid = (lo + hi) // 2
        at_or_before = tl.load(offsets_ptr + mid, mask=inside & active, other=0).to(tl.int64) <= p
        lo = tl.where(active & at_or_before, mid + 1, lo)
        hi = tl.where(active & ~at_or_before, mid, hi)
        span = span // 2
    bag = lo - 1
    valid = inside & (bag >= 0) & (bag < total_bags)
    bag = tl.where(valid, bag, 0)
    feature = bag // B
    meta = feature_meta_ptr + feature * _META_COLS
    rows = tl.load(meta + _META_ROWS, mask=valid, other=1)
    ids = tl.load(indices_ptr + p, mask=valid, other=0).to(tl.int64)
    if CHECK:
        ids = tl.where((ids < 0) | (ids >= rows), 0, ids)
    row = tl.load(meta + _META_ROW_BASE, mask=valid, other=0) + ids
    return bag, valid, feature, row


def positions_window(offsets: torch.Tensor, num_indices: int, block: int) -> torch.Tensor:
    """For programs of ``block`` consecutive positions (``bag_rows``): upper_bound(offsets,
    k * block) for k = 0 .. programs (the last entry bounds the last program), int64."""
    programs = cdiv(num_indices, block)
    starts = torch.arange(0, (programs + 1) * block, block, device=offsets.device, dtype=offsets.dtype)
    return torch.searchsorted(offsets, starts, right=True)


@triton.jit
def pack_bag_factor(bag, factor):
    """A bag (low 32 bits) and a factor's fp32 bits (high 32) in one int64 (``unpack_bags``
    reads them apart; the sorted operands gather both with one 8-byte load)."""
    bits = factor.to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    return (bits << 32) | (bag.to(tl.int64) & 0xFFFFFFFF)


# Positions per program of _positions_kernel, and its warps (4 positions a thread):
# consecutive positions, so that its loads and stores are contiguous whatever the bags'
# lengths (a program per bag tile scatters them a bag a lane: ~0.55 TB/s, H200, d488ab2).
POSITIONS_BLOCK = 1024
POSITIONS_WARPS = 8


@triton.jit
def _positions_kernel(
    feature_meta_ptr, indices_ptr, offsets_ptr, window_ptr, psw_ptr, rows_out_ptr, bag_out_ptr, scale_out_ptr,
    B, total_bags, num_indices, sentinel, hot_ptr, hot_counts_ptr,
    MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr, BLOCK: tl.constexpr, HOT: tl.constexpr = 0,
    LOG_HOT: tl.constexpr = 0, gate_ptr=None, GATED: tl.constexpr = False, PACKED: tl.constexpr = False,
):  # fmt: skip
    """Per id, BLOCK consecutive positions a program (every load and store contiguous,
    whatever the bags' lengths): its bag and global row (``positions.bag_rows``: the row is
    the sort key; with CHECK an id outside its table reads as row 0, the forward's repair),
    the bag (feature * B + b: what the output-gradient row and the table follow from), and
    the factor on that row (per-sample weight, 1/L for MEAN). A position in no
    bag (before the first offset or at or after the last) gets the sentinel row. HOT
    (``RunsLaunch.hot_rows``; 0: off): an id whose row is one of its feature's HOT hot rows
    (``hot_ptr[feature]``, its table's, ascending, 2**LOG_HOT of them) adds 1.0 to its (feature, slot,
    bag) count in ``hot_counts`` and gets the sentinel row: the sort and the pieces skip it.
    GATED (``repair_positions``): nothing unless ``gate_ptr[0]`` is set (each program reads it
    and returns; at 5788f47 a separate repair kernel masked its work off instead and still ran
    ``bag_rows``' loop: ~0.17 ms on ctr-dlrm, H200). PACKED: the bag and the factor packed in
    one int64 at ``bag_out_ptr`` (``pack_bag_factor``), none at ``scale_out_ptr``."""
    if GATED:
        if tl.load(gate_ptr) == 0:
            return
    block = tl.program_id(0).to(tl.int64)
    p = block * BLOCK + tl.arange(0, BLOCK)
    inside = p < num_indices
    bag, valid, feature, row = bag_rows(feature_meta_ptr, indices_ptr, offsets_ptr, window_ptr, block, p, inside,
                                        B, total_bags, CHECK)  # fmt: skip
    keyed = valid
    if HOT > 0:
        hit = count_hot(hot_ptr, hot_counts_ptr, feature, bag, row, valid, B, HOT, LOG_HOT)
        keyed = valid & ~hit
    tl.store(rows_out_ptr + p, tl.where(keyed, row, sentinel).to(rows_out_ptr.dtype.element_ty), mask=inside)
    scale = tl.full([BLOCK], 1.0, tl.float32)
    if WEIGHTED:
        scale *= tl.load(psw_ptr + p, mask=valid, other=0.0).to(tl.float32)
    if MEAN:
        scale *= tl.div_rn(1.0, bag_length(offsets_ptr, bag, valid, num_indices).to(tl.float32))
    if PACKED:
        tl.store(bag_out_ptr + p, pack_bag_factor(bag, scale), mask=valid)
    else:
        tl.store(bag_out_ptr + p, bag.to(bag_out_ptr.dtype.element_ty), mask=valid)
        if WEIGHTED or MEAN:
            tl.store(scale_out_ptr + p, scale, mask=valid)


@triton.jit
def _merged_positions_kernel(
    feature_meta_ptr, indices_ptr, offsets_ptr, window_ptr, psw_ptr, counts_ptr, rows_out_ptr, bag_out_ptr,
    scale_out_ptr, B, total_bags, num_indices, sentinel, packed_out_ptr,
    MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    COMPACT: tl.constexpr = True,
):  # fmt: skip
    """BLOCK consecutive positions a program, in aligned windows of WINDOW: an id is kept
    unless an earlier position of its window holds its bag and row. Per position, the kept
    id's global row, bag and factor (the sum over its window's ids of that bag and row of
    per-sample weight, times 1/L for MEAN; their count for SUM). COMPACT: the row (-1 where
    none is kept), bag and factor apart, and the block's kept count into
    ``counts_ptr[block]`` (``_compact_kernel`` then gathers the kept ones); otherwise the
    row (``sentinel`` where none is kept: the sort puts it last) and, packed in one int64 at
    ``packed_out_ptr``, the bag (low 32 bits) and the factor's bits (high 32)."""
    block = tl.program_id(0).to(tl.int64)
    p = block * BLOCK + tl.arange(0, BLOCK)
    inside = p < num_indices
    bag, valid, feature, row = bag_rows(feature_meta_ptr, indices_ptr, offsets_ptr, window_ptr, block, p, inside,
                                        B, total_bags, CHECK)  # fmt: skip
    key_row = tl.where(valid, row, -1).to(rows_out_ptr.dtype.element_ty)
    key_bag = tl.where(valid, bag, -1).to(tl.int32)  # fewer than 2**31 bags
    WINDOWS: tl.constexpr = BLOCK // WINDOW
    rows2 = tl.reshape(key_row, [WINDOWS, WINDOW])
    bags2 = tl.reshape(key_bag, [WINDOWS, WINDOW])
    # same[w, i, j]: positions i and j of window w hold one bag and row (never an invalid
    # position with a valid one: their bag is -1).
    same = (rows2[:, :, None] == rows2[:, None, :]) & (bags2[:, :, None] == bags2[:, None, :])
    lane = tl.arange(0, WINDOW)
    earlier = lane[None, None, :] < lane[None, :, None]
    repeat = tl.reshape(tl.max((same & earlier).to(tl.int32), axis=2), [BLOCK]) > 0
    keep = valid & ~repeat
    scale = tl.full([BLOCK], 1.0, tl.float32)
    if WEIGHTED:
        scale *= tl.load(psw_ptr + p, mask=valid, other=0.0).to(tl.float32)
    if MEAN:
        scale *= tl.div_rn(1.0, bag_length(offsets_ptr, bag, valid, num_indices).to(tl.float32))
    scale2 = tl.reshape(scale, [WINDOWS, WINDOW])
    factor = tl.reshape(tl.sum(tl.where(same, scale2[:, None, :], 0.0), axis=2), [BLOCK])
    if COMPACT:
        tl.store(rows_out_ptr + p, tl.where(keep, key_row, -1), mask=inside)
        tl.store(bag_out_ptr + p, key_bag, mask=keep)
        tl.store(scale_out_ptr + p, factor, mask=keep)
        tl.store(counts_ptr + block, tl.sum(keep.to(tl.int64), axis=0))
    else:
        tl.store(rows_out_ptr + p, tl.where(keep, key_row, sentinel), mask=inside)
        tl.store(packed_out_ptr + p, pack_bag_factor(key_bag, factor), mask=keep)


@triton.jit
def _compact_kernel(rows_ptr, bag_ptr, scale_ptr, totals_ptr, rows_out_ptr, packed_out_ptr, num_indices,
                    BLOCK: tl.constexpr):  # fmt: skip
    """The kept ids (row >= 0) of BLOCK positions a program, at their places among all kept
    ids in the order of their positions (``totals_ptr``: the running totals of the blocks'
    kept counts): the row, and the bag (low 32 bits) packed with the factor's bits (high 32)
    in one int64, which the sorted operands gather in one 8-byte load."""
    block = tl.program_id(0).to(tl.int64)
    p = block * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=-1)
    keep = row >= 0
    kept = keep.to(tl.int64)
    place = tl.load(totals_ptr + block) - tl.sum(kept, axis=0) + tl.cumsum(kept, axis=0) - 1
    bag = tl.load(bag_ptr + p, mask=keep, other=0)
    factor = tl.load(scale_ptr + p, mask=keep, other=0.0)
    tl.store(rows_out_ptr + place, row, mask=keep)
    tl.store(packed_out_ptr + place, pack_bag_factor(bag, factor), mask=keep)


# Elements of _merged_positions_kernel's window comparison a program (positions x window):
# 32 a thread at 8 warps (ptxas sm_90: 90-94 registers at windows of 32 and 256 positions;
# 64 a thread took 148-210).
MERGE_COMPARISONS = 8192
MERGE_WARPS = 8
COMPACT_WARPS = 4


MERGE_MAX_BLOCK = 1024  # 4 positions a thread at 8 warps, as the positions kernel


def merge_block(window: int) -> int:
    """Positions a program of the merge's kernels, for windows of ``window`` positions."""
    return max(window, min(MERGE_MAX_BLOCK, MERGE_COMPARISONS // window))


def merged_positions(feature_meta, indices, offsets, per_sample_weights, B, total_bags, key_dtype, mean,
                     bounds_check, window, compact=True, sentinel=-1):  # fmt: skip
    """The batch's ids after ``RunsLaunch.merge_repeats`` of ``window`` positions (fewer than
    2**31 bags): their global rows (``key_dtype``) and, packed in an int64 each, their bags
    (low 32 bits) and factors' fp32 bits (high 32). ``compact``: the kept ids alone, in the
    order of their positions, after one read of their count on the host; otherwise every
    position, a dropped one (or one outside every bag) with the row ``sentinel`` and no
    packed value (nothing waits for the device)."""
    device, N = indices.device, indices.numel()
    block = merge_block(window)
    programs = cdiv(N, block)
    window_starts = positions_window(offsets, N, block)
    rows = torch.empty(N, dtype=key_dtype, device=device)
    psw = per_sample_weights if per_sample_weights is not None else rows
    if compact:  # the kept count a block, each position's bag and factor apart; nothing packed yet
        counts = torch.empty(programs, dtype=torch.int64, device=device)
        bags = torch.empty(N, dtype=torch.int32, device=device)
        scale = torch.empty(N, dtype=torch.float32, device=device)
        packed = bags  # never written
    else:  # each position's bag and factor packed; no counts
        packed = torch.empty(N, dtype=torch.int64, device=device)
        counts = bags = scale = packed  # never written
    _merged_positions_kernel[(programs,)](
        feature_meta, indices, offsets, window_starts, psw, counts, rows, bags, scale, B, total_bags, N, sentinel,
        packed, MEAN=mean, WEIGHTED=per_sample_weights is not None, CHECK=bounds_check, BLOCK=block, WINDOW=window,
        COMPACT=compact, num_warps=MERGE_WARPS,
    )  # fmt: skip
    if not compact:
        return rows, packed
    totals = torch.cumsum(counts, 0)
    kept = int(totals[-1])  # the host waits for the count: the sort takes its size from it
    out = (torch.empty(kept, dtype=key_dtype, device=device), torch.empty(kept, dtype=torch.int64, device=device))
    _compact_kernel[(programs,)](rows, bags, scale, totals, *out, N, BLOCK=block, num_warps=COMPACT_WARPS)
    return out


def unpack_bags(packed: torch.Tensor):
    """``merged_positions``' packed int64s as (bags int32, factors fp32)."""
    halves = packed.view(torch.int32).view(-1, 2)  # little-endian: the bag first
    return halves[:, 0], halves[:, 1].contiguous().view(torch.float32)


@triton.jit
def _offsets_irregular_kernel(offsets_ptr, flag_ptr, total_bags, num_indices, BLOCK: tl.constexpr):
    """Sets ``flag_ptr[0]`` to 1 unless the offsets rise from 0 to ``num_indices`` without
    decreasing (then every position lies in exactly one bag, as the forward read it). Every
    program that finds a fault stores the same 1: no atomics, the same flag in any order."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < total_bags
    start = tl.load(offsets_ptr + i, mask=inside, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + i + 1, mask=inside, other=0).to(tl.int64)
    bad = inside & ((end < start) | ((i == 0) & (start != 0)) | ((i == total_bags - 1) & (end != num_indices)))
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        tl.store(flag_ptr, 1)


def repair_positions(feature_meta, indices, offsets, B, total_bags, mean, bounds_check, rows, bags) -> None:
    """The forward's positions (``forward_warp._store_positions``: ``bags`` int32, or int64
    with the factors packed) made right for any offsets: where they do not rise from 0 to
    the id count (a position in no bag or in two, which the forward reads as its clamped
    ranges and reports), the positions kernel writes every position again by the backward's
    own rule, unmerged, in the same layout, on the device, with no host read."""
    N = indices.numel()
    flag = torch.zeros(1, dtype=torch.int32, device=indices.device)
    _offsets_irregular_kernel[(cdiv(total_bags, POSITIONS_BLOCK),)](offsets, flag, total_bags, N,
                                                                    BLOCK=POSITIONS_BLOCK)  # fmt: skip
    window = positions_window(offsets, N, POSITIONS_BLOCK)
    _positions_kernel[(window.numel() - 1,)](
        feature_meta, indices, offsets, window, rows, rows, bags, rows, B, total_bags, N, torch.iinfo(rows.dtype).max,
        rows, rows, MEAN=mean, WEIGHTED=False, CHECK=bounds_check, BLOCK=POSITIONS_BLOCK, gate_ptr=flag, GATED=True,
        PACKED=bags.dtype == torch.int64, num_warps=POSITIONS_WARPS,
    )  # fmt: skip


class ForwardPositions:
    """Where the training forward writes the backward's positions (``RunsLaunch.
    forward_positions``): each position's global row (the sort key; ``rows``, the sort's
    dtype) and its bag (``bags``, int32); with ``merge`` (``RunsLaunch.forward_merge``) a
    bag's repeats of a row within a round of 32 of its ids merged into the first (the
    sentinel row for the others) and ``bags`` the bag and factor packed (int64).
    ``written``: every class of the forward took a kernel that writes them (else the
    backward makes its positions itself). ``hot``: the batch's hot rows (``hot_split.
    hot_choice``' tuple), chosen before the lookup beside it (``RunsLaunch.hot_split``), or None."""

    __slots__ = ("rows", "bags", "merge", "written", "hot")

    def __init__(self, num_indices: int, key_dtype: torch.dtype, device: torch.device, merge: bool = False):
        self.rows = torch.empty(num_indices, dtype=key_dtype, device=device)
        self.bags = torch.empty(num_indices, dtype=torch.int64 if merge else torch.int32, device=device)
        self.merge = merge
        self.written = False
        self.hot = None

    @property
    def sentinel(self) -> int:
        """The row of a repeat and of a position in no bag: sorted after every row."""
        return torch.iinfo(self.rows.dtype).max
