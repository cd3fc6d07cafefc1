"""The backward's per-run kernels: each row's run of sorted ids summed, and the optimizer
applied once per distinct row (steps 3 to 5 of ``embedding_backward``, which launches them).

The sorted ids are cut into fixed chunks of CHUNK ids. A run (the ids of one row) is

- *contained* when it starts and ends in one chunk: ``_chunk_kernel`` sums it and updates
  its row;
- *crossing* otherwise. Each chunk whose last run goes on into the next chunk stores that
  run's sum over the chunk (``chunk_sums[c]``, one fp32 row); ``_group_kernel`` sums those
  of a group of FAN_IN chunks for the group's last run when it goes on past the group, and
  again for groups of FAN_IN groups. ``_crossing_kernel`` takes each crossing run at the
  chunk where it ends: its ids there, then the chunk sums, group sums and supergroup sums
  it covers walking back (FAN_IN at a time, a fixed order), and updates its row.

Work follows the data: every chunk gathers its CHUNK gradient rows in one round and
reads and writes only the rows whose runs end in it; a run of n ids costs the crossing
kernel about 2 + log_FAN_IN(n / CHUNK) rounds of loads, in one program, however hot the
row; no program steps through another's runs. Sums go in a fixed order: results are
bitwise the same every run. Memory: one fp32 row per chunk (4 * D / CHUNK bytes per id,
16 at D=128 with 32-id chunks) and 1/FAN_IN of that per level above.

Lives in ``tbe_plugin.ops``: imports Triton only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.optimizers import apply_update, load_row_state


@triton.jit
def _gather_gradients(grad_ptr, start, scale, mask, cols, dim, SCALED: tl.constexpr, ALIGN: tl.constexpr):
    """Output-gradient rows starting at ``start`` [len(start), BLOCK_D] in fp32, times
    ``scale`` (row starts are multiples of ALIGN: written so, Triton reads them with
    vector loads)."""
    start = start // ALIGN * ALIGN
    col_mask = mask[:, None] & (cols[None, :] < dim[:, None])
    g = tl.load(grad_ptr + start[:, None] + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
    if SCALED:
        g = g * scale[:, None]
    return g


@triton.jit
def _chunk_operands(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q, num_indices,
    sentinel, SCALED: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """The sorted arrays of ids ``q`` (no load depends on another): rows, gradient-row
    starts and factors, weight-row starts (multiples of ALIGN) and D."""
    in_range = q < num_indices
    row = tl.load(sorted_rows_ptr + q, mask=in_range, other=sentinel)
    start = tl.load(sorted_grad_offset_ptr + q, mask=in_range, other=0)
    scale = tl.load(sorted_scale_ptr + q, mask=in_range & SCALED, other=1.0)
    w_start = tl.load(sorted_w_start_ptr + q, mask=in_range, other=0) // ALIGN * ALIGN
    dim = tl.load(sorted_dim_ptr + q, mask=in_range, other=0)
    return row, start, scale, w_start, dim


@triton.jit
def _prefetch_l2(ptrs, mask):
    """Asks the L2 cache to fetch the lines of ``ptrs`` (PTX ``prefetch``; nothing is waited
    for, no register is written). GPU only: the interpreter cannot run inline assembly."""
    tl.inline_asm_elementwise(
        "@$2 prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l,b", [ptrs, mask], dtype=tl.int32, is_pure=False,
        pack=1,
    )  # fmt: skip


@triton.jit
def _prefetch_sorted_arrays(
    sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q, num_indices,
    SCALED: tl.constexpr,
):  # fmt: skip
    """Prefetches into L2 the sorted arrays of ids ``q`` (a chunk some way ahead), so that
    the program that reads them finds them there instead of waiting on device memory."""
    inside = q < num_indices
    _prefetch_l2(sorted_rows_ptr + q, inside)
    _prefetch_l2(sorted_grad_offset_ptr + q, inside)
    _prefetch_l2(sorted_w_start_ptr + q, inside)
    _prefetch_l2(sorted_dim_ptr + q, inside)
    if SCALED:
        _prefetch_l2(sorted_scale_ptr + q, inside)


@triton.jit
def _segmented_add(starts_a, sum_a, starts_b, sum_b):
    """Combine of a segmented inclusive sum: ``b`` follows ``a``; a segment start in ``b``
    drops what came before it."""
    return starts_a | starts_b, tl.where(starts_b != 0, sum_b, sum_a + sum_b)


@triton.jit
def _chunk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, chunk_sums_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay,
    seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    STAGES: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Chunks of CHUNK sorted ids (``_update_chunk``): one a program (STAGES 0), or a fixed
    grid of programs looping over chunks, software-pipelined STAGES deep, so that the
    next chunks' gathers are in flight (asynchronous copies into shared memory, holding no
    registers) while one chunk is summed and updated."""
    if STAGES == 0:
        _update_chunk(
            grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
            weights_ptr, momentum1_ptr, momentum2_ptr, chunk_sums_ptr, step_ptr, lr, eps, beta1, beta2,
            weight_decay, seed, num_indices, sentinel, tl.program_id(0).to(tl.int64),
            SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN, True, PREFETCH,
        )  # fmt: skip
    else:
        num_chunks = (num_indices + CHUNK - 1) // CHUNK
        first = tl.program_id(0).to(tl.int64)  # an int64 loop counter: positions may pass 2**31
        for chunk in tl.range(first, num_chunks, tl.num_programs(0), num_stages=STAGES):
            _update_chunk(
                grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, chunk_sums_ptr, step_ptr, lr, eps,
                beta1, beta2, weight_decay, seed, num_indices, sentinel, chunk,
                SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN, False, PREFETCH,
            )  # fmt: skip


