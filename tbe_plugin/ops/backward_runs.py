"""The backward's per-run kernels: each row's run of sorted ids summed, and the optimizer
applied once per distinct row (steps 3 to 6 of ``embedding_backward``, which launches them).

Every kernel works on one class of tables, those whose rows fit one BLOCK_D (a power of
two): the classes' rows are numbered one class after another, so a class's sorted ids
are one range ``[lo, hi)`` of positions (``class_pos``), and no table pays for a wider
tile than its own. Positions are cut, from ``lo``, into chunks of CHUNK ids, and chunks
into segments of SEGMENT ids (the same for every class, a multiple of every CHUNK, so
that segment and group sums of all classes share one buffer, a slot each); a run (one
row's ids) belongs to the chunk it starts in.

- ``_chunk_kernel``: a chunk and the HALO ids after it, gathered at once and summed per
  run by a segmented scan (a fixed tree); every run that starts in the chunk and ends by
  the halo's end is updated there. Most runs are. The chunk's last run, if it goes on
  past the halo (a *long* run), is appended to the class's list of long runs instead
  (a counter per class hands out the slots atomically: the list's order varies, each
  run's work does not). Small programs of one or two warps: no barrier holds a warp for another's
  loads (16-warp programs of 32 ids measured 2x slower than 4-warp ones of 16).
- ``_segment_kernel``: for each segment that a long run enters, the sum of that run's ids
  in it; ``_group_kernel``, twice: the same for groups of FAN_IN segments and groups of
  FAN_IN groups, from the level below.
- ``_long_run_kernel``: each long run, one program each: its ids to the end of its first
  segment, then the sums of the segments, groups and supergroups it enters, FAN_IN a
  step, in a fixed order; then its row's update. A run of n ids costs about
  2 + log_FAN_IN(n / SEGMENT) rounds of loads, however hot the row.

The kernels but the chunk kernel loop over their work (a fixed grid: the class's share of
the batch is known on the device only). Results are bitwise the same from run to run.

Lives in ``tbe_plugin.ops``: imports Triton only.
"""

import triton
import triton.language as tl

from tbe_plugin.ops.optimizers import apply_update, load_row_state


@triton.jit
def _grad_pointer(grad_ptr, grad_cell_ptr, GRAD_CELL: tl.constexpr):
    """The output gradient's pointer: ``grad_ptr``, or with GRAD_CELL the address held in
    ``grad_cell_ptr[0]`` as a pointer of ``grad_ptr``'s type (a captured graph reads each
    step's gradient where it lies; the caller checks its 16-byte alignment, which the vector
    loads of its rows need)."""
    if GRAD_CELL:
        grad_ptr = tl.multiple_of(tl.load(grad_cell_ptr).to(grad_ptr.dtype), 16)
    return grad_ptr


@triton.jit
def _gather_gradients(grad_ptr, start, scale, mask, cols, dim, SCALED: tl.constexpr, ALIGN: tl.constexpr,
                      EVICT: tl.constexpr = False):  # fmt: skip
    """Output-gradient rows starting at ``start`` [len(start), BLOCK_D] in fp32, times
    ``scale`` (row starts are multiples of ALIGN: written so, Triton reads them with
    vector loads). EVICT: the loads marked L2 evict-last (kept)."""
    start = start // ALIGN * ALIGN
    # D too is a multiple of ALIGN, written so: a load is a vector load only where its mask
    # is provably constant over the vector (a D loaded from memory proves nothing), else
    # ALIGN scalar loads (sm_90 PTX: ld.global.b32 -> ld.global.v4.b32).
    dim = dim // ALIGN * ALIGN
    col_mask = mask[:, None] & (cols[None, :] < dim[:, None])
    g = tl.load(grad_ptr + start[:, None] + cols[None, :], mask=col_mask, other=0.0,
                eviction_policy="evict_last" if EVICT else "").to(tl.float32)  # fmt: skip
    if SCALED:
        g = g * scale[:, None]
    return g


@triton.jit
def _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, sorted_dim_ptr, q, mask, SCALED: tl.constexpr):
    """Gradient-row starts, factors and D of sorted ids ``q`` (independent loads)."""
    start = tl.load(sorted_grad_offset_ptr + q, mask=mask, other=0)
    scale = tl.load(sorted_scale_ptr + q, mask=mask & SCALED, other=1.0)
    dim = tl.load(sorted_dim_ptr + q, mask=mask, other=0)
    return start, scale, dim


