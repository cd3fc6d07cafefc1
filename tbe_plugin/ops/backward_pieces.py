"""The backward's piece design (``RunsLaunch.design == "pieces"``): work follows the runs.

The sorted positions are cut at every run's first id (a head) and, in a run that holds
two or more multiples of PIECE (grid points) after its head, at each of them: each
*piece* is part of one run. A run with at most one grid point after its head is one
piece (*whole*, fewer than 2 * PIECE ids); the others (*multi* runs, all longer than
PIECE ids) have a head piece of at most PIECE ids and one piece of PIECE ids (the last
one, up to PIECE) per grid point.

- ``_piece_marks_kernel`` (two passes: count per block, then write at the running totals):
  the pieces' first positions (``piece_starts``, sorted, with the end of the valid ids as
  a last entry, so that piece i ends at ``piece_starts[i + 1]``) and the multi runs' heads
  (``multi_heads``). Rows of all classes at once: a class's first id is a head, so no
  piece crosses classes, and no position needs its class.
- ``_pieces_kernel``, per class: RUNS pieces per program a round (1-2 warps), each summed
  in id order, UNROLL gathers in flight; a whole piece updates its row there and then,
  another stores its sum as a partial of its cell (first position // PIECE) in
  ``cell_sums``: a grid piece at slot ``cell``, a head piece at ``head_slots + cell`` (a
  cell has at most one of each: two runs starting in one cell cannot both cross its end).
  Distinct rows and hot rows' pieces alike are a piece a lane: the work follows the ids.
- ``_cell_groups_kernel``, per class and level: for each group of FAN_IN cells (groups)
  whose first grid point is inside a run begun before it, that run's partials in the
  group summed in a fixed order (HEAD's group sums, over cells of the global grid).
- ``_multi_runs_kernel``, per class: each multi run, a program each in turn: its head
  piece, its cells to the end of their group, its groups to the end of their supergroup,
  then its supergroups FAN_IN a step; then the row's update. A run of n ids costs about
  2 + log_FAN_IN(n / PIECE) rounds of loads in this kernel, however hot its row.

Every sum has a fixed order (a piece in id order, partials by cell): results are bitwise
the same from run to run. Memory beyond the sorted operands: two fp32 rows (of the widest
tile) per cell and 1/FAN_IN of one per level above, and 8 bytes per piece (41 with the
per-piece records, ``RunsLaunch.piece_records``).

Lives in ``tbe_plugin.ops``: imports Triton only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.backward_runs import _gather_gradients, _grad_pointer, _unit_sums, _update_row_state_and_weights
from tbe_plugin.ops.optimizers import load_row_state


@triton.jit
def _another_grid_point(sorted_rows_ptr, q, row, grid_point, end, PIECE: tl.constexpr):
    """For positions q that are grid points after their run's head (``grid_point``; row
    ``row``, valid ids before ``end``): whether the run holds another grid point after its
    head, the next (q + PIECE) or the previous (q - PIECE, itself after the head). Such a
    run is a multi run, cut at each of its grid points."""
    later = grid_point & (q + PIECE < end)
    earlier = grid_point & (q >= PIECE + 1)
    another = later & (tl.load(sorted_rows_ptr + q + PIECE, mask=later, other=-3) == row)
    another |= earlier & (tl.load(sorted_rows_ptr + q - PIECE, mask=earlier, other=-3) == row) & (
        tl.load(sorted_rows_ptr + q - PIECE - 1, mask=earlier, other=-3) == row)
    return another


@triton.jit
def _marks_at(sorted_rows_ptr, q, row, prev, inside, at_end, limit, PIECE: tl.constexpr, SHORT: tl.constexpr):
    """The marks at positions q (their rows ``row`` and their predecessors' ``prev``, read
    where ``inside``: q holds a valid id, before the end of the valid ids; ``at_end``: q is
    that end): (head, piece, multi, short). A piece starts at a head, at a cut grid point
    or at the end; a multi run's head is a head whose row is still there at the next grid
    point; a short run's head one whose row is gone SHORT positions after it (SHORT 0: none).
    Rows are read at other positions below ``limit``: the end, or any bound past it (the ids
    past the end, sentinels, never equal a valid id's row)."""
    head = inside & (row != prev)
    # A grid point after its run's head is cut when the run holds another one after the
    # head: the next (q + PIECE) or the previous (q - PIECE, itself after the head).
    cut = _another_grid_point(sorted_rows_ptr, q, row, inside & ~head & (q % PIECE == 0), limit, PIECE)
    piece = head | cut | at_end
    # A multi run's head: its run holds the second grid point after it.
    second_grid = (q // PIECE + 2) * PIECE
    crosses = head & (second_grid < limit)
    multi = crosses & (tl.load(sorted_rows_ptr + second_grid, mask=crosses, other=-3) == row)
    # A short run: at most SHORT ids, so its row is gone SHORT positions after its head (sorted).
    if SHORT > 0:
        beyond = head & (q + SHORT < limit)
        short = head & (tl.load(sorted_rows_ptr + q + SHORT, mask=beyond, other=-3) != row)
    else:
        short = head & (q < 0)  # none
    return head, piece, multi, short


@triton.jit
def _piece_marks_kernel(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    class_pos_ptr, num_classes, counts_ptr, piece_starts_ptr, multi_heads_ptr, class_piece_pos_ptr,
    class_multi_pos_ptr, piece_row_ptr, piece_flags_ptr, piece_w_start_ptr, piece_dim_ptr, piece_grad_offset_ptr,
    piece_scale_ptr, short_index_ptr, long_index_ptr, class_short_pos_ptr, class_long_pos_ptr,
    flags_ptr,
    WRITE: tl.constexpr, PIECE: tl.constexpr, BLOCK: tl.constexpr, RECORDS: tl.constexpr, SCALED: tl.constexpr,
    SHORT: tl.constexpr = 0, FLAGS: tl.constexpr = False,
):  # fmt: skip
    """Marks, per position q up to the end of the valid ids (``end``, the last class's
    bound; sentinel ids lie after it): a piece starts at q when q is a head, a grid point
    or ``end``; a multi run's head is a head whose row is still there at the next grid
    point. WRITE False: each program counts its block's marks of both kinds (pieces at
    ``counts_ptr[block]``, multi runs at ``counts_ptr[blocks + block]``); True: writes them
    at the running totals (then the inclusive sums over that one vector: a single 1-D scan,
    the multi runs' totals offset by all the pieces), and, for each class bound c (the
    classes' first positions and ``end``) in its block, the pieces and multi runs before c:
    where the class's pieces and multi runs begin in the lists (``class_piece_pos``,
    ``class_multi_pos``). Nothing reads the lists past ``end``'s piece, so they need no
    filling. RECORDS: beside each piece's start, what the pieces kernel needs of it (row,
    head and whole flags, the row's start in the weights, D, the first id's gradient row
    and factor), stored at the piece's index: read there contiguously, one round of
    dependent loads before the gathers instead of two. SHORT (``RunsLaunch.piece_short``; 0:
    off): runs of at most SHORT ids (whole pieces) are *short* pieces: their indices in the
    piece list go to ``short_index``, the other pieces' to ``long_index`` (int32; a third
    count a block, after the multi runs'), which the pieces kernel takes in launches of their
    own sizes (INDIRECT); ``class_short_pos``/``class_long_pos``: where each class's short and
    other pieces begin in those lists. FLAGS (``RunsLaunch.marks_in_operands``; WRITE only):
    the marks read from ``flags_ptr`` (the sorted-operands kernel's, one byte a position, with
    the counts that made ``counts_ptr``'s running totals) instead of found again."""
    block = tl.program_id(0)
    q = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    end = tl.load(class_pos_ptr + num_classes)
    inside = q < end
    if FLAGS:  # (WRITE) the marks the sorted-operands kernel wrote: bits piece, multi, short, head
        flags = tl.load(flags_ptr + q, mask=q <= end, other=0)
        piece, multi, short, head = (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0, (flags & 8) != 0
        row = tl.load(sorted_rows_ptr + q, mask=piece & inside, other=-1) if RECORDS else q  # (records only)
    else:
        row = tl.load(sorted_rows_ptr + q, mask=inside, other=-1)
        prev = tl.load(sorted_rows_ptr + q - 1, mask=inside & (q > 0), other=-2)
        head, piece, multi, short = _marks_at(sorted_rows_ptr, q, row, prev, inside, q == end, end, PIECE, SHORT)
    piece_marks = piece.to(tl.int32)
    multi_marks = multi.to(tl.int32)
    short_marks = short.to(tl.int32)
    # The three marks packed in one int32 (pieces and short runs at most BLOCK <= 2**11 - 1 a
    # block, 11 bits each; multi runs at most BLOCK / PIECE + 1, 10 bits): one sum and one
    # running sum for the three instead of three of each.
    tl.static_assert(BLOCK < 2048, "the packed marks hold at most 2047 pieces a block")
    packed = piece_marks + (short_marks << 11) + (multi_marks << 22)
    blocks = tl.num_programs(0)
    if WRITE:
        rank = tl.cumsum(packed, axis=0) - packed  # each mark's rank in its block, all three kinds
        piece_base = tl.load(counts_ptr + block - 1, mask=block > 0, other=0)
        multi_base = tl.load(counts_ptr + blocks + block - 1) - tl.load(counts_ptr + blocks - 1)
        piece_index = piece_base + (rank & 0x7FF)
        tl.store(piece_starts_ptr + piece_index, q, mask=piece)
        if SHORT > 0:
            short_base = tl.load(counts_ptr + 2 * blocks + block - 1) - tl.load(counts_ptr + 2 * blocks - 1)
            short_index = short_base + ((rank >> 11) & 0x7FF)
            # Both kinds by their index in the piece list (a piece stops where the next starts).
            tl.store(short_index_ptr + short_index, piece_index, mask=short)
            tl.store(long_index_ptr + piece_index - short_index, piece_index, mask=piece & inside & ~short)
        if RECORDS:
            real = piece & inside
            flags = head.to(tl.int8) + 2 * (head & ~multi).to(tl.int8)  # 1: a run's head, 2: the whole run
            tl.store(piece_row_ptr + piece_index, row, mask=real)
            tl.store(piece_flags_ptr + piece_index, flags, mask=real)
            tl.store(piece_w_start_ptr + piece_index, tl.load(sorted_w_start_ptr + q, mask=real, other=0), mask=real)
            tl.store(piece_dim_ptr + piece_index, tl.load(sorted_dim_ptr + q, mask=real, other=0), mask=real)
            tl.store(piece_grad_offset_ptr + piece_index, tl.load(sorted_grad_offset_ptr + q, mask=real, other=0),
                     mask=real)  # fmt: skip
            if SCALED:
                tl.store(piece_scale_ptr + piece_index, tl.load(sorted_scale_ptr + q, mask=real, other=1.0), mask=real)
        tl.store(multi_heads_ptr + multi_base + (rank >> 22), q, mask=multi)
        first_q = block.to(tl.int64) * BLOCK
        for k in range(0, num_classes + 1):  # the few bounds; only their blocks sum
            bound = tl.load(class_pos_ptr + k)
            if (bound >= first_q) & (bound < first_q + BLOCK):
                before = q < bound
                pieces_before = piece_base + tl.sum(tl.where(before, piece_marks, 0), axis=0)
                tl.store(class_piece_pos_ptr + k, pieces_before)
                tl.store(class_multi_pos_ptr + k, multi_base + tl.sum(tl.where(before, multi_marks, 0), axis=0))
                if SHORT > 0:
                    short_before = short_base + tl.sum(tl.where(before, short_marks, 0), axis=0)
                    tl.store(class_short_pos_ptr + k, short_before)
                    tl.store(class_long_pos_ptr + k, pieces_before - short_before)
    else:
        total = tl.sum(packed, axis=0)
        tl.store(counts_ptr + block, total & 0x7FF)
        tl.store(counts_ptr + blocks + block, total >> 22)
        if SHORT > 0:
            tl.store(counts_ptr + 2 * blocks + block, (total >> 11) & 0x7FF)


@triton.jit
def _piece_order_kernel(
    class_piece_pos_ptr, num_classes, piece_starts_ptr, piece_row_ptr, piece_flags_ptr, piece_w_start_ptr,
    piece_dim_ptr, piece_grad_offset_ptr, piece_scale_ptr, buckets_ptr, grad_rows, grad_stride,
    out_start_ptr, out_stop_ptr, out_row_ptr, out_flags_ptr, out_w_start_ptr, out_dim_ptr, out_grad_offset_ptr,
    out_scale_ptr,
    SCATTER: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The pieces in the order of the output-gradient rows they first read (``RunsLaunch.
    piece_order``): bucket = (class, gradient row of the piece's first id), class-major, so
    that each class keeps its range of the list. SCATTER False: counts per bucket; True
    (``buckets`` then holding each bucket's end): each piece's records, with its start and
    stop, written at a free place of its bucket (the order inside a bucket is whatever the
    atomics give: every piece updates its own row or partial slot, so no sum depends on it).
    Pieces that run together then read neighbouring gradient rows (the same batch row of
    neighbouring tables, or of one hot row's neighbouring bags): reads that L2 serves."""
    total = tl.load(class_piece_pos_ptr + num_classes)
    for base in tl.range(tl.program_id(0) * BLOCK, total, tl.num_programs(0) * BLOCK):
        j = base + tl.arange(0, BLOCK)
        live = j < total
        klass = tl.zeros([BLOCK], dtype=tl.int64)
        for k in range(1, num_classes):
            klass += (j >= tl.load(class_piece_pos_ptr + k)).to(tl.int64)
        g_first = tl.load(piece_grad_offset_ptr + j, mask=live, other=0)
        bucket = klass * grad_rows + g_first // grad_stride
        if SCATTER:
            at = tl.atomic_add(buckets_ptr + bucket, -1, mask=live) - 1
            tl.store(out_start_ptr + at, tl.load(piece_starts_ptr + j, mask=live, other=0), mask=live)
            tl.store(out_stop_ptr + at, tl.load(piece_starts_ptr + j + 1, mask=live, other=0), mask=live)
            tl.store(out_row_ptr + at, tl.load(piece_row_ptr + j, mask=live, other=0), mask=live)
            tl.store(out_flags_ptr + at, tl.load(piece_flags_ptr + j, mask=live, other=0), mask=live)
            tl.store(out_w_start_ptr + at, tl.load(piece_w_start_ptr + j, mask=live, other=0), mask=live)
            tl.store(out_dim_ptr + at, tl.load(piece_dim_ptr + j, mask=live, other=0), mask=live)
            tl.store(out_grad_offset_ptr + at, g_first, mask=live)
            if SCALED:
                tl.store(out_scale_ptr + at, tl.load(piece_scale_ptr + j, mask=live, other=1.0), mask=live)
        else:
            tl.atomic_add(buckets_ptr + bucket, 1, mask=live)


@triton.jit
def _piece_operands(
    piece_starts_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    piece_row_ptr, piece_flags_ptr, piece_w_start_ptr, piece_dim_ptr, piece_grad_offset_ptr, piece_scale_ptr,
    piece_stop_ptr, piece_index_ptr, i, last, num_indices, SCALED: tl.constexpr, ALIGN: tl.constexpr,
    RECORDS: tl.constexpr, STOPS: tl.constexpr, INDIRECT: tl.constexpr,
):  # fmt: skip
    """What pieces ``i`` need before their gathers, packed: (first position, length (0 past
    ``last``), flags (1: the piece is its run's head, 2: the whole run), row, D, where the
    row starts in the weights, the first id's gradient row and factor). RECORDS: one round
    of contiguous loads (the marks kernel's records); otherwise two (the piece list, then
    the ids and their neighbours). STOPS: each piece's stop from ``piece_stop`` (the ordered
    list), not the next start. INDIRECT: ``i`` indexes ``piece_index``, which holds the
    pieces' indices in the piece list (``RunsLaunch.piece_short``'s two lists)."""
    live = i < last
    if INDIRECT:
        j = tl.load(piece_index_ptr + i, mask=live, other=0)
    else:
        j = i
    start = tl.load(piece_starts_ptr + j, mask=live, other=0)
    if STOPS:
        stop = tl.load(piece_stop_ptr + i, mask=live, other=0)
    else:
        stop = tl.load(piece_starts_ptr + j + 1, mask=live, other=0)
    if RECORDS:
        row = tl.load(piece_row_ptr + j, mask=live, other=-1)
        flags = tl.load(piece_flags_ptr + j, mask=live, other=0).to(tl.int32)
        dim = tl.load(piece_dim_ptr + j, mask=live, other=0) // ALIGN * ALIGN  # see _gather_gradients
        w_start = tl.load(piece_w_start_ptr + j, mask=live, other=0) // ALIGN * ALIGN
        g_first = tl.load(piece_grad_offset_ptr + j, mask=live, other=0)
        s_first = tl.load(piece_scale_ptr + j, mask=live & SCALED, other=1.0)
    else:
        row = tl.load(sorted_rows_ptr + start, mask=live, other=-1)
        prev = tl.load(sorted_rows_ptr + start - 1, mask=live & (start > 0), other=-2)
        after = tl.load(sorted_rows_ptr + stop, mask=live & (stop < num_indices), other=-2)
        head = row != prev
        flags = head.to(tl.int32) + 2 * (head & (after != row)).to(tl.int32)
        dim = tl.load(sorted_dim_ptr + start, mask=live, other=0) // ALIGN * ALIGN
        w_start = tl.load(sorted_w_start_ptr + start, mask=live, other=0) // ALIGN * ALIGN
        g_first = tl.load(sorted_grad_offset_ptr + start, mask=live, other=0).to(tl.int64)
        s_first = tl.load(sorted_scale_ptr + start, mask=live & SCALED, other=1.0)
    length = tl.where(live, stop - start, 0).to(tl.int32)  # a piece holds fewer than 2**31 ids
    return start, length, flags, row, dim, w_start, g_first, s_first


@triton.jit
def _step_offsets(sorted_grad_offset_ptr, sorted_scale_ptr, start, length, k0, SCALED: tl.constexpr,
                  UNROLL: tl.constexpr):  # fmt: skip
    """Gradient-row starts and factors of ids k0 .. k0 + UNROLL - 1 of pieces that begin at
    ``start`` and hold ``length`` ids: two tuples of UNROLL [RUNS] vectors (0 and 1 past a
    piece's end)."""
    g = ()
    s = ()
    for u in tl.static_range(UNROLL):
        member = (k0 + u) < length
        # int64 whatever the stored type (RunsLaunch.lean_operands stores int32).
        g = g + (tl.load(sorted_grad_offset_ptr + start + k0 + u, mask=member, other=0).to(tl.int64),)
        s = s + (tl.load(sorted_scale_ptr + start + k0 + u, mask=member & SCALED, other=1.0),)
    return g, s


@triton.jit
def _pieces_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, piece_starts_ptr, class_piece_pos_ptr, cell_sums_ptr, head_slots,
    klass, slot_stride, num_indices, step_ptr, hyper_ptr, piece_row_ptr, piece_flags_ptr, piece_w_start_ptr,
    piece_dim_ptr, piece_grad_offset_ptr, piece_scale_ptr, piece_stop_ptr, grad_cell_ptr, piece_index_ptr,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr, PIECE: tl.constexpr,
    RUNS: tl.constexpr, UNROLL: tl.constexpr, BARRIER: tl.constexpr, RECORDS: tl.constexpr, STOPS: tl.constexpr,
    GRAD_CELL: tl.constexpr, LANES: tl.constexpr = 0, INDIRECT: tl.constexpr = False, REPEATS: tl.constexpr = False,
    EVICT: tl.constexpr = False,
):  # fmt: skip
    """The class's pieces, RUNS a round per program (a fixed grid looping over them): each
    piece's gradient rows summed in id order (the first id, then UNROLL a step, a step's
    gathers issued together with the loads of the next step's gradient-row starts: one round
    trip to memory a step, not two); a whole run is updated, a piece of a multi run stores
    its sum as a partial of its cell. (Loading whole rounds of pieces ahead as well was
    slower everywhere: its carried operands took 113-146 registers a thread against 60,
    H200 at aabad7f, results/NOTES_2026-12-02.md part 6.) GRAD_CELL: the output gradient
    is read at the address in ``grad_cell_ptr`` (``_grad_pointer``), ``grad_ptr`` giving its type.
    LANES (``RunsLaunch.piece_lanes``; 0: off): a round is LANES pieces whose operands are
    loaded one piece a lane (one round of dependent loads for LANES pieces, held in one
    register each a thread), then summed RUNS at a time, each group's operands taken from
    the lanes that hold them (``tl.gather``): a group of one-id pieces then waits on one
    round trip to memory (its rows, state and gradients) instead of three. INDIRECT: the
    class's pieces are the entries of ``piece_index`` (indices into the piece list:
    ``RunsLaunch.piece_short``'s lists of short runs and of the other pieces). REPEATS:
    ``_piece_group``'s. EVICT (``RunsLaunch.piece_evict``): the rows' and state's loads and
    stores marked L2 evict-first, the gradient gathers evict-last."""
    grad_ptr = _grad_pointer(grad_ptr, grad_cell_ptr, GRAD_CELL)
    first = tl.load(class_piece_pos_ptr + klass)
    last = tl.load(class_piece_pos_ptr + klass + 1)
    lane = tl.arange(0, RUNS)
    cols = tl.arange(0, BLOCK_D)
    lists = (piece_starts_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
             sorted_scale_ptr, piece_row_ptr, piece_flags_ptr, piece_w_start_ptr, piece_dim_ptr,
             piece_grad_offset_ptr, piece_scale_ptr, piece_stop_ptr, piece_index_ptr)  # fmt: skip
    if LANES == 0:
        for base in tl.range(first + tl.program_id(0) * RUNS, last, tl.num_programs(0) * RUNS, num_stages=1):
            start, length, flags, row, dim, w_start, g_first, s_first = _piece_operands(
                *lists, base + lane, last, num_indices, SCALED, ALIGN, RECORDS, STOPS, INDIRECT
            )
            _piece_group(grad_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr,
                         cell_sums_ptr, head_slots, slot_stride, step_ptr, hyper_ptr, start, length, flags, row, dim,
                         w_start, g_first, s_first, cols, SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
                         ALIGN, PIECE, RUNS, BLOCK_D, UNROLL, BARRIER, REPEATS, EVICT)  # fmt: skip
    else:
        lanes = tl.arange(0, LANES)
        for base in tl.range(first + tl.program_id(0) * LANES, last, tl.num_programs(0) * LANES, num_stages=1):
            starts, lengths, flag_lanes, rows, dims, w_starts, g_firsts, s_firsts = _piece_operands(
                *lists, base + lanes, last, num_indices, SCALED, ALIGN, RECORDS, STOPS, INDIRECT
            )
            for group in tl.range(0, tl.cdiv(tl.minimum(last - base, LANES), RUNS), num_stages=1):
                at = group * RUNS + lane  # the group's pieces: lanes of the round
                _piece_group(grad_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, weights_ptr, momentum1_ptr,
                             momentum2_ptr, cell_sums_ptr, head_slots, slot_stride, step_ptr, hyper_ptr,
                             tl.gather(starts, at, 0), tl.gather(lengths, at, 0), tl.gather(flag_lanes, at, 0),
                             tl.gather(rows, at, 0), tl.gather(dims, at, 0) // ALIGN * ALIGN,
                             tl.gather(w_starts, at, 0) // ALIGN * ALIGN,
                             tl.gather(g_firsts, at, 0), tl.gather(s_firsts, at, 0), cols, SCALED, OPTIMIZER,
                             WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, ALIGN, PIECE, RUNS, BLOCK_D, UNROLL,
                             BARRIER, REPEATS, EVICT)  # fmt: skip


@triton.jit
def _piece_group(grad_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr,
                 cell_sums_ptr, head_slots, slot_stride, step_ptr, hyper_ptr, start, length, flags, row, dim, w_start,
                 g_first, s_first, cols, SCALED: tl.constexpr, OPTIMIZER: tl.constexpr,
                 WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, ALIGN: tl.constexpr,
                 PIECE: tl.constexpr, RUNS: tl.constexpr, BLOCK_D: tl.constexpr, UNROLL: tl.constexpr,
                 BARRIER: tl.constexpr, REPEATS: tl.constexpr = False, EVICT: tl.constexpr = False):  # fmt: skip
    """A group of pieces side by side ([RUNS] operands, ``_piece_operands``): each one's
    gradient rows summed in id order (the first id, then UNROLL a step, a step's gathers
    issued together with the loads of the next step's gradient-row starts); a whole run
    updated, a piece of a multi run stored as a partial of its cell. REPEATS
    (``RunsLaunch.piece_repeats``): an id that reads its predecessor's gradient row reuses it."""
    live = length > 0
    head = (flags & 1) != 0
    whole = live & ((flags & 2) != 0)
    ahead_g, ahead_s = _step_offsets(sorted_grad_offset_ptr, sorted_scale_ptr, start, length, 1, SCALED, UNROLL)
    row_mask = live[:, None] & (cols[None, :] < dim[:, None])
    w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
    w, m1, m2 = load_row_state(w_ptrs, w_start, row, cols, row_mask, whole, momentum1_ptr, momentum2_ptr,
                               OPTIMIZER, EVICT)  # fmt: skip
    total = tl.zeros([RUNS, BLOCK_D], dtype=tl.float32)
    if REPEATS:
        # An id whose gradient row is its predecessor's (the same bag again: a repeat of
        # the row in one bag, adjacent in the stable sort) takes the row already loaded,
        # unscaled, instead of a gather: the same values added in the same order.
        last_g = g_first
        last_raw = _gather_gradients(grad_ptr, g_first, s_first, live, cols, dim, False, ALIGN, EVICT)
        total += last_raw * s_first[:, None] if SCALED else last_raw
    else:
        total += _gather_gradients(grad_ptr, g_first, s_first, live, cols, dim, SCALED, ALIGN, EVICT)
    # Ids 1.. of the pieces, UNROLL a step: the step's gathers issued together with the
    # loads of the next step's gradient-row starts, then summed in id order.
    for k0 in tl.range(1, tl.max(length, axis=0), UNROLL, num_stages=1):
        step_g, step_s = ahead_g, ahead_s
        ahead_g, ahead_s = _step_offsets(sorted_grad_offset_ptr, sorted_scale_ptr, start, length, k0 + UNROLL,
                                         SCALED, UNROLL)  # fmt: skip
        if REPEATS:
            for u in tl.static_range(UNROLL):
                member = (k0 + u) < length
                repeat = member & (step_g[u] == last_g)
                raw = _gather_gradients(grad_ptr, step_g[u], step_s[u], member & ~repeat, cols, dim, False, ALIGN,
                                         EVICT)  # fmt: skip
                raw = tl.where(repeat[:, None], last_raw, raw)
                total += raw * step_s[u][:, None] if SCALED else raw
                last_g, last_raw = step_g[u], raw
        else:
            for u in tl.static_range(UNROLL):
                total += _gather_gradients(grad_ptr, step_g[u], step_s[u], (k0 + u) < length, cols, dim, SCALED,
                                           ALIGN, EVICT)  # fmt: skip
    _update_row_state_and_weights(
        total, w, m1, m2, whole, row_mask, w_ptrs, w_start, row, cols, dim, momentum1_ptr, momentum2_ptr,
        step_ptr, hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
        BARRIER, EVICT,
    )  # fmt: skip
    partial = live & ~whole
    slot = start // PIECE + tl.where(head, head_slots, 0)
    tl.store(cell_sums_ptr + slot[:, None] * slot_stride + cols[None, :], total, mask=partial[:, None])
    if BARRIER:
        tl.debug_barrier()  # the next group's loads of row-wise state after this group's stores


@triton.jit
def _cell_groups_kernel(
    sorted_rows_ptr, child_sums_ptr, group_sums_ptr, class_pos_ptr, klass, unit_ids, slot_stride,
    BLOCK_D: tl.constexpr, FAN_IN: tl.constexpr, PIECE: tl.constexpr,
):  # fmt: skip
    """For each group of FAN_IN units (cells, or groups of cells) of ``unit_ids`` ids whose
    first position b lies inside the class and inside a multi run begun before b (one that
    holds another grid point after its head: b + PIECE, or b - PIECE after the head): the
    sum of that run's units in the group (a prefix of it), in the group's slot. Other
    groups store nothing (a whole piece that holds b left no partials to sum)."""
    lo = tl.load(class_pos_ptr + klass)
    hi = tl.load(class_pos_ptr + klass + 1)
    cols = tl.arange(0, BLOCK_D)
    group_ids = unit_ids * FAN_IN
    for group in tl.range(lo // group_ids + 1 + tl.program_id(0), (hi + group_ids - 1) // group_ids,
                          tl.num_programs(0)):  # fmt: skip
        b = group * group_ids
        row = tl.load(sorted_rows_ptr + b, mask=b < hi, other=-1)
        before = tl.load(sorted_rows_ptr + b - 1, mask=(b > lo) & (b < hi), other=-2)
        if _another_grid_point(sorted_rows_ptr, b, row, row == before, hi, PIECE):
            total = _unit_sums(sorted_rows_ptr, child_sums_ptr, group * FAN_IN, (group + 1) * FAN_IN, unit_ids, 0, hi,
                               row, 0, slot_stride, cols, FAN_IN)  # fmt: skip
            tl.store(group_sums_ptr + group * slot_stride + cols, total)


@triton.jit
def _multi_runs_kernel(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, cell_sums_ptr,
    head_slots, group_sums_ptr, supergroup_sums_ptr, multi_heads_ptr, class_multi_pos_ptr, class_pos_ptr,
    klass, slot_stride, step_ptr, hyper_ptr,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    BLOCK_D: tl.constexpr, ALIGN: tl.constexpr, PIECE: tl.constexpr, FAN_IN: tl.constexpr,
):  # fmt: skip
    """The class's multi runs, a program each in turn: the head piece's sum, then the
    partials of the cells the run enters to the end of their group, of the groups to the
    end of their supergroup, and of the supergroups, FAN_IN a step; then the row's update."""
    hi = tl.load(class_pos_ptr + klass + 1)
    first_run = tl.load(class_multi_pos_ptr + klass)
    last_run = tl.load(class_multi_pos_ptr + klass + 1)
    cols = tl.arange(0, BLOCK_D)
    one = tl.arange(0, 1)
    group_ids = PIECE * FAN_IN
    supergroup_ids = group_ids * FAN_IN
    for i in tl.range(first_run + tl.program_id(0), last_run, tl.num_programs(0)):
        head = tl.load(multi_heads_ptr + i)
        row = tl.load(sorted_rows_ptr + head)
        w_start = tl.load(sorted_w_start_ptr + head + one) // ALIGN * ALIGN
        dim = tl.load(sorted_dim_ptr + head + one) // ALIGN * ALIGN
        active = one >= 0
        row_mask = cols[None, :] < dim[:, None]
        w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
        w, m1, m2 = load_row_state(w_ptrs, w_start, row + one, cols, row_mask, active, momentum1_ptr, momentum2_ptr,
                                   OPTIMIZER)  # fmt: skip
        cell = head // PIECE
        total = tl.load(cell_sums_ptr + (head_slots + cell) * slot_stride + cols)
        # The units the run enters after its head's cell, level by level: each level's
        # units up to the end of the next level's unit, while the run goes on.
        nxt = cell + 1
        group_end = (nxt // FAN_IN + 1) * FAN_IN
        total += _unit_sums(sorted_rows_ptr, cell_sums_ptr, nxt, group_end, PIECE, 0, hi, row, 0, slot_stride, cols,
                            FAN_IN)  # fmt: skip
        edge = group_end * PIECE
        if tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row:
            nxt = group_end // FAN_IN
            supergroup_end = (nxt // FAN_IN + 1) * FAN_IN
            total += _unit_sums(sorted_rows_ptr, group_sums_ptr, nxt, supergroup_end, group_ids, 0, hi, row, 0,
                                slot_stride, cols, FAN_IN)  # fmt: skip
            nxt = supergroup_end // FAN_IN
            edge = nxt * supergroup_ids
            going_on = tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row
            while going_on:
                total += _unit_sums(sorted_rows_ptr, supergroup_sums_ptr, nxt, nxt + FAN_IN, supergroup_ids, 0, hi,
                                    row, 0, slot_stride, cols, FAN_IN)  # fmt: skip
                nxt += FAN_IN
                edge = nxt * supergroup_ids
                going_on = tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row
        _update_row_state_and_weights(
            total[None, :], w, m1, m2, active, row_mask, w_ptrs, w_start, row + one, cols, dim, momentum1_ptr,
            momentum2_ptr, step_ptr, hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE,
            STOCHASTIC_ROUNDING, True,
        )  # fmt: skip
        tl.debug_barrier()  # the next run's loads after this row's stores, in every warp
