"""The backward's pieces design (``ops.backward_pieces``, the default) on the CPU
interpreter: against the training reference, against the chunk design where sums are
exact, bit for bit from run to run and across its options; its marks kernel's lists."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops.backward_launch import RunsLaunch
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import FEATURE_TABLE_MAP, OPTIMIZERS, SPECS, build, cuda_zipf_steps, train_and_compare

# The ``pieces`` design (``ops.backward_pieces``), at sizes that make a few hundred ids
# cross every level: cells of 4 ids (runs of 4 fill one; runs cross cell edges), groups of
# 2 cells and supergroups of 4 groups (32 ids: the hot row walks several supergroups).
PIECES = RunsLaunch(design="pieces", piece_ids=4, fan_in=2, piece_elements=256, piece_warps=1, tree_warps=1,
                    piece_programs_per_sm=1, loop_programs_per_sm=1)  # fmt: skip


@pytest.mark.parametrize("records, order, lanes, short", [(False, False, 0, 0), (True, False, 0, 0),
                                                          (True, True, 0, 0), (False, False, 64, 0),
                                                          (True, True, 128, 0), (False, False, 0, 2),
                                                          (True, False, 32, 4)],
                         ids=["plain", "records", "ordered", "lanes", "ordered-lanes", "short", "records-lanes-short"])
def test_pieces_hot_rows_across_cells_groups_and_supergroups(records, order, lanes, short):
    """One row in most lookups (its run crosses many cells, groups and supergroups),
    the others' runs shorter, longer and exactly as long as a cell, starting anywhere;
    with and without the per-piece records, visited by gradient row, with each round's
    operands loaded a piece a lane (``piece_lanes``: 64 or 128 pieces a round, summed 16
    at a time at D <= 16; 4 looping programs: many rounds each, pieces longer than several
    steps of UNROLL ids), and with runs of up to 2 or 4 ids (a whole cell) in a launch of
    their own (``piece_short``)."""
    emb = build("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05)
    emb.backward_launch = dataclasses.replace(PIECES, piece_records=records, piece_order=order, piece_lanes=lanes,
                                              piece_fit=lanes > 0, piece_short=short)  # fmt: skip
    # (piece_fit: the interpreter's launches report no registers)
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, B=8, max_len=12, hot=0.9, lr=0.05)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_pieces_every_optimizer(optimizer):
    """Every optimizer's update from the pieces kernel (whole runs) and the multi-run
    kernel (runs crossing a cell edge), MEAN pooling with per-sample weights."""
    emb = build(optimizer, "MEAN", learning_rate=0.05)
    # Cells of 2 ids; a program per RUNS pieces for the odd optimizers, looping for the even.
    emb.backward_launch = dataclasses.replace(PIECES, piece_ids=2, piece_programs_per_sm=OPTIMIZERS.index(optimizer) % 2)
    train_and_compare(emb, optimizer, steps=1, B=6, max_len=8, hot=0.6, weighted=True, lr=0.05)


def dyadic(shape, seed, scale=8):
    """Values k / scale, |k| <= scale: every sum of a few thousand of them (and of their
    products with other such values) is exact in fp32, in any order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-scale, scale + 1, shape, generator=g).float() / scale


def step_both_designs(optimizer, dtype=torch.float32, specs=SPECS, ftm=FEATURE_TABLE_MAP, B=6, hot=0.7, seed=0):
    """One step of the chunk design and of the pieces design from the same weights, on the
    same batch with dyadic gradients and per-sample weights; both modules."""
    modules = []
    for launch in (RunsLaunch(design="chunks"), PIECES):
        emb = build(optimizer, dtype=dtype, specs=specs, ftm=ftm, learning_rate=0.05)
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        indices, offsets = make_bags(rows, B=B, max_len=10, seed=seed, hot_fraction=hot)
        psw = dyadic((indices.numel(),), seed + 1, scale=4)
        out = emb(indices, offsets, psw)
        out.backward(dyadic(out.shape, seed).to(out.dtype))
        modules.append(emb)
    return modules


