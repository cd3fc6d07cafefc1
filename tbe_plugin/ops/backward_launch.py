"""Launch sizes of the backward's per-run kernels, and the classes of tables they run on.

Two designs share the policy (``RunsLaunch.design``): ``pieces`` (``backward_pieces``, the
default since the H200 measured it at e45a0a4) and ``chunks`` (``backward_runs``); each
reads its own fields.

``RunsLaunch`` is the policy (``runs_launch()`` the default; tests and profilers pass
another through the module's ``backward_launch``); ``RunsLaunch.for_block_d`` turns it
into one class's sizes (``ClassLaunch``). ``row_classes`` groups tables by the power-of-two
tile their rows need, so that the module numbers rows one class after another.

Lives in ``tbe_plugin.ops``: imports nothing but the standard library.
"""

import dataclasses
import functools
from typing import List, Sequence, Tuple

MIN_BLOCK_D = 16
MAX_CLASSES = 8
CHUNK_MODES = ("list", "loop", "grid")  # RunsLaunch.chunk_mode, in the chunk kernel's MODE order 2, 1, 0
DESIGNS = ("chunks", "pieces")  # RunsLaunch.design
AUTO = "auto"  # chunk_mode: grid for one class of tiles, list for several  # BLOCK_D 16 .. 2048; the kernels read the classes' counters as one vector of 8


def block_d_of(dim: int) -> int:
    """The tile of a row of ``dim`` elements: a power of two, at least MIN_BLOCK_D."""
    return max(MIN_BLOCK_D, 1 << (max(dim, 1) - 1).bit_length())


def row_classes(dims: Sequence[int]) -> List[int]:
    """Tables' order of row numbering: by tile (BLOCK_D), then by table; returns the
    distinct tiles, smallest first."""
    return sorted({block_d_of(d) for d in dims})


def class_order(dims: Sequence[int]) -> List[int]:
    """Table indices in row-numbering order: class by class, tables in order within one."""
    return sorted(range(len(dims)), key=lambda t: (block_d_of(dims[t]), t))


def _power_of_two(value: int) -> bool:
    return value >= 1 and not value & (value - 1)


@dataclasses.dataclass(frozen=True)
class ClassLaunch:
    """One class's sizes, derived from a ``RunsLaunch``."""

    block_d: int
    chunk_ids: int
    """Ids per chunk (a halo has as many again)."""
    chunk_warps: int
    step_ids: int
    """Ids per gather of a long run's sums (segment and long-run kernels)."""
    loop_warps: int
    """Warps of the segment, group and long-run programs: a segment's gathers (all issued
    at once) take 2048 elements a warp."""
    piece_runs: int = 1
    """Pieces a pieces-kernel program sums side by side (lanes of its tile)."""
    piece_lanes: int = 0
    """Pieces a round whose operands a pieces program loads one a lane (0: RUNS, no lanes)."""
    piece_warps: int = 2
    """Warps of a pieces-kernel program."""
    tree_warps: int = 2
    """Warps of the cell-group and multi-run programs (their sums of 8 partials a load
    take 1024 elements a warp)."""
    piece_unroll: int = 4
    """Gathers of each piece issued at once (``RunsLaunch.piece_unroll``, or
    ``wide_piece_unroll`` at tiles of 512 and more)."""
    short_runs: int = 1
    """``RunsLaunch.piece_short``: short pieces a group of the short runs' launch."""
    short_lanes: int = 0
    """... their pieces a round, loaded a piece a lane (0: the class takes no short launch)."""
    short_warps: int = 1
    """... warps of its programs."""


@dataclasses.dataclass(frozen=True)
class RadixSizes:
    """``sort_pairs``' launch sizes (a value passed to it; nothing reads module globals)."""

    tile: int = 4096
    """Keys a program sorts per pass (a power of two)."""
    sub_tile: int = 256
    """Keys the scatter kernel ranks at a time (``tl.sort``'s cost grows with the keys a thread
    holds); at most ``tile``."""
    warps: int = 8
    """Warps of the histogram and scatter programs."""
    digit_bits: int = 8
    """Most key bits a pass sorts; fewer when that takes no more passes (``pass_bits``)."""
    ranking: str = "sort"
    """How the scatter ranks a sub-block's keys of one digit: ``sort`` (a ``tl.sort`` of packed
    (digit, position) values, timed at a541e15) or ``match`` (every pair of the sub-block's
    digits compared: sub_tile**2 comparisons, no sort and no gathers of the keys; not timed)."""

    def __post_init__(self) -> None:
        for name in ("tile", "sub_tile"):
            value = getattr(self, name)
            if value < 2 or value & (value - 1):
                raise ValueError(f"RadixSizes.{name} must be a power of two >= 2, got {value}")
        if self.sub_tile > self.tile:
            raise ValueError(f"RadixSizes.sub_tile ({self.sub_tile}) must not exceed tile ({self.tile})")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"RadixSizes.warps must be a power of two from 1 to 16, got {self.warps}")
        if not 1 <= self.digit_bits <= 12:
            raise ValueError(f"RadixSizes.digit_bits must be in [1, 12], got {self.digit_bits}")
        if self.ranking not in ("sort", "match"):
            raise ValueError(f"RadixSizes.ranking must be 'sort' or 'match', got {self.ranking!r}")


