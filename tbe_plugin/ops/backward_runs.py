"""The backward's per-run kernels: each row's run of sorted ids summed and the optimizer
applied to the row (steps 3 to 5 of ``embedding_backward``, which launches them).

- ``_chunk_kernel`` (segmented scan) and ``_chunk_walk_kernel`` (each run walked by its
  first lane): fixed chunks of CHUNK sorted ids; the runs that start in the chunk and end
  in it or in the next one are updated there. Longer runs (hot rows) are left alone: a
  chunk inside one loads nothing but its sorted rows.
- ``_segment_kernel``: per segment of SEGMENT sorted ids that a run enters from before, the
  sum of that run's gradient rows in the segment; ``_block_kernel``: the same per block of
  SPAN segments, from the segments' sums.
- ``_crossing_kernel``: each longer run sums its ids to the end of its segment, then the
  sums of the segments and blocks it enters, and updates its row.

The sums take N / SEGMENT + N / (SEGMENT * SPAN) rows of BLOCK_D fp32. SEGMENT is the ids
of one gather (STEP = 8192 / BLOCK_D) but at least MIN_SEGMENT_IDS (32): 8.5 bytes per id
at D=128, 34 at D=256 and 68 at D=512 (was 136 there). Nothing else grows with the batch.
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
def _add_ahead(run_sum, extends, grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
               q, row, num_indices, cols, SCALED: tl.constexpr, CHUNK: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """``run_sum`` with, on the lanes ``extends`` marks (a run that ends in the next chunk),
    the summed gradient rows of ``row``'s ids in the next chunk (a prefix of it). Nothing
    is loaded when no lane extends."""
    if tl.max(extends.to(tl.int32), axis=0) > 0:
        ahead = q + CHUNK
        member = tl.load(sorted_rows_ptr + ahead, mask=ahead < num_indices, other=-1) == row
        start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, ahead, member, SCALED)
        dim = tl.load(sorted_dim_ptr + ahead, mask=member, other=0)
        total = tl.sum(_gather_gradients(grad_ptr, start, scale, member, cols, dim, SCALED, ALIGN), axis=0)
        run_sum += tl.where(extends[:, None], total[None, :], 0.0)
    return run_sum


@triton.jit
def _run_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, first, limit,
             row, cols, SCALED: tl.constexpr, STEP: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """The summed gradient rows of ``row``'s ids from sorted position ``first`` on, below
    ``limit``: STEP ids gathered per step, in order, until one is not the row's. Also
    whether the run ended before ``limit``."""
    total = tl.zeros([cols.shape[0]], dtype=tl.float32)
    pos = first
    going_on = pos < limit
    ended = limit < 0  # False, as a tensor
    while going_on:
        q = pos + tl.arange(0, STEP)
        inside = q < limit
        member = inside & (tl.load(sorted_rows_ptr + q, mask=inside, other=-1) == row)
        start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, member, SCALED)
        dim = tl.load(sorted_dim_ptr + q, mask=member, other=0)
        total += tl.sum(_gather_gradients(grad_ptr, start, scale, member, cols, dim, SCALED, ALIGN), axis=0)
        pos += STEP
        ended = tl.max((inside & ~member).to(tl.int32), axis=0) == 1
        going_on = ~ended & (pos < limit)
    return total, ended


@triton.jit
def _segmented_add(starts_a, sum_a, starts_b, sum_b):
    """Combine of a segmented inclusive sum: ``b`` follows ``a``; a segment start in ``b``
    drops what came before it."""
    return starts_a | starts_b, tl.where(starts_b != 0, sum_b, sum_a + sum_b)


@triton.jit
def _chunk_window(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, c0, num_indices,
    sentinel, SCALED: tl.constexpr, CHUNK: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """The sorted arrays a chunk starting at ``c0`` reads (no load depends on another): its
    rows and their neighbours, the rows at its edges, gradient-row starts and factors,
    weight-row starts and D."""
    q = c0 + tl.arange(0, CHUNK)
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=in_range & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < num_indices, other=-1)
    before_first = tl.load(sorted_rows_ptr + c0 - 1, mask=(c0 > 0) & (c0 <= num_indices), other=-1)
    after_next = tl.load(sorted_rows_ptr + c0 + 2 * CHUNK, mask=c0 + 2 * CHUNK < num_indices, other=-1)
    start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, in_range, SCALED)
    w_start = tl.load(sorted_w_start_ptr + q, mask=in_range, other=0) // ALIGN * ALIGN
    dim = tl.load(sorted_dim_ptr + q, mask=in_range, other=0)
    return row, prev, nxt, before_first, after_next, start, scale, w_start, dim


@triton.jit
def _chunk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
    sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr,
    step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """Updates the rows whose run of ids starts in this chunk of CHUNK sorted ids and ends
    in it or in the next chunk (``_update_chunk``). A program per chunk: programs that
    looped over chunks, reading the next one's sorted arrays while updating one, were
    slower on the H200 (96 registers instead of 56; rowwise Adagrad, T=32, B=8192, L=20,
    D=128: 3.87 ms against 3.05)."""
    chunk = tl.program_id(0).to(tl.int64)
    row, prev, nxt, before_first, after_next, start, scale, w_start, dim = _chunk_window(
        sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
        chunk * CHUNK, num_indices, sentinel, SCALED, CHUNK, ALIGN,
    )  # fmt: skip
    _update_chunk(
        grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, weights_ptr,
        momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices,
        sentinel, chunk, row, prev, nxt, before_first, after_next, start, scale, w_start, dim,
        SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN,
    )  # fmt: skip


@triton.jit
def _update_chunk(
    grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, weights_ptr,
    momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices,
    sentinel, chunk, row, prev, nxt, before_first, after_next, start, scale, w_start, dim,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """One chunk's updates, from its sorted arrays (``_chunk_window``).

    All the chunk's gradient rows are gathered at once and summed per piece (a maximal run
    of one row inside the chunk) by a segmented scan down the chunk: the piece's sum lands
    on its last lane, which applies the update. The gradient rows, weights and optimizer
    state come in one round of loads; no run length puts a chain of loads behind them. A
    run that ends in the next chunk has its ids there (a prefix of that chunk) gathered
    at once.

    Runs that go on past the next chunk are ``_crossing_kernel``'s: their ids here are not
    gathered, and a chunk inside one (a hot row) loads nothing more than its sorted arrays.
    """
    lane = tl.arange(0, CHUNK)
    cols = tl.arange(0, BLOCK_D)
    c0 = chunk * CHUNK
    q = c0 + lane
    valid = row != sentinel
    first_row = tl.max(tl.where(lane == 0, row, -1), axis=0)
    head = valid & (row != prev)  # the first id of its row's run
    tail = valid & (row != nxt)  # the last
    last = tl.max(tl.where(valid, q, -1), axis=0)
    is_last = valid & (q == last)
    last_row = tl.max(tl.where(is_last, row, -1), axis=0)
    # The run at the chunk's start began before it unless its first id is here; the
    # previous chunk or the crossing kernel owns it.
    began_here = valid & ((row != first_row) | (before_first != first_row))
    goes_on = is_last & ~tail  # the last piece's run goes on past the chunk
    long_run = after_next == last_row  # ... and past the next chunk too
    owned = began_here & ~(long_run & (row == last_row))  # runs this chunk sums
    piece_end = (tail | is_last) & owned  # where a run's sum lands
    extends = piece_end & goes_on
    if tl.max(owned.to(tl.int32), axis=0) > 0:  # not inside a long run (a hot row)
        row_mask = valid[:, None] & (cols[None, :] < dim[:, None])
        w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
        w, m1, m2 = load_row_state(
            w_ptrs, w_start, row, cols, row_mask, piece_end, momentum1_ptr, momentum2_ptr, OPTIMIZER
        )
        g = _gather_gradients(grad_ptr, start, scale, owned, cols, dim, SCALED, ALIGN)
        piece_start = (head | (q == c0)).to(tl.int32)
        _, run_sum = tl.associative_scan(
            (tl.broadcast_to(piece_start[:, None], (CHUNK, BLOCK_D)), g), 0, _segmented_add
        )
        run_sum = _add_ahead(run_sum, extends, grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                             sorted_scale_ptr, q, last_row, num_indices, cols, SCALED, CHUNK, ALIGN)  # fmt: skip
        apply_update(
            run_sum, w, m1, m2, piece_end, row_mask, w_ptrs, w_start, row, cols, dim,
            momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
            OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
        )  # fmt: skip


@triton.jit
def _chunk_walk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
    sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr,
    step_ptr, lr, eps, beta1, beta2, weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """``_chunk_kernel``'s work with each run summed by its first id's lane, one id per step
    after the first two: for chunks of more than SCAN_MAX_IDS ids, where the scan is slower.

    The common case issues its loads in two dependent rounds: first the sorted arrays
    (rows, row starts, D, gradient rows and factors of ids q and q + 1), then the gradient
    rows, weights and optimizer state together.
    """
    chunk = tl.program_id(0).to(tl.int64)
    c0 = chunk * CHUNK
    q = c0 + tl.arange(0, CHUNK)
    cols = tl.arange(0, BLOCK_D)
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=in_range & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < num_indices, other=-1)
    after_next = tl.load(sorted_rows_ptr + c0 + 2 * CHUNK, mask=c0 + 2 * CHUNK < num_indices, other=-1)
    start0, scale0 = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, in_range, SCALED)
    start1, scale1 = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q + 1, q + 1 < num_indices, SCALED)
    w_start, dim, row_mask, w_ptrs = _row_operands(
        weights_ptr, sorted_w_start_ptr, sorted_dim_ptr, q, in_range, cols, ALIGN
    )
    valid = row != sentinel
    head = valid & (row != prev)  # the first id of its row's run: its lane sums the run
    tail = valid & (row != nxt)  # the last
    last = tl.max(tl.where(valid, q, -1), axis=0)
    last_row = tl.max(tl.where(valid & (q == last), row, -1), axis=0)
    # Runs that start here, except one going on past the next chunk (the crossing kernel's).
    owned = head & ~((row == last_row) & (after_next == last_row))
    w, m1, m2 = load_row_state(
        w_ptrs, w_start, row, cols, row_mask, owned, momentum1_ptr, momentum2_ptr, OPTIMIZER
    )
    # Each run's lane adds its ids' gradients in sorted order: the first two ids at once
    # (most runs have one or two), then one id per step up to the chunk's end.
    second = owned & (q + 1 <= last) & (nxt == row)
    run_sum = _gather_gradients(grad_ptr, start0, scale0, owned, cols, dim, SCALED, ALIGN)
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
    # A run that goes on into the next chunk (and ends there): its ids there, a prefix of
    # that chunk, are added at once.
    last_goes_on = tl.max(tl.where(valid & (q == last) & ~tail, 1, 0), axis=0) > 0
    extends = owned & (row == last_row) & last_goes_on
    run_sum = _add_ahead(run_sum, extends, grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                         sorted_scale_ptr, q, last_row, num_indices, cols, SCALED, CHUNK, ALIGN)  # fmt: skip
    apply_update(
        run_sum, w, m1, m2, owned, row_mask, w_ptrs, w_start, row, cols, dim,
        momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
        OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip


@triton.jit
def _segment_kernel(
    grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, segment_sums_ptr,
    num_indices, sentinel, SCALED: tl.constexpr, BLOCK_D: tl.constexpr, SEGMENT: tl.constexpr, STEP: tl.constexpr,
    ALIGN: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
):  # fmt: skip
    """For each segment of SEGMENT sorted ids that a run enters (begun before it): the sum of
    that run's gradient rows in the segment (a prefix of it, the ids being sorted), gathered
    STEP ids at a time, for ``_block_kernel`` and ``_crossing_kernel``. SEGMENTS_PER_PROGRAM
    segments per program, those a run enters one after another; the others (most, but in
    hot rows) store nothing: no one reads them."""
    segments = tl.program_id(0).to(tl.int64) * SEGMENTS_PER_PROGRAM + tl.arange(0, SEGMENTS_PER_PROGRAM)
    s0 = segments * SEGMENT
    exists = s0 < num_indices
    rows = tl.load(sorted_rows_ptr + s0, mask=exists, other=sentinel)
    before = tl.load(sorted_rows_ptr + s0 - 1, mask=exists & (s0 > 0), other=-1)
    entered = (before == rows) & (rows != sentinel)
    cols = tl.arange(0, BLOCK_D)
    while tl.max(entered.to(tl.int32), axis=0) > 0:
        segment = tl.min(tl.where(entered, segments, 1 << 62), axis=0)
        entered &= segments != segment
        row = tl.max(tl.where(segments == segment, rows, -1), axis=0)
        total = tl.zeros([BLOCK_D], dtype=tl.float32)
        for k in tl.static_range(SEGMENT // STEP):
            q = segment * SEGMENT + k * STEP + tl.arange(0, STEP)
            inside = q < num_indices
            member = inside & (tl.load(sorted_rows_ptr + q, mask=inside, other=-1) == row)
            start, scale = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, q, member, SCALED)
            dim = tl.load(sorted_dim_ptr + q, mask=member, other=0)
            total += tl.sum(_gather_gradients(grad_ptr, start, scale, member, cols, dim, SCALED, ALIGN), axis=0)
        tl.store(segment_sums_ptr + segment * BLOCK_D + cols, total)


@triton.jit
def _sum_entered(sorted_rows_ptr, sums_ptr, first, count, stride, row, cols, SPAN: tl.constexpr):
    """The sum of ``sums`` rows first, first + 1, ... (below ``count``) while the unit each
    stands for (``stride`` sorted ids) starts inside ``row``'s run: SPAN rows per step.
    Also whether the run ended before ``count`` (a unit past it starts another row)."""
    span = tl.arange(0, SPAN)
    total = tl.zeros([cols.shape[0]], dtype=tl.float32)
    k0 = first
    going_on = k0 < count
    ended = count < 0  # False, as a tensor
    while going_on:
        ks = k0 + span
        k_in = ks < count
        member = k_in & (tl.load(sorted_rows_ptr + ks * stride, mask=k_in, other=-1) == row)
        part = tl.load(sums_ptr + ks[:, None] * cols.shape[0] + cols[None, :], mask=member[:, None], other=0.0)
        total += tl.sum(part, axis=0)
        k0 += SPAN
        ended = tl.max((k_in & ~member).to(tl.int32), axis=0) == 1
        going_on = ~ended & (k0 < count)
    return total, ended


@triton.jit
def _block_kernel(
    sorted_rows_ptr, segment_sums_ptr, block_sums_ptr, num_indices, sentinel,
    BLOCK_D: tl.constexpr, SEGMENT: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    """For a block of SPAN segments that a run enters (begun before it): the sum of that
    run's segment sums in the block (the segments it enters: a prefix of the block). Blocks
    no run enters store nothing."""
    block = tl.program_id(0).to(tl.int64)
    first_segment = block * SPAN
    num_segments = (num_indices + SEGMENT - 1) // SEGMENT
    b0 = first_segment * SEGMENT
    cols = tl.arange(0, BLOCK_D)
    row = tl.load(sorted_rows_ptr + b0)
    before = tl.load(sorted_rows_ptr + b0 - 1, mask=b0 > 0, other=-1)
    if (before == row) & (row != sentinel):
        count = tl.minimum(first_segment + SPAN, num_segments)
        total, _ = _sum_entered(sorted_rows_ptr, segment_sums_ptr, first_segment, count, SEGMENT, row, cols, SPAN)
        tl.store(block_sums_ptr + block * BLOCK_D + cols, total)


@triton.jit
def _crossing_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, segment_sums_ptr, block_sums_ptr, step_ptr, lr, eps, beta1, beta2,
    weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr,
    ALIGN: tl.constexpr, CHUNKS_PER_PROGRAM: tl.constexpr, SEGMENT: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    """Runs that begin in one chunk and go on past the next (CHUNKS_PER_PROGRAM chunks
    looked at per program, most with none): sum each run's gradient rows up to the end of
    its segment of SEGMENT ids (STEP at a time), then the sums of the segments it enters up
    to the end of its block of SPAN segments (``_segment_kernel``), then the sums of the
    blocks it enters (``_block_kernel``), SPAN at a time; then update its row. A run of n
    ids takes about SEGMENT / STEP + 2 + n / (SEGMENT * SPAN * SPAN) steps."""
    num_chunks = (num_indices + CHUNK - 1) // CHUNK
    num_segments = (num_indices + SEGMENT - 1) // SEGMENT
    num_blocks = (num_segments + SPAN - 1) // SPAN
    chunks = tl.program_id(0).to(tl.int64) * CHUNKS_PER_PROGRAM + tl.arange(0, CHUNKS_PER_PROGRAM)
    exists = chunks < num_chunks
    firsts = chunks * CHUNK
    lasts = tl.minimum(firsts + CHUNK, num_indices) - 1
    rows = tl.load(sorted_rows_ptr + lasts, mask=exists, other=sentinel)
    before = tl.load(sorted_rows_ptr + firsts - 1, mask=exists & (firsts > 0), other=-1)
    # The run holding the chunk's last id starts in the chunk and goes past the next one.
    after_next = tl.load(
        sorted_rows_ptr + firsts + 2 * CHUNK, mask=exists & (firsts + 2 * CHUNK < num_indices), other=-1
    )
    starts = exists & (rows != sentinel) & (before != rows) & (after_next == rows)
    cols = tl.arange(0, BLOCK_D)
    lane = tl.arange(0, CHUNK)
    one = tl.arange(0, 1)
    active = one >= 0
    while tl.max(starts.to(tl.int32), axis=0) > 0:
        chunk = tl.min(tl.where(starts, chunks, num_chunks), axis=0)
        starts &= chunks != chunk
        last = tl.minimum(chunk * CHUNK + CHUNK, num_indices) - 1
        q = chunk * CHUNK + lane
        chunk_rows = tl.load(sorted_rows_ptr + q, mask=q <= last, other=-1)
        row = tl.max(tl.where(q == last, chunk_rows, -1), axis=0)
        first = tl.min(tl.where(chunk_rows == row, q, last), axis=0)
        # Its ids to the end of its segment, then the segments it enters to the end of their
        # block, then the blocks it enters. Each stage runs only if the run goes on past the
        # last one's end (most runs end in their segment: one gather).
        segment = first // SEGMENT
        total, ended = _run_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
                                first, tl.minimum((segment + 1) * SEGMENT, num_indices), row, cols, SCALED, STEP,
                                ALIGN)  # fmt: skip
        if ~ended:
            block = segment // SPAN
            block_end = tl.minimum((block + 1) * SPAN, num_segments)
            part, ended = _sum_entered(sorted_rows_ptr, segment_sums_ptr, segment + 1, block_end, SEGMENT, row, cols,
                                       SPAN)  # fmt: skip
            total += part
            if ~ended:
                part, ended = _sum_entered(sorted_rows_ptr, block_sums_ptr, block + 1, num_blocks, SEGMENT * SPAN, row,
                                           cols, SPAN)  # fmt: skip
                total += part
        # (Loaded before the sums, the row's state spilled registers at sm_90.)
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
