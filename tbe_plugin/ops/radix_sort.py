"""A stable LSD radix sort of non-negative int32 keys with int32 or int64 values, in Triton.

The backward sorts the global rows of a batch's ids (``embedding_backward``). ``torch.sort``
sorts all 32 bits of an int32 key (four 8-bit passes, ``cub``'s onesweep) and carries an
int64 position it fills itself (an arange, and a copy of the keys: two more passes over the
batch). The rows of every table together need fewer bits (22 for 3.2M rows), and the
backward wants the id's bag beside its row, not its position. ``sort_pairs`` sorts only the
key bits asked for, at most ``RadixSizes.digit_bits`` a pass, and carries the values it is
given. A pass:

1. ``_tile_histogram_kernel``: per tile of ``tile`` positions, how many keys have each digit;
   stored digit-major (``hist[digit * tiles + tile]``).
2. An exclusive cumulative sum over that vector: where each (digit, tile) writes its keys.
3. ``_tile_scatter_kernel``: per tile, ``sub_tile`` keys at a time, each key's rank among the
   sub-block's keys of its digit (``RadixSizes.ranking``: ``sort``, a ``tl.sort`` of one
   packed (digit, position) int32 a key; ``match``, a comparison of every pair of the
   sub-block's digits), each key and value written at its digit's next place in the
   tile's run plus that rank.

Stable (each pass keeps the order of equal digits: tiles in order, positions within a tile
in order), hence bitwise the order ``torch.sort(stable=True)`` gives. No atomics.

Slower than ``torch.sort`` on the H200 (``benchmarks.probe_radix_sort``; results
``probe_radix_sort_h200_*.json``): 41.9M keys of 22 bits with int32 values took 4.4-4.7 ms
against 2.8 for ``torch.sort`` and the gather of the values, 5.2M keys 0.55-0.70 against
0.34-0.36 (a541e15); ranking whole tiles of 2048-4096 keys with one ``tl.sort`` took 6.9-14.5
ms (161f483): the bitonic sort's cost grows with the keys a thread holds, and ranking
sub-blocks one after another (a541e15) left each program waiting on its loads. cub's onesweep
ranks with warp-level matching, which Triton does not expose. Since then, not timed: each
sub-block's keys are loaded a step ahead, and a second ranking (``match``) compares a
sub-block's digits pairwise instead of sorting them. Used only by the off candidate
``RunsLaunch.radix_sort``.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_launch import RadixSizes

@triton.jit
def _tile_histogram_kernel(keys_ptr, hist_ptr, n, shift, tiles, RADIX: tl.constexpr, TILE: tl.constexpr):
    """This tile's count of keys per digit ((key >> shift) % RADIX), at hist[digit * tiles + tile]."""
    tile = tl.program_id(0)
    pos = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
    inside = pos < n
    key = tl.load(keys_ptr + pos, mask=inside, other=0)
    counts = tl.histogram((key >> shift) & (RADIX - 1), RADIX, mask=inside)
    tl.store(hist_ptr + tl.arange(0, RADIX).to(tl.int64) * tiles + tile, counts)


@triton.jit
def _tile_scatter_kernel(
    keys_in_ptr, values_in_ptr, keys_out_ptr, values_out_ptr, starts_ptr, n, shift, tiles,
    RADIX: tl.constexpr, TILE: tl.constexpr, SUB: tl.constexpr, LOG_SUB: tl.constexpr, MATCH: tl.constexpr = False,
):  # fmt: skip
    """This tile's keys and values written in (digit, position) order, each digit's run at
    its start for this tile (``starts[digit * tiles + tile]``, the exclusive sums of the
    histograms). SUB keys at a time, in order, each placed after the tile's keys of its digit
    written before (a running count per digit) plus its rank among the sub-block's keys of
    its digit: MATCH False, by a ``tl.sort`` of SUB packed (digit, place) values (a key's
    place in that order less its digit's first place; the keys then stored in that order);
    MATCH True, by a SUB x SUB comparison of the digits (how many earlier keys share its
    digit; the keys stored in their own order)."""
    tile = tl.program_id(0)
    nxt = tl.load(starts_ptr + tl.arange(0, RADIX).to(tl.int64) * tiles + tile)  # each digit's next place
    j = tl.arange(0, SUB)
    # Each sub-block's keys and values are loaded one step ahead (with the step before's work
    # in flight), so that a step waits on no load of its own.
    ahead = tile.to(tl.int64) * TILE + j
    key_ahead = tl.load(keys_in_ptr + ahead, mask=ahead < n, other=0)
    value_ahead = tl.load(values_in_ptr + ahead, mask=ahead < n, other=0)
    for sub in tl.range(0, TILE, SUB, num_stages=1):
        pos = tile.to(tl.int64) * TILE + sub + j
        inside = pos < n
        key, value = key_ahead, value_ahead
        ahead = pos + SUB
        more = (ahead < n) & (sub + SUB < TILE)
        key_ahead = tl.load(keys_in_ptr + ahead, mask=more, other=0)
        value_ahead = tl.load(values_in_ptr + ahead, mask=more, other=0)
        digit = tl.where(inside, (key >> shift) & (RADIX - 1), RADIX)  # past the end: after every digit
        counts = tl.histogram(digit, RADIX, mask=inside)
        if MATCH:
            same = (digit[:, None] == digit[None, :]) & (j[None, :] < j[:, None])
            rank = tl.sum(same.to(tl.int32), axis=1)
            dest = tl.gather(nxt, tl.minimum(digit, RADIX - 1), 0).to(tl.int64) + rank
            tl.store(keys_out_ptr + dest, key, mask=inside)
            tl.store(values_out_ptr + dest, value, mask=inside)
        else:
            order = tl.sort((digit << LOG_SUB) | j)
            sorted_digit = order >> LOG_SUB
            source = order & (SUB - 1)
            # The digit's next place less its first place in the sorted order, plus the place.
            base = nxt - (tl.cumsum(counts, 0) - counts)
            live = sorted_digit < RADIX
            dest = tl.gather(base, tl.minimum(sorted_digit, RADIX - 1), 0).to(tl.int64) + j
            tl.store(keys_out_ptr + dest, tl.gather(key, source, 0), mask=live)
            tl.store(values_out_ptr + dest, tl.gather(value, source, 0), mask=live)
        nxt += counts