@pytest.mark.parametrize(
    "optimizer, dtype, specs, ftm",
    [
        ("EXACT_ROWWISE_ADAGRAD", torch.float16, [(23, 8), (9, 20), (30, 4), (12, 40), (7, 130)], [0, 1, 2, 3, 4, 0]),
        ("LAMB", torch.bfloat16, [(23, 8)], [0]),
        ("ADAM", torch.float32, SPECS, FEATURE_TABLE_MAP),
    ],
    ids=["rowwise-fp16-five-tiles", "lamb-bf16-one-table", "adam-fp32"],
)
def test_pieces_bitwise_equal_to_chunks_when_sums_are_exact(optimizer, dtype, specs, ftm):
    """Where every sum is exact (dyadic gradients and weights), the order of sums cannot
    show: then both designs must give the same tables and states bit for bit (the same
    rows updated once each, by the same formulas, with the same gradient)."""
    chunks, pieces = step_both_designs(optimizer, dtype, specs, ftm)
    assert_bitwise_equal(chunks, pieces)
    assert not torch.equal(chunks.weights, build(optimizer, dtype=dtype, specs=specs, ftm=ftm).weights)


@pytest.mark.parametrize("second", ["same", "records", "ordered", "lanes", "lanes-looping", "short", "short-records",
                                    "short-e256"])
def test_pieces_deterministic_with_inexact_sums(second):
    """Random gradients (sums rounded in fp32): two runs of the pieces design agree bit for
    bit (every sum in a fixed order); so does a run with the marks kernel's per-piece
    records (``piece_records``: the same operands, read from the records), one that
    visits the pieces in the order of their gradient rows (``piece_order``: an order the
    atomics choose, on which no sum depends), and runs whose rounds load their pieces'
    operands a piece a lane (``piece_lanes``: the same pieces summed in the same order,
    grouped otherwise; a program per round, or one looping program), and runs whose short
    runs (up to 2 ids) are summed in a launch of their own (``piece_short``: each in id
    order as before; ``short-e256``: twice the short launch's tile, two groups' pieces side by
    side)."""
    results = []
    second_launch = dataclasses.replace(PIECES, piece_records=second in ("records", "ordered", "short-records"),
                                        piece_order=second == "ordered", piece_lanes=32 if "lanes" in second else 0,
                                        piece_programs_per_sm=0 if second == "lanes" else 1,
                                        piece_short=2 if "short" in second else 0,
                                        short_elements=256 if second == "short-e256" else PIECES.short_elements,
                                        short_warp_elements=256 if second == "short-e256" else 128)
    for launch in (PIECES, second_launch):
        emb = build("PARTIAL_ROWWISE_ADAM", "MEAN", learning_rate=0.05)
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        indices, offsets = make_bags(rows, B=6, max_len=10, seed=3, hot_fraction=0.8)
        out = emb(indices, offsets)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)))
        results.append(emb)
    assert_bitwise_equal(*results)


def test_pieces_empty_batch_and_empty_bags():
    """A batch of empty bags changes nothing; one table with empty bags among others
    trains as the reference does."""
    emb = build("EXACT_ADAGRAD", specs=[(23, 8)], ftm=[0], learning_rate=0.05)
    emb.backward_launch = PIECES
    before = emb.weights.clone()
    out = emb(torch.zeros(0, dtype=torch.int64), torch.zeros(5, dtype=torch.int64))
    out.backward(torch.ones_like(out))
    assert torch.equal(emb.weights, before)
    train_and_compare(emb, "EXACT_ADAGRAD", steps=1, B=8, max_len=3, hot=0.5, lr=0.05)


