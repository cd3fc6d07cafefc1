"""Compile every kernel family for sm_90 on a machine without a GPU, and report spills.

The Triton interpreter accepts programs the GPU compiler rejects (an int32 index meeting
an int64 constant, a Python bool loop flag re-bound to a tensor), so CI also compiles the
kernels for real: Triton's wheel ships ptxas, and compiling needs no device. Run as a
script (``TRITON_INTERPRET=0``); it prints one JSON line per kernel variant.
"""

import dataclasses
import json
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported, whatever conftest did

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tbe_plugin.ops import backward_graphs as graphs  # noqa: E402
from tbe_plugin.ops import backward_pieces as pieces  # noqa: E402
from tbe_plugin.ops import backward_runs as runs  # noqa: E402
from tbe_plugin.ops import embedding_backward as backward  # noqa: E402
from tbe_plugin.ops.backward_launch import RadixSizes, RunsLaunch, runs_launch  # noqa: E402
from tbe_plugin.ops import embedding_forward as forward  # noqa: E402
from tbe_plugin.ops import hot_product as hot  # noqa: E402
from tbe_plugin.ops import hot_split  # noqa: E402
from tbe_plugin.ops import pieces_launch  # noqa: E402
from tbe_plugin.ops import positions  # noqa: E402
from tbe_plugin.ops import radix_sort as radix  # noqa: E402
from tbe_plugin.ops.common import vector_alignment  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOAT_ARGS = ()  # the update kernels read their hyperparameters from hyper_ptr
FLOAT_POINTERS = ("grad_ptr", "psw_ptr", "per_sample_weights_ptr", "segment_sums_ptr", "group_sums_ptr",
                  "supergroup_sums_ptr", "child_sums_ptr", "out_ptr",
                  "momentum1_ptr", "momentum2_ptr", "scale_ptr", "scale_out_ptr", "sorted_scale_ptr")  # fmt: skip
FLOAT_POINTERS += ("cell_sums_ptr",)
FP64_POINTERS = ("hyper_ptr",)
FLOAT_POINTERS += ("piece_scale_ptr",)
INT8_POINTERS = ("piece_flags_ptr", "out_flags_ptr", "flags_ptr")
INT32_POINTERS_MORE = ("piece_dim_ptr", "out_dim_ptr", "buckets_ptr", "marks_ptr", "short_index_ptr",
                       "long_index_ptr", "piece_index_ptr", "flag_ptr", "gate_ptr")  # fmt: skip
FLOAT_POINTERS += ("out_scale_ptr",)
FLOAT_POINTERS += ("hot_counts_ptr", "partials_ptr", "sums_ptr", "bag_scale_ptr", "touched_ptr")  # hot_rows
GRAD32 = {"sorted_grad_offset_ptr": "*i32"}  # RunsLaunch.lean_operands' gradient offsets
NO_EVICT = dict(EVICT=False)  # the pieces kernel's L2 hints (RunsLaunch.piece_evict): none
EVICT = dict(EVICT=True)
INT32_POINTERS = ("bag_ptr", "bag_out_ptr", "sorted_dim_ptr", "long_count_ptr", "class_chunk_ptr", "counts_ptr")


