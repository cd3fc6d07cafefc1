"""The backward's per-run kernels: each row's run of sorted ids summed and the optimizer
applied to the row (steps 3 to 5 of ``embedding_backward``, which launches them).

- ``_chunk_kernel`` (segmented scan) and ``_chunk_walk_kernel`` (each run walked by its
  first lane): fixed chunks of CHUNK sorted ids; the runs that start in the chunk and end
  in it or in the next one are updated there, longer runs leave pieces.
- ``_block_kernel``: per block of BLOCK_CHUNKS chunks that a run enters from before, the sum
  of that run's pieces in the block.
- ``_crossing_kernel``: each longer run (hot rows) sums its pieces and blocks, then updates.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.optimizers import apply_update, load_row_state


@triton.jit
def _gather_gradients(grad_ptr, start, scale, mask, cols, dim, SCALED: tl.constexpr, ALIGN: tl.constexpr):
    """Output-gradient rows starting at ``start`` [len(start), BLOCK_D] in fp32, times
    ``scale`` (row starts are multiples of ALIGN: written so, Triton reads them with
    vector loads). Callers load ``start`` and ``scale`` early, with no dependence."""
    start = start // ALIGN * ALIGN
    col_mask = mask[:, None] & (cols[None, :] < dim[:, None])
    g = tl.load(grad_ptr + start[:, None] + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
    if SCALED:
        g = g * scale[:, None]
    return g


@triton.jit
def _id_operands(grad_offset_ptr, scale_ptr, q, mask, SCALED: tl.constexpr):
    """Output-gradient row start and factor of sorted ids ``q``."""
    start = tl.load(grad_offset_ptr + q, mask=mask, other=0)
    scale = tl.load(scale_ptr + q, mask=mask & SCALED, other=1.0)
    return start, scale


@triton.jit
def _row_operands(weights_ptr, w_start_ptr, dim_ptr, q, valid, cols, ALIGN: tl.constexpr):
    """Row start (a multiple of ALIGN), D, column mask and weight pointers of sorted ids q."""
    w_start = tl.load(w_start_ptr + q, mask=valid, other=0) // ALIGN * ALIGN
    dim = tl.load(dim_ptr + q, mask=valid, other=0)
    row_mask = valid[:, None] & (cols[None, :] < dim[:, None])
    return w_start, dim, row_mask, weights_ptr + w_start[:, None] + cols[None, :]


@triton.jit
def _edge_rows(sorted_rows_ptr, c0, num_indices, CHUNK: tl.constexpr):
    """Rows at the previous chunk's start - 1, at the next chunk's start and at the start of
    the chunk after next: whether the run at this chunk's start began in the previous
    chunk and ends here, and whether the run at its end goes past the next chunk (long)."""
    before_prev = tl.load(sorted_rows_ptr + c0 - CHUNK - 1, mask=c0 - CHUNK - 1 >= 0, other=-1)
    beyond_next = tl.load(sorted_rows_ptr + c0 + CHUNK, mask=c0 + CHUNK < num_indices, other=-1)
    after_next = tl.load(sorted_rows_ptr + c0 + 2 * CHUNK, mask=c0 + 2 * CHUNK < num_indices, other=-1)
    return before_prev, beyond_next, after_next


@triton.jit
def _ahead_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q, row,
               num_indices, cols, SCALED: tl.constexpr, CHUNK: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """The summed gradient rows of ``row``'s ids in the next chunk (a prefix of it)."""
    ahead = q + CHUNK
    member = tl.load(sorted_rows_ptr + ahead, mask=ahead < num_indices, other=-1) == row
    start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, ahead, member, SCALED)
    dim = tl.load(sorted_dim_ptr + ahead, mask=member, other=0)
    return tl.sum(_gather_gradients(grad_ptr, start, scale, member, cols, dim, SCALED, ALIGN), axis=0)


@triton.jit
def _segmented_add(starts_a, sum_a, starts_b, sum_b):
    """Combine of a segmented inclusive sum: ``b`` follows ``a``; a segment start in ``b``
    drops what came before it."""
    return starts_a | starts_b, tl.where(starts_b != 0, sum_b, sum_a + sum_b)