def test_piece_marks_list_pieces_and_multi_runs():
    """Cells of 4 ids: a piece starts at every run's first id, at every multiple of 4
    after the head of a run that holds two or more of them (a multi run; a run with one
    is a whole piece of up to 7 ids), and at the end of the valid ids (sentinels after
    it). Two blocks of 16 positions:
    the counts are one vector (pieces per block, then multi runs per block) whose 1-D
    running totals place the second block's marks after the first's; each class bound's
    block writes how many pieces and multi runs lie before it; the per-piece records hold
    each piece's row, flags (1: a run's head, 2: the whole run) and first id's operands."""
    from tbe_plugin.ops.backward_pieces import _piece_marks_kernel

    records = None

    def marks(rows, class_pos):
        nonlocal records
        n = rows.numel()
        operands = (rows, torch.arange(n) * 10, torch.full((n,), 4, dtype=torch.int32), torch.arange(n) * 100,
                    torch.arange(n, dtype=torch.float32))  # fmt: skip
        counts = torch.empty(4, dtype=torch.int32)
        starts, multi = torch.full((32,), -1, dtype=torch.int64), torch.full((8,), -1, dtype=torch.int64)
        piece_pos, multi_pos = (torch.full((len(class_pos),), -1, dtype=torch.int64) for _ in range(2))
        records = (torch.full((32,), -1, dtype=rows.dtype), torch.full((32,), -1, dtype=torch.int8),
                   torch.full((32,), -1), torch.full((32,), -1, dtype=torch.int32), torch.full((32,), -1),
                   torch.full((32,), -1.0))  # fmt: skip
        args = (*operands, class_pos, len(class_pos) - 1)
        lists = (starts, multi, piece_pos, multi_pos, *records, *(starts,) * 5)  # (SHORT, FLAGS off: never read)
        flags = dict(PIECE=4, BLOCK=16, RECORDS=True, SCALED=True)
        _piece_marks_kernel[(2,)](*args, counts, *lists, WRITE=False, **flags)
        counted = counts.tolist()
        _piece_marks_kernel[(2,)](*args, counts.cumsum(0, dtype=torch.int32), *lists, WRITE=True, **flags)
        return counted, starts, multi, piece_pos.tolist(), multi_pos.tolist()

    sentinel = torch.iinfo(torch.int32).max
    rows = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 5, 5, 5, 5, 5, 7, 8, 8, 9, sentinel, sentinel],
                        dtype=torch.int32)  # fmt: skip
    counted, starts, multi, piece_pos, multi_pos = marks(rows, torch.tensor([0, 12, 21]))
    assert counted == [6, 4, 1, 0]  # pieces in blocks 0, 1; multi runs in blocks 0, 1
    # Row 0 holds 4 and 8 after its head: cut at both; row 5 (12..16) holds only 16: whole.
    assert starts[:11].tolist() == [0, 4, 8, 9, 10, 12, 17, 18, 20, 21, -1]
    assert multi[:2].tolist() == [0, -1]
    assert piece_pos == [0, 5, 9] and multi_pos == [0, 1, 1]  # the second class's first piece: 12's
    row, flag, w_start, dim, grad_offset, scale = (r[:9].tolist() for r in records)
    assert row == [0, 0, 0, 1, 2, 5, 7, 8, 9] and flag == [1, 0, 0, 3, 3, 3, 3, 3, 3]
    piece_first = starts[:9]
    assert w_start == (piece_first * 10).tolist() and grad_offset == (piece_first * 100).tolist()
    assert dim == [4] * 9 and scale == piece_first.float().tolist()
    # A multi run in the second block lands after the first block's; one class.
    rows2 = torch.tensor([3] * 2 + [4] * 14 + [6] * 6 + [sentinel], dtype=torch.int32)
    counted, starts, multi, piece_pos, multi_pos = marks(rows2, torch.tensor([0, 22]))
    assert counted == [5, 2, 1, 0]  # row 4 (2..15) holds 4, 8, 12; row 6 (16..21) only 20: whole
    assert starts[:8].tolist() == [0, 2, 4, 8, 12, 16, 22, -1]
    assert multi[:2].tolist() == [2, -1]
    assert piece_pos == [0, 6] and multi_pos == [0, 1]
    # Multi runs in both blocks, one of them found by its earlier grid point (20: 16 is
    # after row 4's head at 12); a run starting on a grid point with one more (24..28).
    rows3 = torch.tensor([1] + [2] * 9 + [3] * 2 + [4] * 9 + [5] * 3 + [6] * 5 + [sentinel] * 3, dtype=torch.int32)
    counted, starts, multi, piece_pos, multi_pos = marks(rows3, torch.tensor([0, 29]))
    assert counted == [6, 5, 2, 0]
    assert starts[:12].tolist() == [0, 1, 4, 8, 10, 12, 16, 20, 21, 24, 29, -1]
    assert multi[:3].tolist() == [1, 12, -1]
    assert records[1][:10].tolist() == [3, 1, 0, 0, 3, 1, 0, 0, 3, 3]
    assert piece_pos == [0, 10] and multi_pos == [0, 2]
    # An empty class between two others: its bounds are the next class's first position.
    counted, starts, multi, piece_pos, multi_pos = marks(rows, torch.tensor([0, 12, 12, 21]))
    assert piece_pos == [0, 5, 5, 9] and multi_pos == [0, 1, 1, 1]


