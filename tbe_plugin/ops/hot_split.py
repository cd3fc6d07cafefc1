"""The hot rows taken out of the sort (``RunsLaunch.hot_split``, with ``RunsLaunch.hot_rows``).

``hot_rows`` sums each table's hottest rows apart from the sort (``hot_product``): their ids
are counted per (feature, hot row, bag) and given the sentinel row. Alone it leaves them in
the sort as sentinels, so the sort, the sorted operands and the marks keep their size (H200 at
56eb52a: the kernels' device time a wash). ``hot_split`` compacts the other ids first, in the
order of their positions, so that everything from the sort on sees them alone:

1. Which ids are hot. From the positions the training forward wrote (``ForwardPositions``:
   each position's global row and int32 bag), ``_hot_split_kernel`` finds each id's slot
   among its feature's hot rows and counts a hit into ``hot_counts`` (``count_hot``, what the
   positions kernel does with ``HOT``) and writes the sentinel row over it, in place. Without the
   forward's positions the positions kernel does the same as it makes them.
2. Each block's count of the ids left (by ``_hot_split_kernel`` in the same pass; from the
   positions kernel's positions, ``_kept_counts_kernel``).
3. Their running total, read on the host (one device-to-host read a batch: the sort takes
   its size from it; the host waits for the device there).
4. ``_compact_kept_kernel``: the ids left, their rows, bags and factors, at their places in
   the order of their positions.

The ids left come out of the stable sort in the same order as the sentinels' version
leaves them, at the same sorted places (the sentinels sort last): the same pieces, cells
and sums, bitwise the same step as ``hot_rows`` without the split (tested).

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import weakref
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_launch import RunsLaunch
from tbe_plugin.ops.common import Pooling, cdiv
from tbe_plugin.ops.hot_product import HotTables, choose_hot_rows, hot_tables

SPLIT_BLOCK = 1024  # positions a program of the three kernels (4 a thread at 8 warps)
SPLIT_WARPS = 8


@triton.jit
def count_hot(hot_ptr, hot_counts_ptr, feature, bag, row, valid, B, HOT: tl.constexpr, LOG_HOT: tl.constexpr):
    """Whether each id's row is one of its feature's HOT hot rows (``hot_ptr[feature]``,
    ascending, padded above every row: a lower-bound search); a hit adds 1.0 to its
    (feature, slot, bag) count (fp32 atomics of 1.0: exact small integers, the same counts in
    any order)."""
    hot = hot_ptr + feature * HOT
    slot = tl.zeros(row.shape, dtype=tl.int64)
    for level in tl.static_range(LOG_HOT):
        half = HOT >> (level + 1)
        below = tl.load(hot + slot + half - 1, mask=valid, other=0) < row
        slot = tl.where(below, slot + half, slot)
    hit = valid & (slot < HOT) & (tl.load(hot + tl.minimum(slot, HOT - 1), mask=valid, other=-1) == row)
    tl.atomic_add(hot_counts_ptr + (feature * HOT + slot) * B + (bag - feature * B), 1.0, mask=hit)
    return hit


@triton.jit
def _hot_split_kernel(rows_ptr, bags_ptr, hot_ptr, hot_counts_ptr, kept_ptr, B, num_indices, sentinel,
                      HOT: tl.constexpr, LOG_HOT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Per position of the forward's (row, bag): an id whose row is one of its feature's hot
    rows adds 1.0 to its (feature, slot, bag) count and takes the sentinel row; the block's
    count of the ids left at ``kept_ptr[block]`` (``_kept_counts_kernel``'s, in the same pass)."""
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = p < num_indices
    row = tl.load(rows_ptr + p, mask=inside, other=sentinel).to(tl.int64)
    valid = inside & (row != sentinel)
    bag = tl.load(bags_ptr + p, mask=valid, other=0).to(tl.int64)
    feature = bag // B
    hit = count_hot(hot_ptr, hot_counts_ptr, feature, bag, row, valid, B, HOT, LOG_HOT)
    tl.store(rows_ptr + p, tl.full(row.shape, sentinel, tl.int64).to(rows_ptr.dtype.element_ty), mask=hit)
    tl.store(kept_ptr + tl.program_id(0), tl.sum((valid & ~hit).to(tl.int64), axis=0))


@triton.jit
def _kept_counts_kernel(rows_ptr, counts_ptr, num_indices, sentinel, BLOCK: tl.constexpr):
    """counts[block]: the block's positions whose row is not the sentinel."""
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=sentinel)
    tl.store(counts_ptr + tl.program_id(0), tl.sum((row != sentinel).to(tl.int64), axis=0))