@triton.jit
def _chunk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
    sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, pieces_ptr,
    step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """Updates the rows whose whole run of ids lies in this chunk of CHUNK sorted ids;
    leaves the chunk's part of runs that cross its edges in ``pieces``.

    All the chunk's gradient rows are gathered at once and summed per piece (a maximal run
    of one row inside the chunk) by a segmented scan down the chunk: the piece's sum lands
    on its last lane, which applies the update. Loads come in two dependent rounds: the
    sorted arrays, then gradient rows, weights and optimizer state together; no run length
    puts a chain of loads behind them.

    A run that starts here and ends in the next chunk is summed and updated here too (its
    ids there are gathered at once); the next chunk leaves it alone. Only runs longer
    than that go through ``pieces`` and ``_crossing_kernel``.
    """
    chunk = tl.program_id(0).to(tl.int64)
    c0 = chunk * CHUNK
    q = c0 + tl.arange(0, CHUNK)
    cols = tl.arange(0, BLOCK_D)
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=in_range & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < num_indices, other=-1)
    first_row = tl.load(sorted_rows_ptr + c0)
    before_first = tl.load(sorted_rows_ptr + c0 - 1, mask=c0 > 0, other=-1)
    before_prev, beyond_next, after_next = _edge_rows(sorted_rows_ptr, c0, num_indices, CHUNK)
    start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, in_range, SCALED)
    w_start, dim, row_mask, w_ptrs = _row_operands(
        weights_ptr, sorted_w_start_ptr, sorted_dim_ptr, q, in_range, cols, ALIGN
    )
    valid = row != sentinel
    head = valid & (row != prev)  # the first id of its row's run
    tail = valid & (row != nxt)  # the last
    last = tl.max(tl.where(valid, q, -1), axis=0)
    is_last = valid & (q == last)
    last_row = tl.max(tl.where(is_last, row, -1), axis=0)
    piece_end = tail | is_last  # where a piece's sum lands
    # The run at the chunk's start began before it unless its first id is here.
    began_here = valid & ((row != first_row) | (before_first != first_row))
    goes_on = is_last & ~tail  # the last piece's run goes on past the chunk
    long_run = after_next == last_row  # ... and past the next chunk too
    extends = piece_end & began_here & goes_on & ~long_run
    updated = piece_end & began_here & (~goes_on | extends)
    w, m1, m2 = load_row_state(
        w_ptrs, w_start, row, cols, row_mask, updated, momentum1_ptr, momentum2_ptr, OPTIMIZER
    )
    g = _gather_gradients(grad_ptr, start, scale, valid, cols, dim, SCALED, ALIGN)
    piece_start = (head | (q == c0)).to(tl.int32)
    _, run_sum = tl.associative_scan(
        (tl.broadcast_to(piece_start[:, None], (CHUNK, BLOCK_D)), g), 0, _segmented_add
    )
    # A run that starts here and ends in the next chunk: its ids there (a prefix of that
    # chunk) are added at once.
    if tl.max(extends.to(tl.int32), axis=0) > 0:
        ahead = _ahead_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q,
                           last_row, num_indices, cols, SCALED, CHUNK, ALIGN)  # fmt: skip
        run_sum += tl.where(extends[:, None], ahead[None, :], 0.0)
    apply_update(
        run_sum, w, m1, m2, updated, row_mask, w_ptrs, w_start, row, cols, dim,
        momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
        OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip
    # Pieces of long runs: [chunk, 0] the first run's part (when it began earlier and the
    # previous chunk did not finish it: that happens when it began there and ends here),
    # [chunk, 1] the last run's part (when it starts here and is long).
    finished_before = (before_prev != first_row) & (beyond_next != first_row)
    piece_ptrs = pieces_ptr + chunk * 2 * BLOCK_D + cols[None, :] + 0 * q[:, None]
    first_piece = piece_end & (row == first_row) & ~began_here & ~finished_before
    tl.store(piece_ptrs, run_sum, mask=first_piece[:, None])
    tl.store(piece_ptrs + BLOCK_D, run_sum, mask=(goes_on & began_here & long_run)[:, None])


@triton.jit
def _chunk_walk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
    sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, pieces_ptr,
    step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """``_chunk_kernel``'s work with each run summed by its first id's lane, one id per step
    after the first two: for chunks of more than SCAN_MAX_IDS ids, where the scan is slower.

    A run that starts here and ends in the next chunk is summed and updated here too (its
    ids there are gathered at once); the next chunk leaves it alone. Only runs longer
    than that go through ``pieces`` and ``_crossing_kernel``.

    The common case issues its loads in two dependent rounds: first the sorted arrays
    (rows, row starts, D, gradient rows and factors of ids q and q + 1), then the gradient
    rows, weights and optimizer state together.
    """
    chunk = tl.program_id(0).to(tl.int64)
    c0 = chunk * CHUNK
    q = c0 + tl.arange(0, CHUNK)
    lane = tl.arange(0, CHUNK)
    cols = tl.arange(0, BLOCK_D)
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=in_range & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < num_indices, other=-1)
    first_row = tl.load(sorted_rows_ptr + c0)
    last_row = tl.load(sorted_rows_ptr + tl.minimum(c0 + CHUNK, num_indices) - 1)
    before_prev, beyond_next, after_next = _edge_rows(sorted_rows_ptr, c0, num_indices, CHUNK)
    start0, scale0 = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, in_range, SCALED)
    start1, scale1 = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q + 1, q + 1 < num_indices, SCALED)
    w_start, dim, row_mask, w_ptrs = _row_operands(
        weights_ptr, sorted_w_start_ptr, sorted_dim_ptr, q, in_range, cols, ALIGN
    )
    valid = row != sentinel
    head = valid & (row != prev)  # the first id of its row's run
    tail = valid & (row != nxt)  # the last
    last = tl.max(tl.where(valid, q, -1), axis=0)
    # Pieces: the maximal runs of one row inside this chunk, each owned by the lane of
    # its first id. Rows whose run starts here load their weights and state now.
    piece_head = valid & ((lane == 0) | head)
    w, m1, m2 = load_row_state(
        w_ptrs, w_start, row, cols, row_mask, piece_head & head, momentum1_ptr, momentum2_ptr, OPTIMIZER
    )
    if (first_row == last_row) & (first_row != sentinel):
        # One row fills the chunk (a hot row): gather all its ids at once and reduce.
        g = _gather_gradients(grad_ptr, start0, scale0, valid, cols, dim, SCALED, ALIGN)
        run_sum = tl.where((lane == 0)[:, None], tl.sum(g, axis=0)[None, :], 0.0)
    else:
        # Each piece's lane adds its ids' gradients in sorted order: the first two ids
        # at once (most runs have one or two), then one id per step.
        second = piece_head & (q + 1 <= last) & (nxt == row)
        run_sum = _gather_gradients(grad_ptr, start0, scale0, piece_head, cols, dim, SCALED, ALIGN)
        run_sum += _gather_gradients(grad_ptr, start1, scale1, second, cols, dim, SCALED, ALIGN)
        pos = q + 2
        active = second & (pos <= last)
        active &= tl.load(sorted_rows_ptr + pos, mask=active, other=-1) == row
        while tl.max(active.to(tl.int32), axis=0) > 0:
            start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, pos, active, SCALED)
            run_sum += _gather_gradients(grad_ptr, start, scale, active, cols, dim, SCALED, ALIGN)
            pos += 1
            active &= pos <= last
            active &= tl.load(sorted_rows_ptr + pos, mask=active, other=-1) == row
    # The piece holding the chunk's last id goes on past the chunk when that id is not
    # its run's tail. Such a run that started here is finished here when it ends in the
    # next chunk: its ids there (a prefix of that chunk) are added at once.
    last_goes_on = tl.max(tl.where(valid & (q == last) & ~tail, 1, 0), axis=0) > 0
    long_run = last_goes_on & (after_next == last_row)
    goes_on = piece_head & (row == last_row) & last_goes_on
    extends = goes_on & head & ~long_run
    if tl.max(extends.to(tl.int32), axis=0) > 0:
        ahead = _ahead_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q,
                           last_row, num_indices, cols, SCALED, CHUNK, ALIGN)  # fmt: skip
        run_sum += tl.where(extends[:, None], ahead[None, :], 0.0)
    complete = piece_head & head & (~goes_on | extends)
    # The run at this chunk's start, begun earlier: the previous chunk finished it when it
    # began there and ends here; otherwise this chunk's part of it is a piece.
    began_in_previous = before_prev != first_row
    finished_before = began_in_previous & (beyond_next != first_row)
    apply_update(
        run_sum, w, m1, m2, complete, row_mask, w_ptrs, w_start, row, cols, dim,
        momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
        OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip
    # Pieces of long runs: [chunk, 0] the first run's part (when it began earlier and the
    # previous chunk did not finish it), [chunk, 1] the last run's part (when it starts
    # here and is long).
    piece_ptrs = pieces_ptr + chunk * 2 * BLOCK_D + cols[None, :] + 0 * q[:, None]
    first_piece = piece_head & (lane == 0) & ~head & ~finished_before
    tl.store(piece_ptrs, run_sum, mask=first_piece[:, None])
    tl.store(piece_ptrs + BLOCK_D, run_sum, mask=(goes_on & head & long_run)[:, None])


@triton.jit
def _block_kernel(
    sorted_rows_ptr, pieces_ptr, block_pieces_ptr, num_indices, sentinel,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr, BLOCK_CHUNKS: tl.constexpr,
):  # fmt: skip
    """For a block of BLOCK_CHUNKS chunks that a run enters (begun before it): the sum of
    that run's pieces in the block, for ``_crossing_kernel`` (read for long runs only; other
    blocks write zeros). The chunks holding the run are those whose first id is its row: a
    prefix of the block, the ids being sorted."""
    block = tl.program_id(0).to(tl.int64)
    num_chunks = (num_indices + CHUNK - 1) // CHUNK
    first_chunk = block * BLOCK_CHUNKS
    end_chunk = tl.minimum(first_chunk + BLOCK_CHUNKS, num_chunks)
    row = tl.load(sorted_rows_ptr + first_chunk * CHUNK)
    before = tl.load(sorted_rows_ptr + first_chunk * CHUNK - 1, mask=first_chunk > 0, other=-1)
    cols = tl.arange(0, BLOCK_D)
    span = tl.arange(0, SPAN)
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    going_on = (before == row) & (row != sentinel)
    next_chunk = first_chunk
    while going_on:
        ks = next_chunk + span
        in_block = ks < end_chunk
        member = in_block & (tl.load(sorted_rows_ptr + ks * CHUNK, mask=in_block, other=-1) == row)
        piece = tl.load(pieces_ptr + ks[:, None] * 2 * BLOCK_D + cols[None, :], mask=member[:, None], other=0.0)
        total += tl.sum(piece, axis=0)
        next_chunk += SPAN
        going_on = (tl.min(member.to(tl.int32), axis=0) == 1) & (next_chunk < end_chunk)
    tl.store(block_pieces_ptr + block * BLOCK_D + cols, total)


@triton.jit
def _crossing_kernel(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, weights_ptr, momentum1_ptr,
    momentum2_ptr, pieces_ptr, block_pieces_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay,
    seed, num_indices, sentinel,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr, ALIGN: tl.constexpr,
    CHUNKS_PER_PROGRAM: tl.constexpr, BLOCK_CHUNKS: tl.constexpr,
):  # fmt: skip
    """Runs that begin in one chunk and go on past the next (CHUNKS_PER_PROGRAM chunks
    looked at per program, most with none): add each run's pieces up to the end of its
    first block of BLOCK_CHUNKS chunks, then the blocks' sums (``_block_kernel``), SPAN at
    a time; then update its row."""
    num_chunks = (num_indices + CHUNK - 1) // CHUNK
    num_blocks = (num_chunks + BLOCK_CHUNKS - 1) // BLOCK_CHUNKS
    chunks = tl.program_id(0).to(tl.int64) * CHUNKS_PER_PROGRAM + tl.arange(0, CHUNKS_PER_PROGRAM)
    exists = chunks < num_chunks
    firsts = chunks * CHUNK
    lasts = tl.minimum(firsts + CHUNK, num_indices) - 1
    rows = tl.load(sorted_rows_ptr + lasts, mask=exists, other=sentinel)
    after = tl.load(sorted_rows_ptr + lasts + 1, mask=exists & (lasts + 1 < num_indices), other=-1)
    before = tl.load(sorted_rows_ptr + firsts - 1, mask=exists & (firsts > 0), other=-1)
    # Runs the chunk kernel left: they go past the chunk after their first one.
    after_next = tl.load(
        sorted_rows_ptr + firsts + 2 * CHUNK, mask=exists & (firsts + 2 * CHUNK < num_indices), other=-1
    )
    starts = exists & (rows != sentinel) & (after == rows) & (before != rows) & (after_next == rows)
    cols = tl.arange(0, BLOCK_D)
    span = tl.arange(0, SPAN)
    one = tl.arange(0, 1)
    active = one >= 0
    while tl.max(starts.to(tl.int32), axis=0) > 0:
        chunk = tl.min(tl.where(starts, chunks, num_chunks), axis=0)
        starts &= chunks != chunk
        last = tl.minimum(chunk * CHUNK + CHUNK, num_indices) - 1
        row = tl.load(sorted_rows_ptr + last)
        total = tl.load(pieces_ptr + chunk * 2 * BLOCK_D + BLOCK_D + cols)
        # The pieces that follow in this block, SPAN chunks per step: chunk k holds part of
        # the run when its first id is the run's row (a prefix: the ids are sorted).
        limit = tl.minimum((chunk // BLOCK_CHUNKS + 1) * BLOCK_CHUNKS, num_chunks)
        next_chunk = chunk + 1
        going_on = next_chunk < limit
        while going_on:
            ks = next_chunk + span
            k_in = ks < limit
            member = k_in & (tl.load(sorted_rows_ptr + ks * CHUNK, mask=k_in, other=-1) == row)
            piece = tl.load(
                pieces_ptr + ks[:, None] * 2 * BLOCK_D + cols[None, :], mask=member[:, None], other=0.0
            )
            total += tl.sum(piece, axis=0)
            next_chunk += SPAN
            going_on = (tl.min(member.to(tl.int32), axis=0) == 1) & (next_chunk < limit)
        # Then the blocks the run enters: each block's sum of the run's pieces, SPAN blocks
        # per step, while the blocks start inside the run.
        next_block = chunk // BLOCK_CHUNKS + 1
        going_on = next_block < num_blocks
        while going_on:
            bs = next_block + span
            b_in = bs < num_blocks
            member = b_in & (tl.load(sorted_rows_ptr + bs * BLOCK_CHUNKS * CHUNK, mask=b_in, other=-1) == row)
            part = tl.load(block_pieces_ptr + bs[:, None] * BLOCK_D + cols[None, :], mask=member[:, None], other=0.0)
            total += tl.sum(part, axis=0)
            next_block += SPAN
            going_on = tl.min(member.to(tl.int32), axis=0) == 1
        w_start, dim, row_mask, w_ptrs = _row_operands(
            weights_ptr, sorted_w_start_ptr, sorted_dim_ptr, last + one, active, cols, ALIGN
        )
        w, m1, m2 = load_row_state(
            w_ptrs, w_start, row + one, cols, row_mask, active, momentum1_ptr, momentum2_ptr, OPTIMIZER
        )
        # One row over all the program's warps: each element (and the row-wise state) is held
        # by threads of several warps, and a warp that stored its update before another had
        # loaded the row made that one update it again from the new values (a few hot rows a
        # step, at random, on the H200). Every load lands before any warp stores.
        tl.debug_barrier()
        apply_update(
            total[None, :], w, m1, m2, active, row_mask, w_ptrs, w_start, row + one, cols, dim,
            momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
            OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
        )  # fmt: skip