@triton.jit
def _class_range(class_pos_ptr, klass):
    """Positions ``[lo, hi)`` of the class's sorted ids."""
    return tl.load(class_pos_ptr + klass), tl.load(class_pos_ptr + klass + 1)


@triton.jit
def _list_base(long_count_ptr, klass):
    """Where the class's long runs start in the shared list: after the earlier classes'
    (whose chunk kernels ran before this class's, so their counts are final)."""
    classes = tl.arange(0, 8)
    return tl.sum(tl.load(long_count_ptr + classes, mask=classes < klass, other=0), axis=0)


@triton.jit
def _segmented_add(starts_a, sum_a, starts_b, sum_b):
    """Combine of a segmented inclusive sum: ``b`` follows ``a``; a segment start in ``b``
    drops what came before it."""
    return starts_a | starts_b, tl.where(starts_b != 0, sum_b, sum_a + sum_b)


@triton.jit
def _update_row_state_and_weights(
    g, w, m1, m2, active, row_mask, w_ptrs, w_start, row, cols, dim, momentum1_ptr, momentum2_ptr, step_ptr, hyper_ptr,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr, BARRIER: tl.constexpr,
    EVICT: tl.constexpr = False,
):  # fmt: skip
    """``apply_update``, after a barrier when rows may be spread over several warps (then
    a warp that stored first would make another update the row again from new values)."""
    if BARRIER:
        tl.debug_barrier()
    apply_update(
        g, w, m1, m2, active, row_mask, w_ptrs, w_start, row, cols, dim, momentum1_ptr, momentum2_ptr, step_ptr,
        hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, EVICT,
    )  # fmt: skip


@triton.jit
def _chunk_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, long_runs_ptr, long_count_ptr, class_pos_ptr, chunk_list_ptr,
    list_pos_ptr, klass, step_ptr, hyper_ptr,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    MODE: tl.constexpr, BARRIER: tl.constexpr, HALO: tl.constexpr,
):  # fmt: skip
    """The class's chunks (``_update_chunk``): MODE 0, one a program (a program past the
    class's end does nothing); 1, a fixed grid looping over them; 2, a fixed grid looping
    over the chunks where a run starts (``chunk_list``, from ``_listed_chunks_kernel``), so
    that no program visits a chunk inside a hot row, which has nothing to do."""
    lo, hi = _class_range(class_pos_ptr, klass)
    if MODE == 2:
        first, last = tl.load(list_pos_ptr + klass), tl.load(list_pos_ptr + klass + 1)
        for i in tl.range(first + tl.program_id(0), last, tl.num_programs(0), num_stages=1):
            _update_chunk(
                grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, long_runs_ptr, long_count_ptr, klass,
                step_ptr, hyper_ptr, tl.load(chunk_list_ptr + i), lo, hi,
                SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN, BARRIER, HALO,
            )  # fmt: skip
    elif MODE == 1:
        num_chunks = (hi - lo + CHUNK - 1) // CHUNK
        for c in tl.range(tl.program_id(0).to(tl.int64), num_chunks, tl.num_programs(0), num_stages=1):
            _update_chunk(
                grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, long_runs_ptr, long_count_ptr, klass,
                step_ptr, hyper_ptr, lo + c * CHUNK, lo, hi,
                SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN, BARRIER, HALO,
            )  # fmt: skip
    else:
        c0 = lo + tl.program_id(0).to(tl.int64) * CHUNK
        if c0 < hi:
            _update_chunk(
                grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr,
                sorted_scale_ptr, weights_ptr, momentum1_ptr, momentum2_ptr, long_runs_ptr, long_count_ptr, klass,
                step_ptr, hyper_ptr, c0, lo, hi,
                SCALED, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING, CHUNK, BLOCK_D, ALIGN, BARRIER, HALO,
            )  # fmt: skip