def pass_bits(key_bits: int, digit_bits: int = RadixSizes.digit_bits) -> Tuple[int, ...]:
    """The bits each pass sorts: as few passes of at most ``digit_bits`` as ``key_bits`` need,
    the bits spread evenly (22 bits, 8 a pass: 8, 7, 7)."""
    if key_bits <= 0:
        return ()
    passes = -(-key_bits // digit_bits)
    low, extra = divmod(key_bits, passes)
    return tuple(low + (1 if p < extra else 0) for p in range(passes))


def sort_pairs(keys: torch.Tensor, values: torch.Tensor, key_bits: int,
               sizes: Optional[RadixSizes] = None) -> Tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``keys`` (int32, each in [0, 2**key_bits)) sorted stably, and ``values`` (int32 or
    int64, one per key) in the same order: bitwise what ``torch.sort(keys, stable=True)``
    and ``values[perm]`` give. Keys outside that range are not checked and sort wrong.
    ``sizes``: the launch sizes (``RadixSizes()`` when None)."""
    sizes = sizes or RadixSizes()
    if keys.dtype != torch.int32 or keys.dim() != 1:
        raise ValueError(f"sort_pairs: keys must be a 1-D int32 tensor, got {keys.dtype} of {keys.dim()} dims")
    if values.dtype not in (torch.int32, torch.int64) or values.shape != keys.shape:
        raise ValueError(f"sort_pairs: values must be int32 or int64 of the keys' shape {tuple(keys.shape)}, got "
                         f"{values.dtype} {tuple(values.shape)}")  # fmt: skip
    if not 0 <= key_bits <= 31:
        raise ValueError(f"sort_pairs: key_bits must be in [0, 31], got {key_bits}")
    n = keys.numel()
    if n >= 2**31:
        raise ValueError(f"sort_pairs: at most 2**31 - 1 keys (int32 places), got {n}")
    bits = pass_bits(key_bits, sizes.digit_bits)
    if n <= 1 or not bits:
        return keys.clone(), values.clone()
    tile, sub = sizes.tile, sizes.sub_tile
    tiles = triton.cdiv(n, tile)
    source = (keys.contiguous(), values.contiguous())  # never written: passes alternate two other pairs
    pairs = [None, None]
    shift = 0
    for p, width in enumerate(bits):
        if pairs[p % 2] is None:
            pairs[p % 2] = (torch.empty_like(source[0]), torch.empty_like(source[1]))
        target = pairs[p % 2]
        radix = 1 << width
        hist = torch.empty(radix * tiles, dtype=torch.int32, device=keys.device)
        _tile_histogram_kernel[(tiles,)](source[0], hist, n, shift, tiles, RADIX=radix, TILE=tile,
                                         num_warps=sizes.warps)  # fmt: skip
        starts = torch.cumsum(hist, 0, dtype=torch.int32).sub_(hist)
        _tile_scatter_kernel[(tiles,)](*source, *target, starts, n, shift, tiles, RADIX=radix, TILE=tile, SUB=sub,
                                       LOG_SUB=sub.bit_length() - 1, MATCH=sizes.ranking == "match",
                                       num_warps=sizes.warps)  # fmt: skip
        shift += width
        source = target
    return source