@triton.jit
def _compact_kept_kernel(rows_ptr, bags_ptr, scale_ptr, totals_ptr, rows_out_ptr, bags_out_ptr, scale_out_ptr,
                         num_indices, sentinel, SCALED: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The block's ids whose row is not the sentinel, at their places among all such ids in
    the order of their positions (``totals_ptr``: the running totals of the blocks' counts)."""
    block = tl.program_id(0).to(tl.int64)
    p = block * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=sentinel)
    keep = row != sentinel
    kept = keep.to(tl.int64)
    place = tl.load(totals_ptr + block) - tl.sum(kept, axis=0) + tl.cumsum(kept, axis=0) - 1
    tl.store(rows_out_ptr + place, row, mask=keep)
    tl.store(bags_out_ptr + place, tl.load(bags_ptr + p, mask=keep, other=0), mask=keep)
    if SCALED:
        tl.store(scale_out_ptr + place, tl.load(scale_ptr + p, mask=keep, other=0.0), mask=keep)


def split_hot(rows: torch.Tensor, bags: torch.Tensor, feature_hot_rows: torch.Tensor, hot_counts: torch.Tensor,
              batch_size: int, sentinel: int) -> torch.Tensor:  # fmt: skip
    """Step 1 on the forward's positions (``rows`` the sort's dtype, ``bags`` int32, in place):
    ``feature_hot_rows`` (F, K) each feature's hot rows, ascending; ``hot_counts`` (F, K, B)
    fp32 zeros, counted into. Returns each block's count of the ids left (``compact_kept``'s
    ``counts``: step 2 done in the same pass)."""
    K = feature_hot_rows.shape[1]
    N = rows.numel()
    if bags.dtype != torch.int32 or bags.numel() != N:
        raise ValueError(f"split_hot: bags must be int32, one a position ({N}), got {bags.dtype} {bags.numel()}")
    if K < 1 or K & (K - 1) or tuple(hot_counts.shape) != (feature_hot_rows.shape[0], K, batch_size):
        raise ValueError(f"split_hot: hot_counts must be (F, K, B) with K a power of two, got "
                         f"{tuple(hot_counts.shape)} for {tuple(feature_hot_rows.shape)} hot rows, B={batch_size}")
    kept = torch.zeros(max(cdiv(N, SPLIT_BLOCK), 1), dtype=torch.int64, device=rows.device)
    if N:
        _hot_split_kernel[(cdiv(N, SPLIT_BLOCK),)](
            rows, bags, feature_hot_rows, hot_counts, kept, batch_size, N, sentinel, HOT=K,
            LOG_HOT=K.bit_length() - 1, BLOCK=SPLIT_BLOCK, num_warps=SPLIT_WARPS,
        )  # fmt: skip
    return kept


def compact_kept(rows: torch.Tensor, bags: torch.Tensor, scale: Optional[torch.Tensor], sentinel: int,
                 counts: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Steps 2 to 4: the positions whose row is not ``sentinel``, in order: (rows, bags,
    factors or None). At least one entry: when no id is left, one sentinel (the plan's
    kernels then see an empty batch). One host read of the count. ``counts``: each block's
    count of them already (``split_hot``'s), else counted here."""
    N, device = rows.numel(), rows.device
    programs = cdiv(N, SPLIT_BLOCK)
    if counts is None:
        counts = torch.zeros(max(programs, 1), dtype=torch.int64, device=device)
        if programs:
            _kept_counts_kernel[(programs,)](rows, counts, N, sentinel, BLOCK=SPLIT_BLOCK, num_warps=SPLIT_WARPS)
    totals = torch.cumsum(counts, 0)
    kept = int(totals[-1])  # the host waits for the device: the sort takes its size from it
    if not kept:  # one sentinel
        return (torch.full((1,), sentinel, dtype=rows.dtype, device=device), bags.new_zeros(1),
                None if scale is None else scale.new_ones(1))  # fmt: skip
    rows_out, bags_out = rows.new_empty(kept), bags.new_empty(kept)  # every entry written below
    scale_out = None if scale is None else scale.new_empty(kept)
    _compact_kept_kernel[(programs,)](
        rows, bags, bags if scale is None else scale, totals, rows_out, bags_out,
        bags_out if scale_out is None else scale_out, N, sentinel, SCALED=scale is not None, BLOCK=SPLIT_BLOCK,
        num_warps=SPLIT_WARPS,
    )  # fmt: skip
    return rows_out, bags_out, scale_out


# Per feature-metadata tensor (by id, with a weak reference that proves it is the same one):
# which features read which table (``hot_product.hot_tables``: a host read once per tensor).
_HOT_TABLES: dict = {}


def hot_applies(launch: RunsLaunch, pooling: int, weighted: bool, graphed: bool, num_ids: int) -> bool:
    """Whether ``RunsLaunch.hot_rows`` applies: the pieces design, pooled (SUM or MEAN) without
    per-sample weights, an eager batch of ``hot_min_ids`` or more."""
    if not launch.hot_rows or launch.design != "pieces" or pooling == Pooling.NONE or weighted:
        return False
    return not graphed and num_ids >= max(launch.hot_min_ids, 1)


def split_applies(launch: RunsLaunch, device: torch.device) -> bool:
    """Whether ``RunsLaunch.hot_split`` compacts (where the hot rows apply): the count is read on
    the host, so not inside a CUDA graph's capture (there the hot ids stay in the sort as
    sentinels: the same step)."""
    return launch.hot_split and (device.type != "cuda" or not torch.cuda.is_current_stream_capturing())


def hot_tables_of(feature_meta: torch.Tensor) -> HotTables:
    """``hot_product.hot_tables`` of a module's feature metadata, made once per tensor."""
    known = _HOT_TABLES.get(id(feature_meta))
    if known is None or known[0]() is not feature_meta:
        known = (weakref.ref(feature_meta), hot_tables(feature_meta))
        _HOT_TABLES[id(feature_meta)] = known
    return known[1]


def hot_choice(feature_meta, indices, offsets, batch_size: int, hot: int, sample: int, bounds_check: bool,
               total_rows: int):  # fmt: skip
    """(tables, hot rows per table, per feature, zero counts (F, hot, B)) for ``hot`` hot rows a
    table (``hot_product.choose_hot_rows``); all None when ``hot`` is 0."""
    if not hot:
        return None, None, None, None
    tables = hot_tables_of(feature_meta)
    hot_rows, feature_hot_rows = choose_hot_rows(indices, offsets, feature_meta, tables, batch_size, hot, sample,
                                                 bounds_check, total_rows)  # fmt: skip
    counts = torch.zeros(feature_meta.shape[0], hot, batch_size, dtype=torch.float32, device=indices.device)
    return tables, hot_rows, feature_hot_rows, counts