@triton.jit
def _listed_chunks_kernel(
    sorted_rows_ptr, class_pos_ptr, class_chunk_ptr, counts_ptr, chunk_list_ptr, num_classes,
    WRITE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The chunks where a run starts, in order, by the first position of each: a head (a
    run's first id) is its chunk's first head when no head lies between the chunk's start
    and it. WRITE False: each program counts its block's; True: writes them, at the
    running total of the blocks before (``counts_ptr``: the inclusive sums then)."""
    block = tl.program_id(0)
    q = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    classes = tl.arange(0, 8)
    bounds = tl.load(class_pos_ptr + classes, mask=classes <= num_classes, other=1 << 62)
    end = tl.max(tl.where(classes == num_classes, bounds, 0), axis=0)
    valid = q < end
    klass = tl.sum((q[:, None] >= bounds[None, :]).to(tl.int32), axis=1) - 1  # class of each position
    pick = classes[None, :] == klass[:, None]
    lo = tl.sum(tl.where(pick, bounds[None, :], 0), axis=1)
    chunk = tl.sum(tl.where(pick, tl.load(class_chunk_ptr + classes)[None, :], 0), axis=1)
    chunk_start = lo + (q - lo) // chunk * chunk
    row = tl.load(sorted_rows_ptr + q, mask=valid, other=-1)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=valid & (q > lo), other=-1)
    before_chunk = tl.load(sorted_rows_ptr + chunk_start - 1, mask=valid & (chunk_start > lo), other=-2)
    head = valid & ((q == lo) | (row != prev))
    first = head & ((q == chunk_start) | ((chunk_start > lo) & (prev == before_chunk)))
    marks = first.to(tl.int32)
    if WRITE:
        offset = tl.load(counts_ptr + block - 1, mask=block > 0, other=0)
        slots = offset + tl.cumsum(marks, axis=0) - marks
        tl.store(chunk_list_ptr + slots, chunk_start, mask=first)
    else:
        tl.store(counts_ptr + block, tl.sum(marks, axis=0))


@triton.jit
def _update_chunk(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, long_runs_ptr, long_count_ptr, klass, step_ptr,
    hyper_ptr, c0, lo, hi,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    BARRIER: tl.constexpr, HALO: tl.constexpr,
):  # fmt: skip
    """The chunk at ``c0``: the runs that start in it (their first id, a head, in its
    CHUNK lanes) and end by the end of the next CHUNK ids are summed by one segmented scan
    and each lands on its last lane, which updates the row. The run the chunk enters with
    is its predecessors'. A last run that goes on past those ids is listed as long, and
    none of its ids is loaded here.

    The next chunk's ids of a run that ends there come as a halo of CHUNK more lanes in
    the scan (HALO = CHUNK), or (HALO 0) as a second gather summed onto the run's last lane
    in the chunk, made only when such a run exists: half the tile, one more round."""
    lane = tl.arange(0, CHUNK + HALO)
    cols = tl.arange(0, BLOCK_D)
    q = c0 + lane
    valid = q < hi
    row = tl.load(sorted_rows_ptr + q, mask=valid, other=-1)
    prev = tl.load(sorted_rows_ptr + q - 1, mask=valid & (q > lo), other=-1)
    nxt = tl.load(sorted_rows_ptr + q + 1, mask=q + 1 < hi, other=-1)
    beyond = c0 + 2 * CHUNK
    after = tl.load(sorted_rows_ptr + beyond, mask=beyond < hi, other=-1)
    start, scale, dim = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, sorted_dim_ptr, q, valid, SCALED)
    w_start = tl.load(sorted_w_start_ptr + q, mask=valid, other=0) // ALIGN * ALIGN
    if HALO == 0:  # the next chunk's rows and operands, for a run that ends there
        q_next = q + CHUNK
        next_valid = q_next < hi
        row_next = tl.load(sorted_rows_ptr + q_next, mask=next_valid, other=-1)
        start_next, scale_next, dim_next = _id_operands(
            sorted_grad_offset_ptr, sorted_scale_ptr, sorted_dim_ptr, q_next, next_valid, SCALED
        )
    head = valid & (row != prev)
    tail = valid & (row != nxt)
    owned_head = head & (lane < CHUNK)
    last_row = tl.max(tl.where(owned_head, row, -1), axis=0)  # the chunk's last run (-1: none starts here)
    first_lane = tl.min(tl.where(owned_head, lane, CHUNK + HALO), axis=0)
    is_long = (last_row >= 0) & (after == last_row)
    owned = valid & (lane >= first_lane) & (row <= last_row) & ~(is_long & (row == last_row))
    ends = owned & tail
    if HALO == 0:
        # The last lane's run goes on into the next chunk (and ends there: not long).
        extends = tl.max(tl.where(owned & ~tail & (lane == CHUNK - 1), 1, 0), axis=0) > 0
        ends = ends | (owned & (lane == CHUNK - 1))
    row_mask = valid[:, None] & (cols[None, :] < dim[:, None])
    w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
    w, m1, m2 = load_row_state(w_ptrs, w_start, row, cols, row_mask, ends, momentum1_ptr, momentum2_ptr, OPTIMIZER)
    g = _gather_gradients(grad_ptr, start, scale, owned, cols, dim, SCALED, ALIGN)
    piece_start = (head | (lane == 0)).to(tl.int32)
    _, run_sum = tl.associative_scan(
        (tl.broadcast_to(piece_start[:, None], (CHUNK + HALO, BLOCK_D)), g), 0, _segmented_add
    )
    if HALO == 0:
        if extends:
            member = row_next == last_row
            ahead = _gather_gradients(grad_ptr, start_next, scale_next, member, cols, dim_next, SCALED, ALIGN)
            run_sum += tl.where((lane == CHUNK - 1)[:, None], tl.sum(ahead, axis=0)[None, :], 0.0)
    _update_row_state_and_weights(
        run_sum, w, m1, m2, ends, row_mask, w_ptrs, w_start, row, cols, dim, momentum1_ptr, momentum2_ptr,
        step_ptr, hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE, STOCHASTIC_ROUNDING,
        BARRIER,
    )  # fmt: skip
    if is_long:
        first = tl.min(tl.where(owned_head & (row == last_row), q, hi), axis=0)
        slot = tl.atomic_add(long_count_ptr + klass, 1)
        tl.store(long_runs_ptr + _list_base(long_count_ptr, klass) + slot, first)


@triton.jit
def _enters_long(sorted_rows_ptr, b, lo, hi, CHUNK: tl.constexpr):
    """The row at position ``b`` (a chunk edge), and whether its run entered from before
    ``b`` as a long run: begun in an earlier chunk, it goes past the halo of the chunk it
    started in (begun before ``b - CHUNK``: a halo is CHUNK ids; else past ``b + CHUNK``)."""
    row = tl.load(sorted_rows_ptr + b, mask=b < hi, other=-1)
    before = tl.load(sorted_rows_ptr + b - 1, mask=(b > lo) & (b < hi), other=-2)
    early = tl.load(sorted_rows_ptr + b - CHUNK - 1, mask=(b - CHUNK - 1 >= lo) & (b < hi), other=-2)
    late = tl.load(sorted_rows_ptr + b + CHUNK, mask=b + CHUNK < hi, other=-2)
    return row, (row == before) & ((early == row) | (late == row))


@triton.jit
def _piece_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, first, limit, row,
               cols, SCALED: tl.constexpr, STEP: tl.constexpr, SPAN: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """The summed gradient rows of ``row``'s ids in sorted positions [first, limit), at
    most SPAN of them, STEP a gather: two rounds of loads (rows and operands of every
    position, then the row's gradient rows), whatever the span."""
    total = tl.zeros([cols.shape[0]], dtype=tl.float32)
    for k in tl.static_range(SPAN // STEP):
        q = first + k * STEP + tl.arange(0, STEP)
        inside = q < limit
        member = inside & (tl.load(sorted_rows_ptr + q, mask=inside, other=-1) == row)
        start, scale, dim = _id_operands(sorted_grad_offset_ptr, sorted_scale_ptr, sorted_dim_ptr, q, inside, SCALED)
        total += tl.sum(_gather_gradients(grad_ptr, start, scale, member, cols, dim, SCALED, ALIGN), axis=0)
    return total


@triton.jit
def _next_marked(marked, units):
    """The first marked unit (as a scalar) and the marks without it."""
    unit = tl.min(tl.where(marked, units, 2147483647), axis=0)  # units < 2**31: ids / SEGMENT
    return unit, marked & (units != unit)


@triton.jit
def _segment_kernel(
    grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, segment_sums_ptr,
    class_pos_ptr, klass, slot_stride,
    SCALED: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, SEGMENT: tl.constexpr, STEP: tl.constexpr,
    ALIGN: tl.constexpr, BATCH: tl.constexpr,
):  # fmt: skip
    """For each segment of the class that a long run enters: the sum of that run's ids in
    it (a prefix of the segment), in the segment's slot (``b // SEGMENT + klass`` for a
    segment at ``b``: distinct across classes). BATCH segments are looked at with one load
    each; those no long run enters (most, but in hot rows) store nothing."""
    lo, hi = _class_range(class_pos_ptr, klass)
    cols = tl.arange(0, BLOCK_D)
    num_batches = ((hi - lo + SEGMENT - 1) // SEGMENT + BATCH - 1) // BATCH
    for batch in tl.range(tl.program_id(0).to(tl.int64), num_batches, tl.num_programs(0)):
        segments = batch * BATCH + tl.arange(0, BATCH)
        starts = lo + segments * SEGMENT
        rows, marked = _enters_long(sorted_rows_ptr, starts, lo, hi, CHUNK)
        marked &= segments > 0
        while tl.max(marked.to(tl.int32), axis=0) > 0:
            segment, marked = _next_marked(marked, segments)
            b = lo + segment * SEGMENT
            row = tl.max(tl.where(segments == segment, rows, -1), axis=0)
            total = _piece_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, b,
                               tl.minimum(b + SEGMENT, hi), row, cols, SCALED, STEP, SEGMENT, ALIGN)  # fmt: skip
            tl.store(segment_sums_ptr + (b // SEGMENT + klass) * slot_stride + cols, total)


@triton.jit
def _unit_sums(sorted_rows_ptr, sums_ptr, first_unit, count, unit_ids, lo, hi, row, klass, slot_stride, cols,
               FAN_IN: tl.constexpr):  # fmt: skip
    """The sum of the sums of the FAN_IN units from ``first_unit`` (of ``unit_ids`` ids from
    ``lo``; those below ``count``) whose first id is ``row``'s (the run enters them), 8 at
    a time (a tile of 8 rows: no spills at wide rows)."""
    total = tl.zeros([cols.shape[0]], dtype=tl.float32)
    for k in tl.static_range(0, FAN_IN, 8):
        units = first_unit + k + tl.arange(0, 8)
        starts = lo + units * unit_ids
        inside = (units < count) & (starts < hi)
        member = inside & (tl.load(sorted_rows_ptr + starts, mask=inside, other=-1) == row)
        slots = starts // unit_ids + klass
        sums = tl.load(sums_ptr + slots[:, None] * slot_stride + cols[None, :], mask=member[:, None], other=0.0)
        total += tl.sum(sums, axis=0)
    return total


@triton.jit
def _group_kernel(
    sorted_rows_ptr, child_sums_ptr, group_sums_ptr, class_pos_ptr, klass, unit_ids, slot_stride,
    BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, FAN_IN: tl.constexpr, BATCH: tl.constexpr,
):  # fmt: skip
    """For each group of FAN_IN units (segments, or groups of segments) of ``unit_ids`` ids
    that a long run enters: the sum of the units' sums of that run (the units it enters,
    a prefix of the group), in the group's slot. BATCH groups are looked at with one load
    each; the others store nothing."""
    lo, hi = _class_range(class_pos_ptr, klass)
    cols = tl.arange(0, BLOCK_D)
    group_ids = unit_ids * FAN_IN
    num_batches = ((hi - lo + group_ids - 1) // group_ids + BATCH - 1) // BATCH
    for batch in tl.range(tl.program_id(0).to(tl.int64), num_batches, tl.num_programs(0)):
        groups = batch * BATCH + tl.arange(0, BATCH)
        rows, marked = _enters_long(sorted_rows_ptr, lo + groups * group_ids, lo, hi, CHUNK)
        marked &= groups > 0
        while tl.max(marked.to(tl.int32), axis=0) > 0:
            group, marked = _next_marked(marked, groups)
            row = tl.max(tl.where(groups == group, rows, -1), axis=0)
            total = _unit_sums(sorted_rows_ptr, child_sums_ptr, group * FAN_IN, (group + 1) * FAN_IN, unit_ids, lo, hi,
                               row, klass, slot_stride, cols, FAN_IN)  # fmt: skip
            b = lo + group * group_ids
            tl.store(group_sums_ptr + (b // group_ids + klass) * slot_stride + cols, total)


@triton.jit
def _long_run_kernel(
    grad_ptr, sorted_rows_ptr, sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    weights_ptr, momentum1_ptr, momentum2_ptr, segment_sums_ptr, group_sums_ptr, supergroup_sums_ptr,
    long_runs_ptr, long_count_ptr, class_pos_ptr, klass, slot_stride, step_ptr, hyper_ptr,
    SCALED: tl.constexpr, OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr,
    STOCHASTIC_ROUNDING: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr, SEGMENT: tl.constexpr,
    STEP: tl.constexpr, FAN_IN: tl.constexpr,
):  # fmt: skip
    """The class's long runs, a program each in turn: the run's ids to the end of its first
    segment, then the sums of the segments it enters to the end of their group, of the
    groups to the end of their supergroup, and of the supergroups, FAN_IN a step; then
    the row's update."""
    lo, hi = _class_range(class_pos_ptr, klass)
    cols = tl.arange(0, BLOCK_D)
    one = tl.arange(0, 1)
    group_ids = SEGMENT * FAN_IN
    supergroup_ids = group_ids * FAN_IN
    count = tl.load(long_count_ptr + klass)
    base = _list_base(long_count_ptr, klass)
    for i in tl.range(tl.program_id(0), count, tl.num_programs(0)):
        first = tl.load(long_runs_ptr + base + i)
        row = tl.load(sorted_rows_ptr + first)
        # The row's weights and state come with the first sums' loads, not after them.
        w_start = tl.load(sorted_w_start_ptr + first + one) // ALIGN * ALIGN
        dim = tl.load(sorted_dim_ptr + first + one) // ALIGN * ALIGN
        active = one >= 0
        row_mask = cols[None, :] < dim[:, None]
        w_ptrs = weights_ptr + w_start[:, None] + cols[None, :]
        w, m1, m2 = load_row_state(w_ptrs, w_start, row + one, cols, row_mask, active, momentum1_ptr, momentum2_ptr,
                                   OPTIMIZER)  # fmt: skip
        segment = (first - lo) // SEGMENT
        total = _piece_sum(grad_ptr, sorted_rows_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr, first,
                           tl.minimum(lo + (segment + 1) * SEGMENT, hi), row, cols, SCALED, STEP, SEGMENT, ALIGN)  # fmt: skip
        # The units a run enters after its first segment, level by level: each level's
        # units up to the end of the next level's unit, while the run goes on.
        nxt = segment + 1
        group_end = (nxt // FAN_IN + 1) * FAN_IN
        total += _unit_sums(sorted_rows_ptr, segment_sums_ptr, nxt, group_end, SEGMENT, lo, hi, row, klass,
                            slot_stride, cols, FAN_IN)  # fmt: skip
        edge = lo + group_end * SEGMENT
        if tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row:
            nxt = group_end // FAN_IN
            supergroup_end = (nxt // FAN_IN + 1) * FAN_IN
            total += _unit_sums(sorted_rows_ptr, group_sums_ptr, nxt, supergroup_end, group_ids, lo, hi, row,
                                klass, slot_stride, cols, FAN_IN)  # fmt: skip
            nxt = supergroup_end // FAN_IN
            edge = lo + nxt * supergroup_ids
            going_on = tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row
            while going_on:
                total += _unit_sums(sorted_rows_ptr, supergroup_sums_ptr, nxt, nxt + FAN_IN, supergroup_ids,
                                    lo, hi, row, klass, slot_stride, cols, FAN_IN)  # fmt: skip
                nxt += FAN_IN
                edge = lo + nxt * supergroup_ids
                going_on = tl.load(sorted_rows_ptr + edge, mask=edge < hi, other=-1) == row
        # One row over all the program's warps: every load lands before any warp stores.
        _update_row_state_and_weights(
            total[None, :], w, m1, m2, active, row_mask, w_ptrs, w_start, row + one, cols, dim, momentum1_ptr,
            momentum2_ptr, step_ptr, hyper_ptr, OPTIMIZER, WEIGHT_DECAY_MODE,
            STOCHASTIC_ROUNDING, True,
        )  # fmt: skip
        tl.debug_barrier()  # the next run's loads after this row's stores, in every warp