@dataclasses.dataclass(frozen=True)
class RunsLaunch:
    """How the per-run kernels (``backward_runs``) are launched, for rows of any tile."""

    chunk_elements: int = 512
    """Gradient elements of a chunk program's tile ((CHUNK + halo) * BLOCK_D): CHUNK =
    chunk_elements / BLOCK_D (halved with a halo), at least 1 (4 ids at D=128)."""
    chunk_halo: bool = False
    """True: the next chunk's ids come in the scan's tile (a halo of CHUNK lanes); False:
    as a second gather when the chunk's last run ends in the next chunk."""
    chunk_warps: int = 2
    """Warps of a chunk program (more when its tile exceeds 512 elements a warp)."""
    chunk_mode: str = "list"
    """How chunk programs find their chunks: ``list``, a fixed grid looping over the chunks
    where a run starts (listed first: chunks inside hot rows cost nothing); ``loop``, a
    fixed grid looping over every chunk; ``grid``, a program per chunk of the whole batch
    (per class: those past their class's ids exit at once); ``auto``, grid for one class of
    tiles and list for several (H200, 3b471d8: grid 2.81 ms against the list's 4.16 at
    uniform b8192, the list 15.3 against 27.8 on ctr-mix; not yet the default: the suite
    and the end-to-end run were measured with ``list``)."""
    chunk_programs_per_sm: int = 8
    """Looping chunk programs per multiprocessor (``list``, ``loop``): about as many as fit
    at 96-128 registers on 2 warps."""
    segment_ids: int = 64
    """Ids per segment of the long runs' sums (one for all classes; a multiple of every
    class's CHUNK): their memory is 4 * max BLOCK_D / segment_ids bytes per id."""
    step_elements: int = 4096
    """Gradient elements per gather of a long run's ids."""
    fan_in: int = 32
    """Segments per group and groups per supergroup; sums a long run adds per step."""
    loop_warps: int = 4
    """Warps of the segment, group and long-run programs (at least)."""
    max_loop_warps: int = 16
    """At most this many (they grow with the tile: 2048 gathered elements a warp)."""
    loop_programs_per_sm: int = 8
    """Programs per multiprocessor of the segment, group and long-run kernels (they loop)."""
    batch: int = 32
    """Segments (groups) the segment (group) kernel looks at with one load each."""
    design: str = "pieces"
    """Which kernels sum the runs: ``pieces`` (``backward_pieces``: every run cut at
    multiples of ``piece_ids`` into pieces, a piece a lane of a small program, partials of
    runs that cross a multiple summed by a fixed tree) or ``chunks`` (``backward_runs``:
    chunk programs own the runs that start in them, longer runs by segments, groups and a
    program per long run; the default until e45a0a4). H200 at e45a0a4, backward ms, pieces
    / chunks / FBGEMM: ctr-mix 7.90 / 15.33 / 6.57 (1.53 of the 7.90 a scan since removed),
    long-bags 7.25 / 13.90 / 4.38, zipf1.15 3.21 / 5.04 / 2.25, user-id 1.33 / 1.52 / 0.85;
    uniform b8192 4.75 / 4.48 / 3.50 (the chunk design's one-program-per-chunk grid: 3.19)."""
    piece_ids: int = 64
    """``pieces``: ids per cell of the grid that cuts runs (a run that holds at most one
    multiple of it after its first id is summed and updated by one lane; memory:
    8 * max BLOCK_D / piece_ids bytes per id)."""
    piece_elements: int = 256
    """``pieces``: gradient elements of a pieces program's tile: RUNS = piece_elements /
    BLOCK_D pieces side by side, at least 1 (2 at D=128). 4 elements a thread per gather
    (256 on 2 warps) compile to 53-66 registers at every tile (ptxas, sm_90); 512 on 2
    warps to 126-128, and to no code at all at BLOCK_D 16 (Triton 3.6's layout pass fails)."""
    piece_warps: int = 2
    """``pieces``: warps of a pieces program (at least; more when its tile exceeds 128
    elements a warp)."""
    tree_warps: int = 2
    """``pieces``: warps of the cell-group and multi-run programs (at least; more when their
    sums of 8 partials a load exceed 512 elements a warp, up to max_loop_warps)."""
    piece_unroll: int = 4
    """``pieces``: gathers of each piece issued before their sums (ids in flight per lane)."""
    wide_piece_unroll: int = 8
    """``pieces``: the same at tiles of 512 elements and more (one piece a program): H200 at
    c56e3177, wide-d512-fp16 backward 2.30 ms at 8 against 2.65 at 4; 8 at D=128 took 72
    registers against 60 (ptxas sm_90) and b65536 31.1 ms against 18.7."""
    piece_records: bool = False
    """``pieces``: the marks kernel stores beside each piece what the pieces kernel needs of
    it (row, flags, row start, D, first gradient row), so that a round of pieces waits on
    one round of contiguous loads before its gathers instead of two (the piece list, then
    the ids and their neighbours); ~33 more bytes a piece."""
    piece_lanes: int = 0
    """``pieces``: 0, or pieces a round of a pieces program (a power of two, 2 to 128, raised
    to RUNS where smaller) whose operands are loaded one piece a lane and then summed RUNS at
    a time (``_pieces_kernel``'s LANES): one round of dependent operand loads for the whole
    round instead of one for every RUNS pieces. H200 at 667690e: faster on uniform ids, slower
    on skewed ones over every piece; the short runs' launch uses it (``piece_short``)."""
    piece_short: int = 16
    """``pieces``: 0, or the most ids of a run (a power of two; ``piece_ids`` at most, fewer
    taken as ``piece_ids``; off under ``piece_order``, whose list it does not index) that the
    pieces kernel takes in a launch of its own, before the other pieces (``_piece_marks_kernel``'s SHORT: the
    short runs' and the other pieces' indices in the piece list listed apart, ~8 more bytes an
    id): a piece a lane, ``short_lanes`` pieces a round on ``short_warps``-warp programs of
    ``short_elements`` gradient elements, ``short_programs_per_sm`` a multiprocessor. H200 at
    667690e (``profile_backward``), those sizes for every piece (``lanes32_w1_fit``) against
    the default: uniform ids (runs of 1-3 ids) b8192 3.36 -> 2.58 ms, b65536 18.7 -> 14.9; but
    skewed ids (most ids in runs of hundreds) ctr-dlrm 3.16 -> 3.90, ctr-mix 4.93 -> 6.49. The
    short runs apart, the rest as before (H200 at b44233a, the backward's kernels, ms, off ->
    16): ctr-dlrm 3.00 -> 2.78, b8192 2.95 -> 2.38, ctr-mix 4.82 -> 4.53, b65536 18.9 -> 14.8,
    ctr-mix-fp16 4.64 -> 4.34, long-bags 3.81 -> 3.49, wide-d512-fp16 2.08 -> 2.11 (FBGEMM 3.54,
    3.47, 6.57, 18.0, 6.57, 4.37, 2.19); 4, 8 and 32 within 2% of 16 but at b8192 (4-32 equal)
    and wide-d512; the marks kernel then found a run's length with a scan (0.13 -> 0.28 ms at
    ctr-dlrm), since one load a head."""
    short_lanes: int = 32
    short_elements: int = 128
    short_warps: int = 1
    short_warp_elements: int = 128
    """``piece_short``: the most gradient elements a warp of the short launch holds (its
    warps grow to hold ``short_elements``): 128, 4 a thread; 256, 8 a thread, so that
    ``short_elements=256`` puts two D=128 pieces side by side on one warp (twice the rows
    in flight a program; ptxas sm_90, rowwise fp32 unscaled: 74 registers against 63, ~25
    one-warp programs a multiprocessor against 32; scaled: 127, 16). Candidate, loses: H200 at
    cd7e699 (``profile_backward``'s ``short_e256``, ms a backward, default -> 256; FBGEMM
    3.57, 4.38, 6.58): ctr-dlrm 2.94 -> 3.18, long-bags 3.47 -> 3.97, ctr-mix 4.43 -> 4.65."""
    short_programs_per_sm: int = 32
    short_fit: bool = True
    """``piece_short``: the short launch's grid cut to the programs that fit a multiprocessor
    (``piece_fit``'s mechanism, for that launch alone): its 32 one-warp programs a
    multiprocessor need 64 registers or fewer, which ptxas gives at D=128 (62-64, every
    optimizer) but not at D=16 (fp16 rowwise: 96, 21 fit). Not timed."""
    short_max_tile: int = 256
    """``piece_short``: classes of wider column tiles take all their pieces from the piece
    list as without it: H200 at 444f209, wide-d512-fp16's kernels 2.05 ms without the short
    launch, 2.16-2.34 with it (4-warp programs whose lanes meet in shared memory); at
    0020964, their short runs apart with the class's own sizes, 2.08 -> 2.27 (the pieces
    kernel 1.72 -> 1.90)."""
    short_two_states: bool = True
    """``piece_short`` also for the optimizers of two state tensors (ADAM, PARTIAL_ROWWISE_ADAM,
    LAMB). H200 at 0020964 it lost there (suite, uniform b8192, backward ms, 1adc462 without
    -> with: ADAM 5.12 -> 6.33, PARTIAL_ROWWISE_ADAM 4.34 -> 5.09, LAMB 5.29 -> 6.15): 83
    registers and 4-byte row stores. Since 64c2a4c (64 registers, 16-byte stores) it wins:
    H200 at 246ec7c, the suite in one process per setting, off -> on (FBGEMM 6.85, 5.87,
    7.39): ADAM 5.10 -> 4.73, PARTIAL_ROWWISE_ADAM 4.29 -> 3.87, LAMB 5.21 -> 4.85; on
    two-warp short programs (``short_warps`` 2, 16 a multiprocessor) 5.8-5.5 ms, worse."""
    piece_fit: bool = False
    """``pieces`` with ``piece_programs_per_sm``: no more looping programs a multiprocessor than
    fit on one at once, from the compiled kernel's registers and warps (learned at its first
    launch; ``pieces_launch.resident_programs``). At 16 two-warp programs, a kernel of
    more than 64 registers a thread leaves programs for a second wave that runs alone (sm_90:
    fp16 rows of D=128 66 registers, 14 fit; D=512 on 4 warps 92, 5 fit; ``piece_lanes`` 93,
    10 fit). H200 at 667690e: within noise of the default launch (ctr-dlrm 3.22 against 3.16
    ms, ctr-mix 4.84 against 4.93); on for the short launch alone (``short_fit``)."""
    piece_repeats: bool = False
    """``pieces``: an id whose output-gradient row is its predecessor's in the sorted order
    (its row again in the same bag: a repeat within a bag, adjacent because the sort is
    stable) takes the row its lane loaded last instead of gathering it again; the same
    values are added in the same order (bitwise the same result). ctr-dlrm's batches hold
    ~a third of their ids as such repeats. Tiles up to 256 (ptxas sm_90: the last row
    loaded takes 6-16 more registers, 103 at tile 512 with two state rows). Off: slower.
    H200 at 25326c6 (``profile_backward``, candidate ``repeats``; bitwise equal): the pieces
    kernel 1.41 -> 1.73 ms on ctr-dlrm, 1.64 -> 2.03 on long-bags, 2.19 -> 2.51 on ctr-mix
    (fp32 rowwise: 64 -> 80 registers, 16 -> 12 resident programs a multiprocessor; the
    gathers it saves were cache hits); the suite's backward geomean 1.264 against 1.294."""
    marks_in_operands: bool = False
    """Candidate (off): the pieces design's marks found by the sorted-operands kernel, which
    reads each sorted id's row already (a byte a position and its block's counts), so that
    the marks kernel runs once, reading those bytes, instead of twice, finding the marks
    from the rows each time (a count pass, then a write pass). The same marks, bit for bit
    (tested). At 25326c6 the two passes took 0.20 ms of ctr-dlrm's 2.83 ms backward, the
    sorted operands 0.21. With the marks, a row's start and D are written only where a piece
    starts (the only places read): a run's other ids write 12 bytes fewer. H200 at cd7e699
    (``profile_backward``, ms a backward, default -> with it): ctr-dlrm 2.94 -> 2.91, long-bags
    3.47 -> 3.57, ctr-mix 4.43 -> 4.42: off (the marks kernel has since packed its three marks
    in one word: 0.20 -> 0.16 ms on ctr-dlrm, 4118b80)."""
    piece_evict: bool = False
    """Candidate (off), ``pieces``: L2 eviction hints in the pieces kernel: its rows' and
    state's loads and stores ``evict_first`` (each row is read and written once a step), its
    gradient gathers ``evict_last`` (a batch's gradient rows are read again by every row of
    their bags). ncu at 246ec7c had ctr-dlrm's short launch at 48% L2 hits moving ~2.1 GB from
    DRAM at 59% of its bandwidth, while its gradient rows (a table's 8 MB slice at a time, in
    the sorted order) would fit the 50 MB L2 beside nothing else. The same values (hints move
    no data). The forward's hints lost at 213d1c3 (0.694 -> 0.836 ms on ctr-dlrm). ptxas sm_90
    at D=128 (the cache-policy operands), registers without -> with: rowwise Adagrad fp32 long
    launch 56 -> 60, short 63 -> 63; fp16 66 -> 68, 64 -> 64; ADAM fp32 short 64 -> 79 (fewer
    of its one-warp programs fit a multiprocessor). Not timed."""
    lean_operands: bool = False
    """Candidate (off), ``pieces``: fewer bytes in the sorted operands. Each id's output-gradient
    offset as an int32 where every offset of the output gradient fits one (4 bytes written by
    the sorted-operands kernel and read by the pieces kernels instead of 8), and a row's start
    and D written only where a piece may start: a run's head or a multiple of ``piece_ids``
    (a superset of the pieces' starts; found from the row before, with no marks), as
    ``marks_in_operands`` does with its marks. ctr-dlrm (15.4M ids, ~1.7M such places): ~64 ->
    ~48 bytes an id of the sorted-operands kernel's ~1 GB. The same values in every sum
    (bitwise the default's result, tested). ptxas sm_90, the pieces kernel at D=128, fp32,
    registers int64 -> int32 offsets: rowwise Adagrad unscaled 56 -> 52 (long launch), 63 -> 64
    (short); ADAM scaled 64 -> 72 (long: 14 two-warp programs fit a multiprocessor, not 16).
    Not timed."""
    piece_order: bool = False
    """``pieces`` with ``piece_records``, pooled outputs: the pieces kernel visits the
    pieces in the order of the output-gradient rows they first read (``_piece_order_kernel``:
    a count and a scatter by (class, gradient row)), so that pieces running together read
    neighbouring gradient rows and L2 serves most of the gather; no sum depends on the order."""
    plan_in_forward: bool = True
    """Training through the module (eager): the part of the backward that reads only the
    batch's ids (``embedding_backward.plan_backward``: positions, sort, sorted operands,
    pieces marks; ~1.1 of the 2.8 ms backward on ctr-dlrm at b8e6fc3) is launched in the
    forward, after the lookup, on a side CUDA stream, so that it runs beside the dense
    layers' forward and backward; the backward waits for it and does the rest. Batches
    that take a captured graph (``graph_max_ids``) plan in their graph. Holds the plan's
    tensors (~40 bytes an id) from the forward to the backward. Same kernels, same order
    of every sum: bitwise the same result. H200 at 3017d08 (``pipelines.bench.e2e``, ctr-dlrm
    DLRM, SparseDist, one call): 1.080x FBGEMM's examples/s against 1.060x with the plan in
    the backward; the plan's kernels did not run beside the dense GEMMs (the device times
    add up to the step) but filled the 0.3 ms the host left idle in the backward; peak
    memory +3.3% (SparseDist) to +6.6% (SemiSync, staleness 1) over FBGEMM's."""
    plan_thread: bool = True
    """Where the plan is made in the forward (``plan_in_forward``; otherwise no thread is
    used): it is launched by a host thread (one for the process, a plan at a time), so the
    forward returns at once and the dense layers' kernels are queued while the thread
    launches the plan's ~20 kernels on the side stream; a plan that reads the device
    (``hot_split``: its count of the ids left, a host read that waits for the lookup) waits
    there, not on the training thread. The backward takes the thread's plan (an error in it
    is raised there). Same kernels on the same stream in the same order: bitwise the same
    step (tested). On the CPU the thread's plan is awaited in the forward: Triton's
    interpreter patches ``triton.language`` while a kernel runs and is not safe to run from
    two threads at once. H100 at acf7b70 (``pipelines.bench.e2e``, ctr-dlrm DLRM, both in
    one process, five A/Bs): median step 13.21-13.48 ms against 13.21-14.88 without it
    (FBGEMM's 14.41-14.45), mean 13.41-14.83 against 13.42-15.28, on a noisy host; on a
    quiet one (686412b) a tie (13.24 vs 13.25 median, 1.089x vs 1.088x FBGEMM's mean): what it
    buys is less of the step waiting on the training thread when the host stalls."""
    plan_side_stream: bool = True
    """With ``plan_in_forward``: the plan's kernels on a side stream (beside the dense
    layers until the backward). Candidate ``False``: on the current stream, launched by the
    training thread right after the lookup (no thread, no side stream): the plan's ~0.6 ms
    then runs before the dense layers, not beside them: the A/B of what the side stream buys
    the step (H100 at 686412b: 0.1-0.4 ms a step of our kernels ran beside dense ones). Not
    timed."""
    forward_positions: bool = True
    """With ``plan_in_forward``, the training forward's warp kernels
    (``forward_warp``, FLAT 3 and 4) write the plan's first step as they read each bag's ids
    (each position's global row and bag), so the positions kernel (0.15 ms on ctr-dlrm at
    cd7e699, a binary search of each position's bag) does not run. Irregular offsets (a
    position in no bag or in two) are found on the device and the positions rewritten by the
    backward's own rule, with no host read. SUM batches without per-sample weights, eager, not
    for a captured graph's batch, with ``torch.sort`` and no hot rows or ``merge_repeats``;
    forward classes of other kernels leave it to the positions kernel. H200 at 471896f
    (``pipelines.bench.e2e``, SparseDist, one call): the TBE forward's device time 1.083 ->
    0.965 ms a step (the lookup 0.543 -> 0.569), the step's median 12.45 -> 12.35 ms, 1.092x
    FBGEMM's examples/s."""
    forward_merge: bool = False
    """Candidate (off): ``forward_positions`` (SUM or MEAN) with a bag's repeats of a row within
    a round of 32 of its ids (the lanes of the forward's warp, each row's id already broadcast
    to every lane) merged into the first, whose factor is their count (times 1/L for MEAN),
    bag and factor packed in an int64: the sort's sentinels after every row, fewer ids for the
    sorted operands, the marks and the pieces (ctr-dlrm keeps ~70%). The sums change order and
    rounding (a row added ``k`` times becomes ``k`` times the row), bitwise repeatable. H200 at
    4118b80 (``pipelines.bench.e2e``, SparseDist, ms a step's kernels): the pieces kernel 1.420
    -> 1.282, the positions kernel gone (0.15), but the forward 0.541 -> 0.730 (the counting in
    its row loop); the step 12.58 -> 12.64 ms (1.081x -> 1.077x FBGEMM's examples/s)."""
    merge_repeats: int = 0
    """Candidate (off; 0): before the sort, the ids of a bag that repeat a row within aligned
    windows of this many positions (a power of two from 2 to 64) are merged into one id
    whose factor sums theirs (``positions.merged_positions``): the sort, the sorted
    operands, the marks and the pieces see fewer ids (ctr-dlrm keeps 76.5% at 32, 72.8% at
    64). The sums change order and rounding (``k`` repeats add ``k`` times the gradient row
    once, not the row ``k`` times), bitwise repeatable. Pooled outputs (SUM, MEAN) whose
    per-sample weights need no gradient, eager batches (not a captured graph's), with
    ``torch.sort`` (not ``radix_sort``) and without ``hot_rows``; otherwise the backward
    runs without it. Loses: H200 at cd7e699 (``profile_backward``, ms a backward, default ->
    ``merge32`` / ``merge32_in_place``): ctr-dlrm 2.94 -> 3.79 / 3.79, long-bags 3.47 -> 4.74 /
    4.79, ctr-mix 4.43 -> 5.84 / 5.85."""
    merge_compact: bool = True
    """``merge_repeats``: True, the kept ids compacted before the sort (it sorts only them:
    ctr-dlrm's 15.4M ids -> 11.7M at 32) after one host read of their count a batch, which
    waits for the device (in the forward's plan, for the lookup before it), and not under a
    CUDA graph capture; False, in place: a dropped id keeps its position with the sentinel
    row (the sort sorts every position and puts those last), no host read, no compaction.
    The same plan past the sort either way (tested bitwise)."""
    merge_min_ids: int = 1 << 20
    """``merge_repeats``: the fewest ids in a batch whose repeats are merged (a smaller batch's
    backward is host-bound: the host read of the kept count would cost more than the merge
    saves; below ``graph_max_ids`` batches take a captured graph, where it does not apply)."""
    graph_max_ids: int = 1 << 20
    """Batches of at most this many ids run their backward as a captured CUDA graph
    (``backward_graphs``: padded to a bucket, one graph launch instead of ~20 kernel
    launches and their Python); 0: never. H200 at d7a99c8 (profile_backward, candidate
    ``graphs``): user-id 1.73 -> 0.81 ms, FBGEMM's B=512 standard 2.04 -> 0.94, no larger
    batch slower. 2**22 was tried at 11be7c3 (suite): l1 (2.1M ids, a 1.07 GB output
    gradient the graph copies into its buffer) 1.98 ms against 1.50 eager at beeb038, and
    wide-d512-fp16 2.29 against 2.30 eager (c56e317): back to 2**20."""
    graph_grad_in_place: bool = True
    """``pieces`` with graphs: a graph's kernels read the step's output gradient where it lies,
    through a device cell holding its address (``backward_graphs``), instead of a copy into
    the graph's buffer. H200 at ccbc90c (profile_backward): user-id's backward 0.261 ->
    0.183 device ms (its 134 MB copy gone), the pieces kernel unchanged. Graphing larger
    batches in place did not pay there: the pieces kernel ran 2-9% slower graphed than
    eager (l1, no padding: 1.15 -> 1.25 ms; b8192 2.41 -> 2.57, ctr-mix 2.73 -> 2.90;
    the same SASS but for the cell's load), so graph_max_ids stays 2**20."""
    graph_fill: bool = True
    """With ``graph_grad_in_place``: a step's host work before the replay is one small copy
    (the addresses of its ids, offsets, per-sample weights and output gradient, its id count
    and hyperparameters, into the graph's step vector) instead of ~6 launches (ids, padding,
    offsets, weights, cell, hyperparameters); a kernel inside the graph copies the ids,
    offsets and weights into its buffers from those addresses. H200 at daec3fa
    (``profile_backward``, wall ms of a backward, FBGEMM's beside): FBGEMM's standard B=512
    0.893 -> 0.645 (FBGEMM 0.795), user-id 0.941 -> 0.558 (FBGEMM 0.859); ``host_profile``:
    host time until the backward returns 0.55 -> 0.37 and 0.60 -> 0.40 ms."""
    radix_sort: bool = False
    """Candidate (off: slower): the global rows sorted by ``radix_sort.sort_pairs`` (only the
    bits that hold every row, the bag carried beside each id when the bags are pooled and
    unscaled, else an int32 position) instead of ``torch.sort`` (all 32 bits, an int64
    position, then a gather of each id's bag). int64 rows (2**31 rows and more) and batches
    of 2**31 ids or more keep ``torch.sort``. CPU-tested bitwise; not timed in the backward,
    because the sort alone lost: H200 (``probe_radix_sort``, 41.9M keys of 22 bits with an
    int32 value, ms) 4.4-4.7 against 2.8 for ``torch.sort`` and the gather at a541e15,
    6.9-14.5 at 161f483 (a ``tl.sort`` of each whole tile); 5.2M keys 0.55-0.70 against
    0.34-0.36."""
    radix_sizes: RadixSizes = RadixSizes()
    """``radix_sort``: the sort's launch sizes."""
    hot_rows: int = 0
    """Candidate (off; 0): the ``hot_rows`` most frequent rows of each table (a power of two
    from 16 to 256), chosen from an even sample of its features' ids (``hot_sample`` a
    feature, each feature's sample weighing the same), are summed apart: the positions
    kernel counts how often each sits in each bag (fp32 atomics
    of 1.0, exact integers, so the counts are the same whatever the order) and gives their
    ids the sentinel row (the sort puts them last, the pieces kernels skip them); their
    gradients are the counts times the feature's output-gradient columns
    (``hot_product.hot_sums``, fixed order) and one update kernel steps them. Sums in another
    order than the pieces kernel's, bitwise repeatable. For the pieces design, pooled (SUM,
    MEAN) without per-sample weights, eager batches of ``hot_min_ids`` ids or more (a table read
    by several features sums their counts' products in feature order); otherwise the backward
    runs without it. Probed on the H200 at 388cce3
    (``benchmarks/probe_hot_dense``): ctr-dlrm's 16 hottest rows a table take 50% of its
    lookups; their product 0.20 ms against ~4 GB of gathers. **Timed in the backward it
    loses** (H200, ad9fad4, ``profile_backward``, ms a backward, default / hot16 / hot64):
    ctr-dlrm 3.09 / 5.55 / 5.41, long bags 3.69 / 6.13 / 5.91. The kernels' device time
    barely moves (ctr-dlrm's ten largest: 2.81 / 2.72 / 2.78 ms): the pieces kernel gives
    back 0.35 ms (1.43 -> 1.08), the positions kernel's counting takes 0.21 of it (0.15 ->
    0.36), the product 0.11 and the choice the rest; the sort keeps its size (hot ids stay
    in it, as the sentinel). The rest is host time (2f5a1b5, no device sync on either path):
    choosing the rows takes ~1.2 ms of host time a backward and ``hot_step`` ~0.5 (some 50
    small torch ops at ~25-35 us each on the device machine's host), all before the large
    kernels, so the device idles through it. With the choice in one kernel since 56eb52a
    (``hot_product.choose_hot_rows``) and fewer ops in ``hot_step``: ctr-dlrm 2.99 / 3.17 /
    3.23, long bags 3.54 / 3.72 / 3.71: still 5-6% slower (the choice 0.15 ms of device time,
    the positions kernel's counting 0.21, the product 0.11, against the pieces kernel's 0.35
    and the sorted operands' 0.07). Off; kept as a measured candidate (``profile_backward``'s
    ``hot16``, ``hot64``)."""
    hot_sample: int = 4096
    """``hot_rows``: ids sampled per feature (evenly spaced) to choose the hot rows."""
    hot_min_ids: int = 1 << 20
    """``hot_rows``: the fewest ids in a batch for which the hot rows are summed apart."""
    hot_tf32x3: bool = False
    """Candidate (off), with ``hot_rows``: the hot rows' product (counts times the output
    gradient, ``hot_product.hot_sums``) on tensor cores as three TF32 products a dot instead of
    fp32 FMAs: fp32-accumulated, operands to ~2**-21 (``hot_sums``' docstring), bitwise
    repeatable. ctr-dlrm's product (H200, 388cce3, ``probe_hot_dense``): K=16 0.20-0.28 ms and
    K=64 0.33-0.45 with fp32 FMAs (compute-bound), 0.14 and 0.12 with one TF32 product. Not timed."""
    hot_split: bool = False
    """Candidate (off), with ``hot_rows``: the ids left after the hot ones are compacted before
    the sort (``hot_split``: a count a block, a running total read on the host, a compaction
    in the order of the positions), so that the sort, the sorted operands, the marks and the
    pieces see them alone (``hot_rows`` alone leaves the hot ids in all of them as sentinels:
    ctr-dlrm's 16 hottest rows a table hold ~50% of its ids). With ``forward_positions`` the
    hot ids are found in the forward's positions (``hot_split._hot_split_kernel``) instead of
    by the positions kernel, and the hot rows are chosen before the lookup, on the plan's side
    stream, beside it (the choice took 0.15 ms at 56eb52a). One host read a batch (the host
    waits for the device there), so eager batches only (not a captured graph's). Bitwise
    ``hot_rows``' step (tested). What it leaves to the sort (``benchmarks/probe_hot_split``,
    CPU batches of the same laws, a416ab1):
    ctr-dlrm's 15.4M ids -> 7.70M at 16 hot rows a table (sample 1024), 7.64M (4096), 5.77M at 64
    (4096; the batch's own top 64 would leave 5.69M); the ids in runs of more than 16 12.8M ->
    5.1M (16) and 3.2M (64); long-bags 19.7M -> 12.3M (16), 10.1M (64); ctr-mix 22.5M -> 11.9M
    (16), 9.2M (64). Not timed."""
    piece_programs_per_sm: int = 16
    """``pieces``: looping pieces programs per multiprocessor (16 two-warp programs of <= 64
    registers fill one's registers); 0: a program per RUNS pieces of an upper bound (the
    class's rows or the ids, whichever is fewer, plus the cells), most of them empty under
    skew (an empty program costs ~0.55 ns GPU-wide, H200) but no loop."""

    def __post_init__(self) -> None:
        for name in ("chunk_elements", "segment_ids", "step_elements", "fan_in", "batch", "piece_ids",
                     "piece_elements"):
            value = getattr(self, name)
            if value < 2 or not _power_of_two(value):
                raise ValueError(f"RunsLaunch.{name} must be a power of two >= 2, got {value}")
        for name in ("chunk_warps", "loop_warps", "max_loop_warps", "piece_warps", "tree_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"RunsLaunch.{name} must be a power of two from 1 to 16, got {getattr(self, name)}")
        for name in ("hot_split", "hot_tf32x3"):  # they act on the hot rows' ids and product
            if getattr(self, name) and not self.hot_rows:
                raise ValueError(f"RunsLaunch.{name} needs hot_rows (the hot rows it acts on), got hot_rows=0")
        for name in ("lean_operands", "piece_evict"):  # the pieces design's operands and kernel
            if getattr(self, name) and self.design != "pieces":
                raise ValueError(f"RunsLaunch.{name} is for the pieces design, got design={self.design!r}")
        if self.piece_order and not self.piece_records:
            raise ValueError("RunsLaunch.piece_order needs piece_records=True (it orders the per-piece records)")
        if self.graph_fill and not self.graph_grad_in_place:
            raise ValueError("RunsLaunch.graph_fill needs graph_grad_in_place=True (its step vector holds the "
                             "gradient's address); with graph_grad_in_place=False set graph_fill=False too")
        if self.graph_max_ids < 0:
            raise ValueError(f"RunsLaunch.graph_max_ids must be >= 0, got {self.graph_max_ids}")
        lanes = self.piece_lanes
        if lanes and (lanes > 128 or lanes < 2 or not _power_of_two(lanes)):
            raise ValueError(f"RunsLaunch.piece_lanes must be 0 or a power of two from 2 to 128, got {lanes}")
        short = self.piece_short
        if short and (short < 0 or not _power_of_two(short)):
            raise ValueError(f"RunsLaunch.piece_short must be 0 or a power of two, got {short}")
        if self.short_lanes > 128 or self.short_lanes < 2 or not _power_of_two(self.short_lanes):
            raise ValueError(f"RunsLaunch.short_lanes must be a power of two from 2 to 128, got {self.short_lanes}")
        if self.short_elements < 2 or not _power_of_two(self.short_elements):
            raise ValueError(f"RunsLaunch.short_elements must be a power of two >= 2, got {self.short_elements}")
        if self.short_warp_elements not in (32, 64, 128, 256, 512):
            raise ValueError(f"RunsLaunch.short_warp_elements must be a power of two from 32 to 512, got "
                             f"{self.short_warp_elements}")  # fmt: skip
        if self.short_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"RunsLaunch.short_warps must be a power of two from 1 to 16, got {self.short_warps}")
        if self.short_programs_per_sm < 0:
            raise ValueError(f"RunsLaunch.short_programs_per_sm must be >= 0, got {self.short_programs_per_sm}")
        hot = self.hot_rows
        if hot and (hot < 16 or hot > 256 or not _power_of_two(hot)):
            raise ValueError(f"RunsLaunch.hot_rows must be 0 or a power of two from 16 to 256, got {hot}")
        window = self.merge_repeats
        if window and (window < 2 or window > 64 or not _power_of_two(window)):
            raise ValueError(f"RunsLaunch.merge_repeats must be 0 or a power of two from 2 to 64, got {window}")
        if self.hot_sample < 1:
            raise ValueError(f"RunsLaunch.hot_sample must be >= 1, got {self.hot_sample}")
        if self.merge_min_ids < 0:
            raise ValueError(f"RunsLaunch.merge_min_ids must be >= 0, got {self.merge_min_ids}")
        if self.hot_min_ids < 0:
            raise ValueError(f"RunsLaunch.hot_min_ids must be >= 0, got {self.hot_min_ids}")
        if self.piece_programs_per_sm < 0:
            raise ValueError(f"RunsLaunch.piece_programs_per_sm must be >= 0, got {self.piece_programs_per_sm}")
        for name in ("chunk_programs_per_sm", "loop_programs_per_sm", "piece_unroll", "wide_piece_unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"RunsLaunch.{name} must be >= 1, got {getattr(self, name)}")
        if self.design not in DESIGNS:
            raise ValueError(f"RunsLaunch.design must be one of {', '.join(DESIGNS)}, got {self.design!r}")
        for name in ("piece_unroll", "wide_piece_unroll"):
            if getattr(self, name) > 16:
                raise ValueError(f"RunsLaunch.{name} must be at most 16 (gathers unrolled), got {getattr(self, name)}")
        if self.chunk_mode not in CHUNK_MODES + (AUTO,):
            raise ValueError(
                f"RunsLaunch.chunk_mode must be one of {', '.join(CHUNK_MODES + (AUTO,))}, got {self.chunk_mode!r}"
            )

    def chunk_mode_for(self, num_classes: int) -> str:
        """The chunk mode used for tables of ``num_classes`` classes of tiles."""
        if self.chunk_mode == AUTO:
            return "grid" if num_classes == 1 else "list"
        return self.chunk_mode

    def for_block_d(self, block_d: int) -> ClassLaunch:
        lanes = 2 if self.chunk_halo else 1
        chunk = max(1, min(self.segment_ids // 2, self.chunk_elements // (lanes * block_d)))
        warps = min(16, max(self.chunk_warps, lanes * chunk * block_d // 512))
        step = max(1, min(self.segment_ids, self.step_elements // block_d))
        loop_warps = min(self.max_loop_warps, max(self.loop_warps, self.segment_ids * block_d // 2048))
        runs = max(1, self.piece_elements // block_d)
        piece_warps = min(16, max(self.piece_warps, runs * block_d // 128))
        tree_warps = min(self.max_loop_warps, max(self.tree_warps, 8 * block_d // 512))
        unroll = self.wide_piece_unroll if block_d >= 512 else self.piece_unroll
        return ClassLaunch(block_d=block_d, chunk_ids=chunk, chunk_warps=warps, step_ids=step, loop_warps=loop_warps,
                           piece_runs=runs, piece_warps=piece_warps, tree_warps=tree_warps,
                           piece_unroll=unroll,
                           piece_lanes=max(self.piece_lanes, runs) if self.piece_lanes else 0,
                           **self._short_sizes(block_d))  # fmt: skip

    def _short_sizes(self, block_d: int) -> dict:
        """``ClassLaunch``'s short_* sizes: the short launch's, or none (short_lanes 0: the
        class takes no short launch) at tiles wider than ``short_max_tile``."""
        if block_d > self.short_max_tile:
            return {}
        short_runs = max(1, self.short_elements // block_d)
        return dict(short_runs=short_runs, short_lanes=max(self.short_lanes, short_runs),
                    short_warps=min(16, max(self.short_warps, short_runs * block_d // self.short_warp_elements)))


@functools.lru_cache(maxsize=1)
def runs_launch() -> RunsLaunch:
    """The default launch sizes: the pieces design (``RunsLaunch.design``). For the chunk
    design, measured on the H200 (commit d003ee9): 16-warp programs of 32 ids took 2x the
    time of 4-warp programs of 16 ids (cross-warp scans and barriers hold every warp for
    the slowest load), so chunk programs are small. One shared (frozen) value: the
    launchers ask for it every step."""
    return RunsLaunch()


def class_first_rows(table_rows: Sequence[int], dims: Sequence[int]) -> Tuple[List[int], List[int]]:
    """Row numbering by class: each table's first global row, and each class's first row
    (plus the total), for tables of ``table_rows`` rows and ``dims`` columns."""
    order = class_order(dims)
    first_row = [0] * len(table_rows)
    total = 0
    class_starts: List[int] = []
    classes = row_classes(dims)
    for t in order:
        while len(class_starts) < classes.index(block_d_of(dims[t])) + 1:
            class_starts.append(total)
        first_row[t] = total
        total += table_rows[t]
    return first_row, class_starts + [total]