def test_piece_marks_list_short_runs_apart():
    """``RunsLaunch.piece_short`` (SHORT=2, cells of 4 ids, blocks of 16): the pieces of runs
    of one or two ids and the other pieces are listed apart by their index in the piece
    list (a third count a block), and each class bound's block writes where the class's
    short and other pieces begin; the piece list itself is the same as without. A run that
    goes on into the next block is short or not by that block's first ids."""
    from tbe_plugin.ops.backward_pieces import _piece_marks_kernel

    sentinel = torch.iinfo(torch.int32).max

    def marks(rows, class_pos):
        rows = torch.tensor(rows + [sentinel] * 2, dtype=torch.int32)
        n, class_pos = rows.numel(), torch.tensor(class_pos)
        operands = (rows, torch.arange(n) * 10, torch.full((n,), 4, dtype=torch.int32), torch.arange(n) * 100,
                    torch.arange(n, dtype=torch.float32))  # fmt: skip
        counts = torch.empty(6, dtype=torch.int32)
        starts, multi = torch.full((32,), -1, dtype=torch.int64), torch.full((8,), -1, dtype=torch.int64)
        positions = [torch.full((len(class_pos),), -1, dtype=torch.int64) for _ in range(4)]  # piece, multi, short, long
        short_index, long_index = (torch.full((32,), -1, dtype=torch.int32) for _ in range(2))
        lists = (starts, multi, *positions[:2], *(starts,) * 6, short_index, long_index, *positions[2:], starts)
        flags = dict(PIECE=4, BLOCK=16, RECORDS=False, SCALED=True, SHORT=2)
        args = (*operands, class_pos, len(class_pos) - 1)
        _piece_marks_kernel[(2,)](*args, counts, *lists, WRITE=False, **flags)
        counted = counts.tolist()
        _piece_marks_kernel[(2,)](*args, counts.cumsum(0, dtype=torch.int32), *lists, WRITE=True, **flags)
        done = lambda t: t[: (t >= 0).sum()].tolist()  # noqa: E731
        starts = done(starts)
        return counted, starts, [starts[j] for j in done(short_index)], done(long_index), [p.tolist() for p in positions]

    # Rows 0 x9 (cut at 4, 8), 1, 2 x2, 5 x5 (whole; on into block 1), 7, 8 x2, 9 x3; classes at 0, 12, 23.
    counted, starts, short_starts, long_index, positions = marks(
        [0] * 9 + [1] + [2] * 2 + [5] * 5 + [7] + [8] * 2 + [9] * 3, [0, 12, 23])
    assert counted == [6, 4, 1, 0, 2, 2]  # pieces, multi runs, short runs; blocks 0 and 1
    assert starts == [0, 4, 8, 9, 10, 12, 17, 18, 20, 23]
    assert short_starts == [9, 10, 17, 18]  # rows 1, 2, 7, 8
    assert long_index == [0, 1, 2, 5, 8]  # 0's three pieces, 5's whole run, 9's (3 ids)
    assert positions == [[0, 5, 9], [0, 1, 1], [0, 2, 4], [0, 3, 5]]  # pieces, multi runs, short, long
    # A two-id run across the blocks' edge (15, 16): short.
    counted, starts, short_starts, long_index, positions = marks(list(range(15)) + [40] * 2 + [41] * 5, [0, 22])
    assert short_starts == list(range(16)) and long_index == [16] and positions[2:] == [[0, 16], [0, 1]]
    # A run of 8 from 12 (on into block 1): not short; a short run after it, up to the end.
    counted, starts, short_starts, long_index, positions = marks(list(range(12)) + [30] * 8 + [31] * 2, [0, 22])
    assert short_starts == list(range(12)) + [20] and long_index == [12] and starts == list(range(13)) + [20, 22]