def signature(fn, constexprs, weights, keys, types=None):
    """Each argument's type; ``types``: a variant's own types of some pointers."""
    sig = {}
    for name in fn.arg_names:
        if types and name in types:
            sig[name] = types[name]
        elif name in constexprs:
            sig[name] = "constexpr"
        elif name == "weights_ptr":
            sig[name] = weights
        elif name in ("sorted_rows_ptr", "rows_ptr", "rows_out_ptr", "piece_row_ptr", "out_row_ptr"):
            sig[name] = keys
        elif fn.__name__ in ("_graph_fill_kernel", "_choose_hot_kernel") and name in ("indices_ptr", "offsets_ptr"):
            sig[name] = keys  # the graph's id and offset buffers: int32 or int64, as the caller's
        elif fn.__name__ == "_sorted_operands_kernel" and name == "bag_ptr" and constexprs.get("PACKED"):
            sig[name] = "*i64"  # RunsLaunch.merge_repeats: a bag and its factor's bits a word
        elif name in ("bags_out_ptr", "bag_out_ptr") and (constexprs.get("MERGE") or constexprs.get("PACKED")):
            sig[name] = "*i64"  # RunsLaunch.forward_positions: a bag and its factor packed
        elif name == "bags_out_ptr":
            sig[name] = "*i32"
        elif fn.__name__ == "_merged_positions_kernel" and name == "counts_ptr":
            sig[name] = "*i64"
        elif fn.__name__ == "_sorted_operands_kernel" and name == "perm_ptr" and constexprs.get("SORTED_BAGS"):
            sig[name] = "*i32"  # the bags, sorted beside the rows (RunsLaunch.radix_sort)
        elif name in ("values_in_ptr", "values_out_ptr"):
            sig[name] = keys  # radix_sort: int32 or int64 values beside int32 keys
        elif name in ("keys_ptr", "keys_in_ptr", "keys_out_ptr", "hist_ptr", "starts_ptr"):
            sig[name] = "*i32"
        elif name in FLOAT_POINTERS:
            sig[name] = "*fp32"
        elif name in INT32_POINTERS or name in INT32_POINTERS_MORE:
            sig[name] = "*i32"
        elif name in FP64_POINTERS:
            sig[name] = "*fp64"
        elif name in INT8_POINTERS:
            sig[name] = "*i8"
        elif name.endswith("_ptr"):
            sig[name] = "*i64"
        else:
            sig[name] = "fp32" if name in FLOAT_ARGS else "i32"
    return sig


def pointer_alignment(fn, constexprs):
    """Every pointer 16-byte aligned, as Triton's launcher specializes torch's allocations
    (without it, the compiler assumes unaligned pointers and never vectorizes a load)."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if name.endswith("_ptr") and name not in constexprs
    }


def stack_bytes(kernel) -> int:
    """Per-thread local memory (spills) from the cubin's resource usage."""
    return parse_stack_bytes(resource_report(kernel))


def resource_report(kernel) -> str:
    """``cuobjdump -res-usage`` of the kernel's cubin."""
    import subprocess
    import tempfile

    import triton.backends.nvidia as nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
        result = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump -res-usage exited {result.returncode}: {result.stderr[-500:]}")
    return result.stdout


def global_ops(ptx: str) -> dict:
    """Counts of the PTX's global loads and stores by width (``ld.global.v4.b32``: one
    16-byte vector load; ``ld.global.b32``: a scalar one), whatever their L2 qualifiers
    (``ld.global.L1::evict_last.L2::cache_hint.v4.b32`` counts as ``ld.global.v4.b32``: ``l2_hints``)."""
    import collections
    import re

    ops = re.findall(r"\b(ld|st)\.global(?:\.L[12]::\w+)*((?:\.v\d)?\.b\d+)", ptx)
    return dict(collections.Counter(f"{op}.global{width}" for op, width in ops))


def l2_hints(ptx: str) -> dict:
    """Counts of the PTX's L2 eviction policies (``createpolicy ... L2::evict_first``, ``L2::evict_last``:
    the cache-policy operands of the hinted loads and stores)."""
    import re

    return {hint: len(re.findall(rf"L2::{hint}\b", ptx)) for hint in ("evict_first", "evict_last")}


def parse_registers(report: str) -> int:
    """The most registers a thread of any function in a ``cuobjdump -res-usage`` report
    uses (``REG:<n>``); ValueError when there is none."""
    import re

    counts = [int(n) for n in re.findall(r"\bREG:(\d+)\b", report)]
    if not counts:
        raise ValueError(f"no REG:<count> in cuobjdump's resource report: {report[:500]!r}")
    return max(counts)


