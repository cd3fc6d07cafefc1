"""The launcher of the backward's pieces design (``backward_pieces``'s kernels, ``RunsLaunch.design ==
"pieces"``): the marks of pieces and multi runs, the optional per-piece records and their order, then per
class the pieces, the cell-group sums and the multi runs; with ``RunsLaunch.piece_fit``, the looping grid cut
to the programs that fit a multiprocessor.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

from typing import NamedTuple

import torch

from tbe_plugin.ops.backward_pieces import (
    _cell_groups_kernel,
    _multi_runs_kernel,
    _piece_marks_kernel,
    _piece_order_kernel,
    _pieces_kernel,
)
from tbe_plugin.ops.common import cdiv
from tbe_plugin.ops.optimizers import Optimizer
from tbe_plugin.ops.update_operands import _cell_argument, _multiprocessors, _update_operands

def resident_programs(n_regs: int, warps: int, regs_per_sm: int = 65536, warps_per_sm: int = 64) -> int:
    """Programs of ``warps`` warps at ``n_regs`` registers a thread that one multiprocessor
    holds at once: registers are allocated 8 a thread at a time (256 a warp)."""
    per_program = -(-n_regs // 8) * 8 * 32 * warps
    return max(1, min(regs_per_sm // per_program, warps_per_sm // warps))


# ``RunsLaunch.piece_fit``: resident pieces programs a multiprocessor, by compiled variant.
_RESIDENT: dict = {}


def _record_resident(key, compiled, device: torch.device, warps: int) -> None:
    """Remembers how many programs of a just-launched pieces kernel fit a multiprocessor
    (``compiled.n_regs``; nothing under the interpreter, whose launches return no kernel)."""
    n_regs = getattr(compiled, "n_regs", None)
    if device.type == "cuda" and n_regs:
        props = torch.cuda.get_device_properties(device)
        warps_per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // 32
        _RESIDENT[key] = resident_programs(n_regs, warps, getattr(props, "regs_per_multiprocessor", 65536),
                                           warps_per_sm)  # fmt: skip


# Optimizers of two state tensors, which take no short launch when RunsLaunch.short_two_states is off.
TWO_STATES = frozenset((Optimizer.ADAM, Optimizer.PARTIAL_ROWWISE_ADAM, Optimizer.LAMB))

MARKS_BLOCK = 1024  # positions per program of _piece_marks_kernel
MARKS_WARPS = 8  # 4 positions a thread (ptxas sm_90: 4 warps took up to 146 registers with the records)


def _piece_records(keys: torch.Tensor, most_pieces: int, scaled: bool):
    """Per piece (``RunsLaunch.piece_records``): its row (``keys``' dtype), flags, the row's
    start in the weights, D, its first id's gradient row and factor; ~33 bytes a piece
    (upper bound: an id's worth of pieces plus a cell's)."""
    device = keys.device
    return (
        torch.empty(most_pieces, dtype=keys.dtype, device=device),
        torch.empty(most_pieces, dtype=torch.int8, device=device),
        torch.empty(most_pieces, dtype=torch.int64, device=device),
        torch.empty(most_pieces, dtype=torch.int32, device=device),
        torch.empty(most_pieces, dtype=torch.int64, device=device),
        torch.empty(most_pieces if scaled else 1, dtype=torch.float32, device=device),
    )


ORDER_BLOCK = 1024  # pieces per step of _piece_order_kernel's programs
ORDER_WARPS = 8  # 4 pieces a thread
ORDER_PROGRAMS_PER_SM = 4


def _ordered_pieces(grad_rows, grad_stride, piece_starts, class_piece_pos, num_classes, records, size, scaled, sms):
    """The pieces and their records in the order of the gradient rows they first read
    (``_piece_order_kernel``: counts per (class, row), their running totals, a scatter),
    each with its stop; returns (starts, row, flags, w_start, dim, gradient row, factor,
    stops)."""
    device = piece_starts.device
    buckets = torch.zeros(num_classes * grad_rows, dtype=torch.int32, device=device)
    out = _piece_records(records[0], size, scaled)
    starts, stops = (torch.empty(size, dtype=torch.int64, device=device) for _ in range(2))
    grid = (sms * ORDER_PROGRAMS_PER_SM,)
    common = (class_piece_pos, num_classes, piece_starts, *records)
    _piece_order_kernel[grid](*common, buckets, grad_rows, grad_stride, starts, stops, *out,
                              SCATTER=False, SCALED=scaled, BLOCK=ORDER_BLOCK, num_warps=ORDER_WARPS)  # fmt: skip
    ends = torch.cumsum(buckets, 0, dtype=torch.int32)
    _piece_order_kernel[grid](*common, ends, grad_rows, grad_stride, starts, stops, *out,
                              SCATTER=True, SCALED=scaled, BLOCK=ORDER_BLOCK, num_warps=ORDER_WARPS)  # fmt: skip
    return (starts, *out, stops)


class PieceMarks(NamedTuple):
    """What the pieces design's launches read of a batch's sorted ids alone (``piece_marks``):
    no gradient, no weights, so that it may be computed ahead (``embedding_backward.BackwardPlan``)."""

    piece_starts: torch.Tensor
    multi_heads: torch.Tensor
    class_piece_pos: torch.Tensor
    class_multi_pos: torch.Tensor
    records: tuple  # per-piece records (``RunsLaunch.piece_records``), else piece_starts six times
    split: tuple  # short runs' and other pieces' indices, each class's first of both (``short``)
    piece_list: torch.Tensor  # the pieces in launch order (piece_starts unless ordered)
    stops: torch.Tensor
    short: int  # the short runs' most ids (0: none listed apart)
    cells: int


def short_ids(launch, optimizer, pooled: bool, num_ids: int) -> int:
    """The most ids of a run the marks list apart as short (``RunsLaunch.piece_short``), 0 for
    none: int32 piece indices, so batches of fewer than 2**31 ids; not with the ordered list,
    which their indices do not follow; for optimizers of two states only with
    ``RunsLaunch.short_two_states`` (the default)."""
    piece = launch.piece_ids
    ordered = launch.piece_order and pooled
    two_states = optimizer in TWO_STATES and not launch.short_two_states
    fits = num_ids + num_ids // piece + 2 < 2**31
    return min(launch.piece_short, piece) if fits and not ordered and not two_states else 0


def mark_counts(num_ids: int, short: int, device: torch.device) -> torch.Tensor:
    """The marks' counts per block of MARKS_BLOCK positions (``num_ids`` + 1 positions: the end
    of the valid ids may be the last): pieces, then multi runs (then short runs), one vector,
    so that its running totals are one 1-D scan (CUB's; torch scans dim 0 of a [blocks, 2]
    tensor serially: 1.5 ms at ctr-mix's 22k blocks, H200, e45a0a4)."""
    return torch.empty((3 if short else 2) * cdiv(num_ids + 1, MARKS_BLOCK), dtype=torch.int32, device=device)


def piece_marks(sorted_operands, class_pos, num_classes, launch, optimizer, pooled, scaled, grad_rows,
                grad_stride, flags=None) -> PieceMarks:  # fmt: skip
    """The marks of pieces and multi runs over all classes at once (two passes of
    ``_piece_marks_kernel`` and a running total), with the optional per-piece records and
    their order by gradient row (``grad_rows`` rows of ``grad_stride`` elements). ``flags``:
    (marks, counts) from the sorted-operands kernel (``RunsLaunch.marks_in_operands``): the
    first pass is skipped."""
    sorted_rows = sorted_operands[0]
    device, N = sorted_rows.device, sorted_rows.numel()
    piece = launch.piece_ids
    cells = N // piece + 1
    blocks = cdiv(N + 1, MARKS_BLOCK)
    ordered = launch.piece_order and pooled
    short = short_ids(launch, optimizer, pooled, N)
    counts = mark_counts(N, short, device) if flags is None else None
    # Pieces: at most a head per id, a grid point per cell, and the end.
    piece_starts = torch.empty(N + cells + 1, dtype=torch.int64, device=device)
    multi_heads = torch.empty(cells + 1, dtype=torch.int64, device=device)
    class_piece_pos = torch.empty(num_classes + 1, dtype=torch.int64, device=device)
    class_multi_pos = torch.empty(num_classes + 1, dtype=torch.int64, device=device)
    lists = (piece_starts, multi_heads, class_piece_pos, class_multi_pos)
    records = _piece_records(sorted_rows, N + cells + 1, scaled) if launch.piece_records else (piece_starts,) * 6
    if short:  # the short runs' and the other pieces' indices in the piece list, each class's first of both
        split = (torch.empty(N, dtype=torch.int32, device=device),
                 torch.empty(N + cells + 1, dtype=torch.int32, device=device),
                 *(torch.empty(num_classes + 1, dtype=torch.int64, device=device) for _ in range(2)))  # fmt: skip
    else:
        split = (piece_starts,) * 4  # never read
    marks = dict(PIECE=piece, BLOCK=MARKS_BLOCK, RECORDS=launch.piece_records, SCALED=scaled, SHORT=short,
                 num_warps=MARKS_WARPS)  # fmt: skip
    if flags is None:
        _piece_marks_kernel[(blocks,)](*sorted_operands, class_pos, num_classes, counts, *lists, *records, *split,
                                       counts, WRITE=False, **marks)  # fmt: skip
    else:  # RunsLaunch.marks_in_operands: the sorted-operands kernel counted them
        flags, counts = flags
    totals = torch.cumsum(counts, 0, dtype=torch.int32)
    _piece_marks_kernel[(blocks,)](*sorted_operands, class_pos, num_classes, totals, *lists, *records, *split,
                                   flags if flags is not None else totals, WRITE=True, FLAGS=flags is not None,
                                   **marks)  # fmt: skip
    # Ordered by gradient row only when pooled: unpooled ids each read a row of their own.
    piece_list, stops = piece_starts, piece_starts
    if ordered:
        piece_list, *records, stops = _ordered_pieces(grad_rows, grad_stride, piece_starts, class_piece_pos,
                                                      num_classes, records, N + cells + 1, scaled,
                                                      _multiprocessors(device))  # fmt: skip
    return PieceMarks(*lists, tuple(records), split, piece_list, stops, short, cells)


def _launch_pieces(grad_output, sorted_operands, weights, momentum1, momentum2, step, args, scaled, align, class_pos,
                   per_class, class_rows, launch, marks: PieceMarks, grad_cell=None) -> None:  # fmt: skip
    """The ``pieces`` design (``backward_pieces``) after its marks (``piece_marks``): per
    class its pieces, the group sums of its multi runs' cells (two levels, where the batch
    has ids enough) and its multi runs. No host sync: the counts stay on the device, the
    looping grids are fixed."""
    sorted_rows = sorted_operands[0]
    device, N = weights.device, sorted_rows.numel()
    piece, fan_in = launch.piece_ids, launch.fan_in
    piece_starts, multi_heads, class_piece_pos, class_multi_pos = marks[:4]
    records, split, piece_list, stops, short, cells = marks[4:]
    ordered = piece_list is not piece_starts
    sms = _multiprocessors(device)
    stride = max(c.block_d for c in per_class)
    cell_sums = torch.empty(2 * cells * stride, dtype=torch.float32, device=device)
    levels = [cdiv(cells, fan_in**level) + 1 for level in (1, 2)]
    group_sums, supergroup_sums = (torch.empty(n * stride, dtype=torch.float32, device=device) for n in levels)
    step, m1, m2, hyper, modes = _update_operands(args, weights, momentum1, momentum2, step, sorted_rows, align)
    _, sorted_w_start, sorted_dim, _, _ = sorted_operands
    # The pieces kernel's operands but its list, the list's class bounds and what varies by launch.
    operands = (grad_output, *sorted_operands, weights, m1, m2)
    after = (cell_sums, cells, stride, N, step, hyper)
    for klass, sizes in enumerate(per_class):
        rows = min(N, class_rows[klass])  # a head per distinct row
        common = dict(SCALED=scaled, BLOCK_D=sizes.block_d, PIECE=piece, UNROLL=sizes.piece_unroll,
                      GRAD_CELL=grad_cell is not None, REPEATS=launch.piece_repeats and sizes.block_d <= 256,
                      EVICT=launch.piece_evict, **modes)  # fmt: skip
        tail = (_cell_argument(grad_cell, grad_output),)
        if short and sizes.short_lanes:  # short runs first: a piece a lane, one warp, their own grid
            short_index, long_index, class_short_pos, class_long_pos = split
            _launch_piece_class(operands, (piece_starts, class_short_pos), after, klass, records, stops,
                                tail + (short_index,), rows, sizes.short_runs, sizes.short_lanes, sizes.short_warps,
                                launch.short_programs_per_sm, launch.piece_fit or launch.short_fit, sms, device,
                                dict(common, RECORDS=launch.piece_records, STOPS=False, INDIRECT=True))  # fmt: skip
            _launch_piece_class(operands, (piece_starts, class_long_pos), after, klass, records, stops,
                                tail + (long_index,), rows + cells, sizes.piece_runs, sizes.piece_lanes,
                                sizes.piece_warps, launch.piece_programs_per_sm, launch.piece_fit, sms, device,
                                dict(common, RECORDS=launch.piece_records, STOPS=False, INDIRECT=True))  # fmt: skip
        else:  # every piece of the class from the piece list (tiles wider than short_max_tile: its own sizes)
            _launch_piece_class(operands, (piece_list, class_piece_pos), after, klass, records, stops,
                                tail + (piece_list,), rows + cells, sizes.piece_runs, sizes.piece_lanes,
                                sizes.piece_warps, launch.piece_programs_per_sm, launch.piece_fit, sms, device,
                                dict(common, RECORDS=launch.piece_records, STOPS=ordered, INDIRECT=False))  # fmt: skip
        if N <= piece:
            continue  # no run crosses a grid point
        tree_grid = (sms * launch.loop_programs_per_sm,)
        for level, (children, parents) in enumerate(((cell_sums, group_sums), (group_sums, supergroup_sums))):
            unit = piece * fan_in**level
            if N > unit * fan_in:
                _cell_groups_kernel[tree_grid](
                    sorted_rows, children, parents, class_pos, klass, unit, stride,
                    BLOCK_D=sizes.block_d, FAN_IN=fan_in, PIECE=piece, num_warps=sizes.tree_warps,
                )  # fmt: skip
        _multi_runs_kernel[tree_grid](
            sorted_rows, sorted_w_start, sorted_dim, weights, m1, m2, cell_sums, cells, group_sums, supergroup_sums,
            multi_heads, class_multi_pos, class_pos, klass, stride, step, hyper,
            BLOCK_D=sizes.block_d, PIECE=piece, FAN_IN=fan_in, num_warps=sizes.tree_warps, **modes,
        )  # fmt: skip


def _launch_piece_class(operands, piece_list, after, klass, records, stops, tail, most_pieces, runs, lanes, warps,
                        per_sm, fit, sms, device, constexprs) -> None:  # fmt: skip
    """One launch of ``_pieces_kernel`` over a class's part of a piece list (``piece_list``:
    the list, its class bounds; ``tail``: the gradient cell and the index list): a looping grid
    of ``per_sm`` programs a multiprocessor (0: a program per ``lanes or runs`` pieces of
    ``most_pieces``), cut with ``fit`` to the programs that fit one."""
    constexprs = dict(constexprs, RUNS=runs, LANES=lanes, BARRIER=warps > 1)
    grid = cdiv(most_pieces, lanes or runs)
    fit_key = None
    if fit:  # (the key only then: small batches' backward is host-bound)
        weights, grad = operands[6], operands[0]
        fit_key = (str(device), weights.dtype, operands[1].dtype, grad.dtype, warps, tuple(sorted(constexprs.items())))
        if per_sm and fit_key in _RESIDENT:
            per_sm = min(per_sm, _RESIDENT[fit_key])
    if per_sm:
        grid = min(grid, sms * per_sm)
    cell_sums, cells, stride, N, step, hyper = after
    compiled = _pieces_kernel[(grid,)](*operands, piece_list[0], piece_list[1], cell_sums, cells, klass, stride, N,
                                       step, hyper, *records, stops, *tail, num_warps=warps, **constexprs)  # fmt: skip
    if fit and fit_key not in _RESIDENT:
        _record_resident(fit_key, compiled, device, warps)