@pytest.mark.parametrize("optimizer, short_two_states, expected", [
    ("EXACT_ROWWISE_ADAGRAD", False, ["short", "others", "all"]),
    ("ADAM", False, ["all", "all"]),
    ("ADAM", True, ["short", "others", "all"]),
])  # fmt: skip
def test_short_launch_by_optimizer_and_tile(monkeypatch, optimizer, short_two_states, expected):
    """``piece_short`` (the default): a class of tiles up to ``short_max_tile`` takes its short
    runs and its other pieces in two launches, a wider class all its pieces from the piece
    list; optimizers of two states (ADAM here) take the short launch too unless
    ``short_two_states`` is off. Tiles 8 and 256 here (short_max_tile 16), each run summed as the
    reference does."""
    from tbe_plugin.ops import pieces_launch

    kinds = []
    launch_class = pieces_launch._launch_piece_class

    def spy(*args, **kwargs):
        indirect, lanes = args[-1]["INDIRECT"], args[9]  # (PIECES: no lanes but the short launch's)
        kinds.append("all" if not indirect else "short" if lanes else "others")
        return launch_class(*args, **kwargs)

    monkeypatch.setattr(pieces_launch, "_launch_piece_class", spy)
    specs = [(23, 8), (9, 200)]
    emb = build(optimizer, specs=specs, ftm=[0, 1], learning_rate=0.05)
    emb.backward_launch = dataclasses.replace(PIECES, short_max_tile=16, short_two_states=short_two_states)
    train_and_compare(emb, optimizer, steps=1, B=6, max_len=8, hot=0.6, lr=0.05)
    assert kinds == expected


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "LAMB"])
def test_pieces_design_on_cuda(optimizer):
    """Zipf(1.15) ids over tables of tiles 16, 128 and 512 (B=16384): two runs of the pieces
    design agree bit for bit, and with ``piece_lanes``, ``piece_fit`` (grids cut to the
    resident programs) and ``piece_short``, and with the chunk design up to the order of fp32
    sums."""
    fit = RunsLaunch(piece_fit=True)
    launches = (RunsLaunch(design="pieces"), RunsLaunch(design="pieces"), RunsLaunch(piece_lanes=32), fit, fit, None,
                RunsLaunch(piece_short=4), RunsLaunch(piece_short=64, piece_fit=True))  # fmt: skip
    modules, _ = cuda_zipf_steps(optimizer, launches)
    assert_bitwise_equal(modules[0], modules[1])
    assert_bitwise_equal(modules[0], modules[2])  # operands a piece a lane: the same sums in the same order
    # piece_fit: the first module's launches learn each variant's resident programs, the
    # second's grids are cut to them; every piece is summed by one program either way.
    from tbe_plugin.ops.pieces_launch import _RESIDENT

    assert _RESIDENT and all(1 <= n <= 32 for n in _RESIDENT.values()), _RESIDENT
    assert_bitwise_equal(modules[0], modules[3])
    assert_bitwise_equal(modules[0], modules[4])
    torch.testing.assert_close(modules[0].weights, modules[5].weights, atol=1e-5, rtol=1e-5)
    # piece_short: runs of up to 4 (64) ids in a launch of their own, the same sums.
    assert_bitwise_equal(modules[0], modules[6])
    assert_bitwise_equal(modules[0], modules[7])


def test_pieces_int64_row_keys(monkeypatch):
    """Row keys sorted as int64 (2**31 rows or more in all): the pieces design's results
    are the reference's too."""
    from tbe_plugin.ops import embedding_backward

    monkeypatch.setattr(embedding_backward, "INT32_KEYS_BELOW", 0)
    emb = build("EXACT_ROWWISE_ADAGRAD", "MEAN", learning_rate=0.05)
    emb.backward_launch = PIECES
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=1, B=6, max_len=8, hot=0.7, weighted=True, lr=0.05)