def parse_stack_bytes(report: str) -> int:
    """The largest per-thread stack (where spills go) among the functions of a
    ``cuobjdump -res-usage`` report, whose lines read ``Function NAME:`` and then
    ``REG:56 STACK:24 SHARED:0 LOCAL:0 ...``. A report without a function, or a function
    without a ``STACK`` count, raises ValueError: an unreadable report must fail the spill
    check, not pass it as "no spills"."""
    import re

    functions = re.findall(r"^\s*Function ([^\s:]+):[ \t]*\n(.*)$", report, flags=re.MULTILINE)
    if not functions:
        raise ValueError(f"no 'Function NAME:' in cuobjdump's resource report: {report[:500]!r}")
    stacks = []
    for name, usage in functions:
        match = re.search(r"\bSTACK:(\d+)\b", usage)
        if match is None:
            raise ValueError(f"no STACK:<bytes> for function {name} in cuobjdump's resource report: {usage[:500]!r}")
        stacks.append(int(match.group(1)))
    return max(stacks)


def variants():
    """The launch configurations the launchers use, for fp32 and fp16 weights, at the row
    alignment a module of those rows promises (``vector_alignment``: 4 elements for fp32,
    8 for 16-bit rows of D=128 and 512; with 4 for 16-bit rows the compile check read them
    8 bytes a load and missed the spills of the real 16-byte loads)."""
    for weights, elem in (("*fp32", 4), ("*fp16", 2), ("*bf16", 2)):
        align = vector_alignment([128, 512], elem)
        # The heuristic's classes at D=128, and wide rows (their own tile for 2-byte rows only).
        for avg_len, max_dim in ((1, 128), (4, 128), (10, 128), (20, 128), (30, 128), (20, 64), (100, 128), (20, 512)):
            bags, block_l, block_d, warps, stages, prefetch, *flat = forward.pooled_launch_config(
                avg_len, max_dim, elem, weights == "*bf16")
            if max_dim > 128 and block_d != forward.WIDE_TILE:
                continue  # 4-byte rows: the 128-column tile, compiled above
            if flat and flat[0] in (3, 4):  # a warp a bag (ops.forward_warp): FLAT 3's rows and FLAT 4's lean ones
                for mean, weighted, lean, full in ((False, False, False, False), (True, False, False, False),
                                                   (True, True, False, False), (False, False, True, True),
                                                   (False, False, True, False), (True, True, True, True)):  # fmt: skip
                    yield forward._warp_pooled_forward_kernel, dict(
                        MEAN=mean, WEIGHTED=weighted, CHECK=True, ALIGN=align, BAGS=bags, UNROLL=block_l,
                        BLOCK_D=block_d, DIRECT=True, ROUND=forward.LANES, LEAN=lean, FULL=full, POSITIONS=False,
                        MERGE=False,
                    ), (warps, stages), weights, "*i32"  # fmt: skip
                # RunsLaunch.forward_positions: the training forward writes the backward's positions too.
                for mean, lean, full, bags_at_once, merge in (
                        (False, True, True, bags, True), (True, True, False, bags, True),
                        (False, False, False, 2, True), (False, True, True, bags, False),
                        (False, False, False, 2, False)):  # fmt: skip
                    yield forward._warp_pooled_forward_kernel, dict(
                        MEAN=mean, WEIGHTED=False, CHECK=True, ALIGN=align, BAGS=bags_at_once, UNROLL=block_l,
                        BLOCK_D=block_d, DIRECT=True, ROUND=forward.LANES, LEAN=lean, FULL=full, POSITIONS=True,
                        MERGE=merge,
                    ), (bags_at_once if not lean else warps, stages), weights, "*i32"  # fmt: skip
                continue
            kernel = forward._flat_pooled_forward_kernel if flat and flat[0] else forward._pooled_forward_kernel
            marks = dict(MARKS=flat[0] == 2) if flat and flat[0] else {}
            for mean, weighted in ((False, False), (True, False), (True, True)):
                yield kernel, dict(
                    MEAN=mean, WEIGHTED=weighted, CHECK=True, ALIGN=align, BAGS=bags, BLOCK_L=block_l,
                    BLOCK_D=block_d, PREFETCH=bool(prefetch), DIRECT=avg_len == 20, **marks,
                ), (warps, stages), weights, "*i32"  # fmt: skip
        if weights == "*bf16":
            continue
        # The sweep's candidates with the next step's ids loaded ahead (tune_forward's production_first).
        # (16, 2) is fp32's heuristic tile; 16-bit rows spill there (their own tile, above).
        tiles = ((1, 8, 1), (1, 16, 1), (16, 2, 1), (4, 8, 4)) if elem == 4 else ((1, 8, 1), (1, 16, 1), (4, 8, 4))
        for bags, block_l, warps in tiles:  # one stage, as swept
            yield forward._pooled_forward_kernel, dict(
                MEAN=False, WEIGHTED=False, CHECK=True, ALIGN=align, BAGS=bags, BLOCK_L=block_l, BLOCK_D=128,
                PREFETCH=True, DIRECT=True,
            ), (warps, 1), weights, "*i32"  # fmt: skip
        # The flat-range kernel (ops.forward_flat) with and without bag marks: the tiles
        # tune_forward sweeps first, MEAN and weighted on one of them.
        for bags, block_l in ((16, 16), (16, 32), (32, 32), (8, 16), (32, 16)):
            for marks in (False, True):
                for mean, weighted in ((False, False),) if (bags, block_l) != (16, 16) else ((False, False),
                                                                                              (True, True)):
                    yield forward._flat_pooled_forward_kernel, dict(
                        MEAN=mean, WEIGHTED=weighted, CHECK=True, ALIGN=align, BAGS=bags, BLOCK_L=block_l,
                        BLOCK_D=128, PREFETCH=True, DIRECT=True, MARKS=marks,
                    ), (1, 1), weights, "*i32"  # fmt: skip
        if elem == 4:
            yield forward._bag_marks_kernel, dict(BLOCK=1024), 4, weights, "*i32"
        block_n, block_d, warps = forward.unpooled_launch_config(128, elem)
        yield forward._unpooled_forward_kernel, dict(
            WEIGHTED=False, CHECK=True, ALIGN=align, SEARCH_STEPS=6, BLOCK_N=block_n, BLOCK_D=block_d
        ), warps, weights, "*i32"
        rounding = weights != "*fp32"
        launch = dataclasses.replace(runs_launch(), design="chunks")  # the chunk design's kernels
        for block_d in (16, 128, 512):
            sizes = launch.for_block_d(block_d)
            for optimizer in range(6):
                modes = dict(
                    SCALED=True, OPTIMIZER=optimizer, WEIGHT_DECAY_MODE=1 if optimizer == 1 else 0,
                    STOCHASTIC_ROUNDING=rounding, BLOCK_D=block_d, ALIGN=4,
                )  # fmt: skip
                chunk = dict(modes, CHUNK=sizes.chunk_ids, BARRIER=sizes.chunk_warps > 1)
                yield runs._chunk_kernel, dict(chunk, MODE=2, HALO=0), sizes.chunk_warps, weights, "*i32"
                if optimizer == 1:  # the other modes and the halo (launch options), for one optimizer
                    for mode in (0, 1):
                        yield runs._chunk_kernel, dict(chunk, MODE=mode, HALO=sizes.chunk_ids * mode), \
                            sizes.chunk_warps, weights, "*i32"  # fmt: skip
                yield runs._long_run_kernel, dict(modes, SEGMENT=launch.segment_ids, STEP=sizes.step_ids,
                                                  FAN_IN=launch.fan_in), sizes.loop_warps, weights, "*i64"
            yield runs._segment_kernel, dict(SCALED=True, BLOCK_D=block_d, CHUNK=sizes.chunk_ids,
                                             SEGMENT=launch.segment_ids, STEP=sizes.step_ids, ALIGN=4,
                                             BATCH=launch.batch), \
                sizes.loop_warps, weights, "*i64"  # fmt: skip
            yield runs._group_kernel, dict(BLOCK_D=block_d, CHUNK=sizes.chunk_ids, FAN_IN=launch.fan_in,
                                           BATCH=launch.batch), \
                sizes.loop_warps, weights, "*i64"  # fmt: skip
    yield from pieces_variants()
    for write in (False, True):
        yield runs._listed_chunks_kernel, dict(WRITE=write, BLOCK=backward.LIST_BLOCK), 4, "*fp32", "*i32"
    yield forward._offsets_check_kernel, dict(BLOCK=1024), 4, "*fp32", "*i32"
    for keys in ("*i32", "*i64"):
        yield backward._positions_kernel, dict(MEAN=True, WEIGHTED=True, CHECK=True, BLOCK=backward.POSITIONS_BLOCK,
                                               HOT=0, LOG_HOT=0, GATED=False, PACKED=False), \
            backward.POSITIONS_WARPS, "*fp32", keys  # fmt: skip
    # RunsLaunch.merge_repeats: windows of 8 to 64, SUM and MEAN weighted, compacted and in
    # place (merge_compact); the compaction.
    for window in (8, 16, 32, 64):
        for scaled, compact in ((False, True), (True, True), (False, False), (True, False)):
            yield positions._merged_positions_kernel, dict(MEAN=scaled, WEIGHTED=scaled, CHECK=True,
                                                           BLOCK=positions.merge_block(window), WINDOW=window,
                                                           COMPACT=compact), \
                positions.MERGE_WARPS, "*fp32", "*i32"  # fmt: skip
        yield positions._compact_kernel, dict(BLOCK=positions.merge_block(window)), positions.COMPACT_WARPS, "*fp32", \
            "*i32"  # fmt: skip
    # RunsLaunch.forward_positions: irregular offsets found, the positions rewritten there.
    yield positions._offsets_irregular_kernel, dict(BLOCK=positions.POSITIONS_BLOCK), 4, "*fp32", "*i32"
    for mean, packed in ((False, False), (False, True), (True, True)):
        yield positions._positions_kernel, dict(MEAN=mean, WEIGHTED=False, CHECK=True, BLOCK=positions.POSITIONS_BLOCK,
                                                HOT=0, LOG_HOT=0, GATED=True, PACKED=packed), \
            positions.POSITIONS_WARPS, "*fp32", "*i32"  # fmt: skip
    # RunsLaunch.hot_rows: the positions kernel counting 16 hot rows a feature, the product, the update.
    yield backward._positions_kernel, dict(MEAN=False, WEIGHTED=False, CHECK=True, BLOCK=backward.POSITIONS_BLOCK,
                                           HOT=16, LOG_HOT=4, GATED=False, PACKED=False), backward.POSITIONS_WARPS, \
        "*fp32", "*i32"  # fmt: skip
    # RunsLaunch.hot_split: the hot ids found in the forward's positions, the others compacted.
    for keys, sentinel in (("*i32", "i32"), ("*i64", "i64")):
        types = {"bags_ptr": "*i32", "sentinel": sentinel}
        yield hot_split._hot_split_kernel, dict(HOT=16, LOG_HOT=4, BLOCK=hot_split.SPLIT_BLOCK), \
            hot_split.SPLIT_WARPS, "*fp32", keys, dict(types, kept_ptr="*i64")  # fmt: skip
        yield hot_split._kept_counts_kernel, dict(BLOCK=hot_split.SPLIT_BLOCK), hot_split.SPLIT_WARPS, "*fp32", keys, \
            dict(types, counts_ptr="*i64")  # fmt: skip
        for scaled in (False, True):
            yield hot_split._compact_kept_kernel, dict(SCALED=scaled, BLOCK=hot_split.SPLIT_BLOCK), \
                hot_split.SPLIT_WARPS, "*fp32", keys, types  # fmt: skip
    for scaled, tf32x3 in ((False, False), (True, False), (False, True), (True, True)):  # SUM, MEAN; hot_tf32x3
        for k in ((16, 64) if tf32x3 else (16,)):
            yield hot._hot_partials_kernel, dict(K=k, BLOCK_B=64, BLOCK_D=64, SPLIT_B=1024, SCALED=scaled,
                                                 TF32X3=tf32x3), 4, "*fp32", "*i32"  # fmt: skip
    yield hot._hot_sum_kernel, dict(K=16, BLOCK_D=64), 4, "*fp32", "*i32"
    # The choice of the hot rows (choose_hot_rows' largest block): a table of one feature at the
    # default sample (4096) and K=16, int32 and int64 ids; four features of 1024 samples, K=64.
    block = hot.CHOOSE_MAX_BLOCK
    for keys, members, k in (("*i32", 1, 16), ("*i64", 1, 16), ("*i64", 4, 64)):
        yield hot._choose_hot_kernel, dict(K=k, M=members, BLOCK=block, LOG_BLOCK=block.bit_length() - 1,
                                           CHECK=True), hot.CHOOSE_WARPS, "*fp32", keys  # fmt: skip
    for weights, optimizer in (("*fp32", 1), ("*fp16", 1), ("*fp32", 3), ("*fp32", 5)):
        yield hot._hot_update_kernel, dict(
            HOT=16, ROWS=hot.HOT_UPDATE_ROWS, BLOCK_D=128, OPTIMIZER=optimizer, WEIGHT_DECAY_MODE=0,
            STOCHASTIC_ROUNDING=weights != "*fp32", ALIGN=4,
        ), 4, weights, "*i32"  # fmt: skip
    for scaled, sorted_bags, packed in ((True, False, False), (False, True, False), (True, False, True)):
        operands = dict(UNPOOLED=False, SCALED=scaled, BLOCK=backward.SORTED_OPERANDS_BLOCK, SORTED_BAGS=sorted_bags,
                        PACKED=packed, MARKS=False, PIECE=1, SHORT=0)  # fmt: skip
        yield backward._sorted_operands_kernel, operands, backward.SORTED_OPERANDS_WARPS, "*fp32", "*i32"
    # RunsLaunch.marks_in_operands: the marks found beside the operands (short runs listed apart or not).
    for keys, scaled, short in (("*i32", False, 16), ("*i32", True, 0), ("*i64", False, 16)):
        operands = dict(UNPOOLED=False, SCALED=scaled, BLOCK=backward.SORTED_OPERANDS_BLOCK, SORTED_BAGS=False,
                        PACKED=False, MARKS=True, PIECE=RunsLaunch().piece_ids, SHORT=short)  # fmt: skip
        yield backward._sorted_operands_kernel, operands, backward.SORTED_OPERANDS_WARPS, "*fp32", keys
    # RunsLaunch.lean_operands: int32 gradient offsets, a row's start and D at heads and grid points.
    operands = dict(UNPOOLED=False, SCALED=False, BLOCK=backward.SORTED_OPERANDS_BLOCK, SORTED_BAGS=False,
                    PACKED=False, MARKS=False, PIECE=RunsLaunch().piece_ids, SHORT=0, LEAN=True)  # fmt: skip
    yield backward._sorted_operands_kernel, operands, backward.SORTED_OPERANDS_WARPS, "*fp32", "*i32", GRAD32
    for keys, weighted in (("*i32", True), ("*i64", False)):  # RunsLaunch.graph_fill
        yield graphs._graph_fill_kernel, dict(WEIGHTED=weighted, BLOCK=graphs.FILL_BLOCK), 4, "*fp32", keys
    sizes = RadixSizes()
    yield radix._tile_histogram_kernel, dict(RADIX=256, TILE=sizes.tile), sizes.warps, "*fp32", "*i32"
    matched = RadixSizes(sub_tile=64, warps=2, ranking="match")
    for values, sizes in (("*i32", RadixSizes()), ("*i64", RadixSizes()), ("*i32", matched)):
        sub = dict(SUB=sizes.sub_tile, LOG_SUB=sizes.sub_tile.bit_length() - 1, MATCH=sizes.ranking == "match")
        yield radix._tile_scatter_kernel, dict(RADIX=256, TILE=sizes.tile, **sub), sizes.warps, "*fp32", values
    psw = dict(backward.PSW_CONFIG)
    for cell in (False, True):
        yield backward._psw_grad_kernel, dict(MEAN=True, BLOCK_N=psw["BLOCK_N"], BLOCK_D=128, GRAD_CELL=cell), \
            psw["num_warps"], "*fp32", "*i32"  # fmt: skip