@triton.jit
def _update_chunk(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, chunk_sums_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay,
    seed, num_indices, sentinel, chunk,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    BARRIER: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """One chunk of CHUNK sorted ids: all its gradient rows gathered at once and summed per
    piece (a maximal run of one row inside the chunk) by a segmented scan down the chunk
    (a fixed tree, whatever the runs' lengths). A piece whose run starts and ends here
    lands on its last lane, which updates the row; the last piece, when its run goes on
    into the next chunk, is stored as the chunk's sum for ``_crossing_kernel``. The piece
    of a run that entered from the previous chunk and ends here is left to that kernel."""
    lane = tl.arange(0, CHUNK)
    cols = tl.arange(0, BLOCK_D)
    q = chunk * CHUNK + lane
    if PREFETCH > 0:
        _prefetch_sorted_arrays(sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                                sorted_scale_ptr, q + PREFETCH * CHUNK, num_indices, SCALED)  # fmt: skip
    row, start, scale, w_start, dim = _chunk_operands(
        sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q,
        num_indices, sentinel, SCALED, ALIGN,
    )  # fmt: skip
    prev = tl.load(sorted_rows_ptr + q - 1, mask=(q < num_indices) & (q > 0), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < num_indices, other=-1)
    valid = row != sentinel
    head = valid & (row != prev)
    tail = valid & (row != nxt)
    first_row = tl.max(tl.where(lane == 0, row, -1), axis=0)
    entered = tl.max(tl.where((lane == 0) & valid & ~head, 1, 0), axis=0) > 0
    contained_end = tail & ~(entered & (row == first_row))  # a run that starts and ends here
    leaves = (lane == CHUNK - 1) & valid & ~tail  # the last piece's run goes on
    row_mask = valid[:, None] & (cols[None, :] < dim[:, None])
    w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
    w, m1, m2 = load_row_state(
        w_ptrs, w_start, row, cols, row_mask, contained_end, momentum1_ptr, momentum2_ptr, OPTIMIZER
    )
    g = _gather_gradients(grad_ptr, start, scale, valid, cols, dim, SCALED, ALIGN)
    piece_start = (head | (lane == 0)).to(tl.int32)
    _, run_sum = tl.associative_scan((tl.broadcast_to(piece_start[:, None], (CHUNK, BLOCK_D)), g), 0, _segmented_add)
    sum_ptrs = chunk_sums_ptr + chunk * BLOCK_D + 0 * lane[:, None] + cols[None, :]  # one row, the last lane's
    tl.store(sum_ptrs, run_sum, mask=leaves[:, None])
    if BARRIER:
        # Rows held by several warps (row-wise state over a split row): every load lands
        # before any warp stores.
        tl.debug_barrier()
    apply_update(
        run_sum, w, m1, m2, contained_end, row_mask, w_ptrs, w_start, row, cols, dim,
        momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
        OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
    )  # fmt: skip


@triton.jit
def _unit_last_rows(sorted_rows_ptr, units, unit_ids, num_indices, mask):
    """The row of the last sorted id of each unit (a chunk or group of ``unit_ids`` ids)."""
    last = tl.minimum((units + 1) * unit_ids, num_indices) - 1
    return tl.load(sorted_rows_ptr + last, mask=mask, other=-1)


@triton.jit
def _group_kernel(
    sorted_rows_ptr, child_sums_ptr, group_sums_ptr, num_indices, unit_ids,
    BLOCK_D: tl.constexpr, FAN_IN: tl.constexpr,
):  # fmt: skip
    """Group g of FAN_IN units (chunks, or groups of chunks) of ``unit_ids`` sorted ids each:
    when the run holding the group's last id goes on past the group, the sum of the units'
    sums of that run (the units whose last id is the run's: a suffix of the group, each
    of which the run leaves, so each has its sum). Other groups store nothing."""
    group = tl.program_id(0).to(tl.int64)
    group_ids = unit_ids * FAN_IN
    end = (group + 1) * group_ids
    if end < num_indices:
        row = tl.load(sorted_rows_ptr + end - 1)
        if tl.load(sorted_rows_ptr + end) == row:
            units = group * FAN_IN + tl.arange(0, FAN_IN)
            member = _unit_last_rows(sorted_rows_ptr, units, unit_ids, num_indices, units >= 0) == row
            cols = tl.arange(0, BLOCK_D)
            sums = tl.load(child_sums_ptr + units[:, None] * BLOCK_D + cols[None, :], mask=member[:, None], other=0.0)
            tl.store(group_sums_ptr + group * BLOCK_D + cols, tl.sum(sums, axis=0))


@triton.jit
def _suffix_sum(sorted_rows_ptr, sums_ptr, hi, lo, unit_ids, row, num_indices, cols, FAN_IN: tl.constexpr):
    """The sum of ``sums[u]`` over the units u in [lo, hi] whose last id is ``row``'s (the
    ids being sorted, a suffix ending at hi), and whether the run goes on before ``lo``."""
    units = hi - tl.arange(0, FAN_IN)
    inside = units >= lo
    member = inside & (_unit_last_rows(sorted_rows_ptr, units, unit_ids, num_indices, inside) == row)
    sums = tl.load(sums_ptr + units[:, None] * cols.shape[0] + cols[None, :], mask=member[:, None], other=0.0)
    before = tl.load(sorted_rows_ptr + lo * unit_ids - 1, mask=lo > 0, other=-1)
    return tl.sum(sums, axis=0), (lo > 0) & (before == row)


@triton.jit
def _crossing_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, chunk_sums_ptr, group_sums_ptr, supergroup_sums_ptr, step_ptr,
    lr, eps, beta1, beta2, weight_decay, seed, num_indices, sentinel,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    FAN_IN: tl.constexpr, CHUNKS_PER_PROGRAM: tl.constexpr,
):  # fmt: skip
    """Runs that began in an earlier chunk and end in one of this program's
    CHUNKS_PER_PROGRAM chunks (at most one a chunk: the chunk's first run): the sum of the
    run's ids in its last chunk, then of the chunk sums back to its group's start, the
    group sums back to its supergroup's start, and the supergroup sums, FAN_IN a step,
    back to the run's first chunk; then the row's update."""
    cols = tl.arange(0, BLOCK_D)
    lane = tl.arange(0, CHUNK)
    one = tl.arange(0, 1)
    for k in tl.static_range(CHUNKS_PER_PROGRAM):
        e = tl.program_id(0).to(tl.int64) * CHUNKS_PER_PROGRAM + k
        c0 = e * CHUNK
        c1 = c0 + CHUNK
        row = tl.load(sorted_rows_ptr + c0, mask=c0 < num_indices, other=sentinel)
        before = tl.load(sorted_rows_ptr + c0 - 1, mask=(c0 > 0) & (c0 <= num_indices), other=-1)
        after = tl.load(sorted_rows_ptr + c1, mask=c1 < num_indices, other=-1)
        if (row == before) & (row != sentinel) & (after != row):
            q = c0 + lane
            rows, start, scale, _, dim = _chunk_operands(
                sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, q,
                num_indices, sentinel, SCALED, ALIGN,
            )  # fmt: skip
            total = tl.sum(_gather_gradients(grad_ptr, start, scale, rows == row, cols, dim, SCALED, ALIGN), axis=0)
            lo = (e - 1) // FAN_IN * FAN_IN
            part, goes_on = _suffix_sum(sorted_rows_ptr, chunk_sums_ptr, e - 1, lo, CHUNK, row, num_indices, cols,
                                        FAN_IN)  # fmt: skip
            total += part
            if goes_on:
                hi = lo // FAN_IN - 1
                lo = hi // FAN_IN * FAN_IN
                part, goes_on = _suffix_sum(sorted_rows_ptr, group_sums_ptr, hi, lo, CHUNK * FAN_IN, row,
                                            num_indices, cols, FAN_IN)  # fmt: skip
                total += part
                hi = lo // FAN_IN - 1
                while goes_on:
                    lo = tl.maximum(hi - FAN_IN + 1, 0)
                    part, goes_on = _suffix_sum(sorted_rows_ptr, supergroup_sums_ptr, hi, lo,
                                                CHUNK * FAN_IN * FAN_IN, row, num_indices, cols, FAN_IN)  # fmt: skip
                    total += part
                    hi = lo - 1
            w_start = tl.load(sorted_w_start_ptr + c0 + one) // ALIGN * ALIGN
            dim = tl.load(sorted_dim_ptr + c0 + one)
            active = one >= 0
            row_mask = cols[None, :] < dim[:, None]
            w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
            w, m1, m2 = load_row_state(
                w_ptrs, w_start, row + one, cols, row_mask, active, momentum1_ptr, momentum2_ptr, OPTIMIZER
            )
            # One row over all the program's warps: every load lands before any warp stores
            # (else a warp could update the row again from another's new values).
            tl.debug_barrier()
            apply_update(
                total[None, :], w, m1, m2, active, row_mask, w_ptrs, w_start, row + one, cols, dim,
                momentum1_ptr, momentum2_ptr, step_ptr, lr, eps, beta1, beta2, weight_decay, seed,
                OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
            )  # fmt: skip
            tl.debug_barrier()  # the next chunk's run may hold the same warps' registers