def test_resident_programs_from_registers_and_warps():
    """``piece_fit``'s count of programs that fit a multiprocessor at once (64k registers,
    64 warps): registers are allocated 8 a thread at a time."""
    from tbe_plugin.ops.pieces_launch import resident_programs

    assert [resident_programs(r, 2) for r in (56, 64, 65, 66, 72, 93, 96)] == [18, 16, 14, 14, 14, 10, 10]
    assert resident_programs(92, 4) == 5 and resident_programs(24, 1) == 64 and resident_programs(255, 16) == 1
    assert resident_programs(64, 2, regs_per_sm=32768, warps_per_sm=48) == 8


def test_wide_tiles_take_their_own_unroll():
    """Tiles of 512 elements and more issue ``wide_piece_unroll`` gathers a step, narrower
    ones ``piece_unroll``; a D=300 table next to a D=8 one (tiles 512 and 16) trains as the
    reference does with hot runs longer than a step of either."""
    launch = dataclasses.replace(PIECES, piece_unroll=2, wide_piece_unroll=8)
    assert [launch.for_block_d(d).piece_unroll for d in (16, 256, 512, 1024)] == [2, 2, 8, 8]
    emb = build("EXACT_ROWWISE_ADAGRAD", specs=[(19, 300), (23, 8)], ftm=[0, 1], learning_rate=0.05)
    emb.backward_launch = launch
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, B=6, max_len=12, hot=0.8, lr=0.05)
    with pytest.raises(ValueError, match="RunsLaunch.wide_piece_unroll"):
        RunsLaunch(wide_piece_unroll=17)


@pytest.mark.parametrize("pooling, weighted, short, lanes", [("SUM", False, 0, 0), ("SUM", False, 4, 32),
                                                             ("MEAN", True, 0, 0), ("SUM", True, 2, 0)],
                         ids=["sum", "sum-short-lanes", "mean-weighted", "weighted-short"])
def test_repeats_within_a_bag_reuse_the_loaded_row_bitwise(pooling, weighted, short, lanes):
    """``piece_repeats``: ids that repeat a row in one bag (adjacent in the stable sort) take
    the row their lane loaded last; tables and states are bitwise those of gathering every
    id again, in pieces, short runs and lanes, scaled or not. The batches hold such repeats."""
    launch = dataclasses.replace(PIECES, piece_short=short, piece_lanes=lanes, piece_fit=lanes > 0,
                                 graph_max_ids=0)  # fmt: skip
    modules, psw_grads = [], []
    for repeats in (False, True):
        emb = build("ADAM", pooling, learning_rate=0.05)
        emb.backward_launch = dataclasses.replace(launch, piece_repeats=repeats)
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        grads = []
        for step in range(2):
            indices, offsets = make_bags(rows, B=8, max_len=12, seed=40 + step, hot_fraction=0.9)
            bags = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
            pairs = torch.stack([bags, indices], 1)
            assert pairs.unique(dim=0).shape[0] < indices.numel() * 0.8  # over a fifth of the ids are repeats
            psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)).requires_grad_(weighted)
            out = emb(indices, offsets, psw if weighted else None)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
            grads.append(psw.grad)
        modules.append(emb)
        psw_grads.append(grads)
    assert_bitwise_equal(*modules)
    if weighted:
        assert all(torch.equal(a, b) for a, b in zip(*psw_grads))
    assert not torch.equal(modules[0].weights, build("ADAM", pooling).weights)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_repeats_on_cuda(optimizer):
    """Zipf(1.15) ids over tables of tiles 16, 128 and 512 (B=16384, 20 ids a bag: the hot
    rows repeat within bags): ``piece_repeats`` trains bitwise like gathering every id, eager
    and graphed (the tile of 512 keeps gathering: the option covers tiles up to 256)."""
    launches = (RunsLaunch(graph_max_ids=0), RunsLaunch(graph_max_ids=0, piece_repeats=True),
                RunsLaunch(piece_repeats=True))  # fmt: skip
    modules, _ = cuda_zipf_steps(optimizer, launches)
    assert_bitwise_equal(modules[0], modules[1])
    assert_bitwise_equal(modules[0], modules[2])