# The pieces design's launch values in profile_backward's candidates (piece_ids, piece_elements).
# (weights, optimizer) of the pieces design's update kernels that CI compiles: the
# production pair and the heaviest of each kernel at cbef21c (ptxas, every optimizer at
# tiles 16, 128, 512: results/sm90_backward_pieces_cbef21c.jsonl). ~3 s a variant.
PIECES_UPDATES = (("*fp16", 1), ("*fp32", 3))
MULTI_UPDATES = (("*fp16", 1), ("*fp32", 4))


def pieces_variants():
    """The ``pieces`` design's kernels (default launch) at tiles 16, 128 and 512."""
    launch = RunsLaunch(design="pieces")
    for block_d in (16, 128, 512):
        sizes = launch.for_block_d(block_d)
        for kernel, updates in ((pieces._pieces_kernel, PIECES_UPDATES), (pieces._multi_runs_kernel, MULTI_UPDATES)):
            for weights, optimizer in updates:
                constexprs = dict(OPTIMIZER=optimizer, WEIGHT_DECAY_MODE=1 if optimizer == 1 else 0,
                                  STOCHASTIC_ROUNDING=weights != "*fp32", BLOCK_D=block_d,
                                  ALIGN=vector_alignment([block_d], 4 if weights == "*fp32" else 2),
                                  PIECE=launch.piece_ids)  # fmt: skip
                if kernel is pieces._pieces_kernel:
                    constexprs.update(SCALED=True, RUNS=sizes.piece_runs, UNROLL=sizes.piece_unroll,
                                      BARRIER=sizes.piece_warps > 1, RECORDS=False, STOPS=False,
                                      GRAD_CELL=False, LANES=0, INDIRECT=False, REPEATS=False, **NO_EVICT)  # fmt: skip
                    yield kernel, constexprs, sizes.piece_warps, weights, "*i32"
                    # RunsLaunch.piece_repeats (tiles up to 256): a bag's repeats of a row take the row loaded last
                    if block_d <= 256:
                        yield kernel, dict(constexprs, REPEATS=True), sizes.piece_warps, weights, "*i32"
                    if sizes.short_lanes and block_d <= 256:
                        short = dict(constexprs, LANES=sizes.short_lanes, RUNS=sizes.short_runs, INDIRECT=True,
                                     BARRIER=sizes.short_warps > 1, REPEATS=True)  # fmt: skip
                        yield kernel, short, sizes.short_warps, weights, "*i32"
                        if block_d == 128:  # RunsLaunch.lean_operands: int32 gradient offsets, both launches
                            yield kernel, short, sizes.short_warps, weights, "*i32", GRAD32
                            yield kernel, constexprs, sizes.piece_warps, weights, "*i32", GRAD32
                            # RunsLaunch.piece_evict: L2 eviction hints, both launches
                            yield kernel, dict(short, **EVICT), sizes.short_warps, weights, "*i32"
                            yield kernel, dict(constexprs, **EVICT), sizes.piece_warps, weights, "*i32"
                    if (weights, optimizer) == PIECES_UPDATES[0]:  # the records, ordered and in-place candidates
                        yield kernel, dict(constexprs, RECORDS=True), sizes.piece_warps, weights, "*i32"
                        yield kernel, dict(constexprs, RECORDS=True, STOPS=True), sizes.piece_warps, weights, "*i32"
                        yield kernel, dict(constexprs, GRAD_CELL=True), sizes.piece_warps, weights, "*i32"
                        if block_d >= 128:  # operands a piece a lane (piece_lanes; at 16, RUNS is 16 already)
                            yield kernel, dict(constexprs, LANES=32), sizes.piece_warps, weights, "*i32"
                        if block_d == 128:  # ... on one-warp programs, a piece a group (profile_backward's lanes32_w1)
                            yield kernel, dict(constexprs, LANES=32, RUNS=1, BARRIER=False), 1, weights, "*i32"
                        # RunsLaunch.piece_short: the short runs' launch and the other pieces' (both through
                        # indices into the piece list)
                        if sizes.short_lanes:  # (tiles wider than short_max_tile take no short launch)
                            yield kernel, dict(constexprs, LANES=sizes.short_lanes, RUNS=sizes.short_runs,
                                               INDIRECT=True, BARRIER=sizes.short_warps > 1), sizes.short_warps, \
                                weights, "*i32"  # fmt: skip
                        yield kernel, dict(constexprs, INDIRECT=True), sizes.piece_warps, weights, "*i32"
                    if block_d == 128 and optimizer == 3:  # the short launch with two state rows (ADAM)
                        yield kernel, dict(constexprs, LANES=sizes.short_lanes, RUNS=sizes.short_runs, INDIRECT=True,
                                           BARRIER=sizes.short_warps > 1), sizes.short_warps, weights, "*i32"  # fmt: skip
                else:
                    yield kernel, dict(constexprs, FAN_IN=launch.fan_in), sizes.tree_warps, weights, "*i32"
        yield pieces._cell_groups_kernel, dict(BLOCK_D=block_d, FAN_IN=launch.fan_in, PIECE=launch.piece_ids), \
            sizes.tree_warps, "*fp32", "*i32"  # fmt: skip
    for write, keys, records, short, flags in ((False, "*i32", False, 0, False), (True, "*i32", False, 0, False),
                                               (True, "*i64", False, 0, False), (True, "*i32", True, 0, False),
                                               (False, "*i32", False, 16, False), (True, "*i32", False, 16, False),
                                               (True, "*i32", False, 16, True), (True, "*i32", True, 16, True)):
        # (int64 keys: 2**31 rows or more; flags: RunsLaunch.marks_in_operands)
        yield pieces._piece_marks_kernel, dict(WRITE=write, PIECE=launch.piece_ids, BLOCK=pieces_launch.MARKS_BLOCK,
                                               RECORDS=records, SCALED=True, SHORT=short, FLAGS=flags), \
            pieces_launch.MARKS_WARPS, "*fp32", keys  # fmt: skip
    for scatter in (False, True):
        yield pieces._piece_order_kernel, dict(SCATTER=scatter, SCALED=True, BLOCK=pieces_launch.ORDER_BLOCK), \
            pieces_launch.ORDER_WARPS, "*fp32", "*i32"  # fmt: skip
    sizes = launch.for_block_d(128)
    yield pieces._pieces_kernel, dict(OPTIMIZER=1, WEIGHT_DECAY_MODE=1, STOCHASTIC_ROUNDING=False, BLOCK_D=128, ALIGN=4,
                                      PIECE=launch.piece_ids, SCALED=True, RUNS=sizes.piece_runs,
                                      UNROLL=sizes.piece_unroll, BARRIER=True, RECORDS=False, STOPS=False,
                                      GRAD_CELL=False, LANES=0, INDIRECT=False, REPEATS=False, **NO_EVICT), \
        sizes.piece_warps, \
        "*fp32", "*i64"  # fmt: skip


def main():
    import sys

    only = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else None  # kernel names, to compile a few
    for fn, constexprs, num_warps, weights, keys, *types in variants():
        if only is not None and fn.__name__ not in only:
            continue
        types = types[0] if types else None
        src = ASTSource(
            fn=fn,
            signature=signature(fn, constexprs, weights, keys, types),
            constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
            attrs=pointer_alignment(fn, constexprs),
        )
        num_warps, num_stages = num_warps if isinstance(num_warps, tuple) else (num_warps, 3)  # (warps, stages)
        record = {"kernel": fn.__name__, "weights": weights, "num_warps": num_warps, "num_stages": num_stages,
                  "constexprs": constexprs, **({"types": types} if types else {})}  # fmt: skip
        try:
            kernel = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
            report = resource_report(kernel)
            record["stack_bytes"] = parse_stack_bytes(report)
            record["registers"] = parse_registers(report)
            record["global_ops"] = global_ops(kernel.asm["ptx"])
            record["l2_hints"] = l2_hints(kernel.asm["ptx"])
        except Exception as error:  # reported, and failed by the test
            record["error"] = f"{type(error).__name__}: {error}"[:2000]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
