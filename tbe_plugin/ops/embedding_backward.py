"""Table-batched embedding backward with the optimizer fused: Triton kernels and launcher.

No dense gradient is ever materialized. The backward of one batch:

1. ``_positions_kernel``: for every id, its global row (rows of all tables stacked, with
   the forward's bounds repair), its feature, where its output-gradient row starts and
   its factor (per-sample weight, 1/L for MEAN). Ids outside every bag get a sentinel row.
2. ``torch.sort`` (stable) of the global rows, as int32 when all tables together have
   fewer than 2**31 rows (a radix sort of half the passes): equal rows form contiguous
   runs; the stable order makes every sum below deterministic. ``_sorted_operands_kernel``
   then lays the ids' operands out in sorted order, with each row's start in the weights.
3. ``_chunk_kernel``: fixed chunks of CHUNK sorted ids. Each gathers its CHUNK
   output-gradient rows at once and sums them per run with a segmented scan (a fixed
   tree), updates every row whose run starts and ends in it, and stores the sum of its
   last run when that run goes on into the next chunk.
4. ``_group_kernel`` (twice): per group of FAN_IN chunks, and per group of FAN_IN groups,
   the sum of the sums of the group's last run when it goes on past the group.
5. ``_crossing_kernel``: each run spanning chunks, at the chunk where it ends: its ids
   there, then the chunk, group and supergroup sums it covers, FAN_IN a step; then its
   update. A run of n ids takes about 2 + log_FAN_IN(n / CHUNK) rounds of loads.
   Memory beyond the sorted operands: one fp32 row per chunk, and 1/FAN_IN of that per
   level above (16 bytes per id at D=128, 64 at D=512: chunks hold at least 32 ids).

Steps 3 to 5 are in ``tbe_plugin.ops.backward_runs``. The optimizer update itself
(``optimizers.apply_update``) sees each touched row once per step with its exact
aggregated gradient, as FBGEMM's exact optimizers do.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_runs import _chunk_kernel, _crossing_kernel, _group_kernel
from tbe_plugin.ops.common import Pooling, new_status
from tbe_plugin.ops.indexing import (
    _META_COLS,
    _META_DIM,
    _META_OUT_OFFSET,
    _META_ROW_BASE,
    _META_ROWS,
    _META_WEIGHT_OFFSET,
    _checked_bag_bounds,
    _checked_ids,
)
from tbe_plugin.ops.optimizers import OptimizerArgs


@triton.jit
def _positions_kernel(
    feature_meta_ptr, indices_ptr, offsets_ptr, psw_ptr, rows_out_ptr, feature_out_ptr,
    grad_offset_out_ptr, scale_out_ptr, bag_out_ptr, scratch_ptr,
    B, total_bags, num_indices, grad_stride,
    UNPOOLED: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr, CHECK: tl.constexpr,
    WRITE_BAGS: tl.constexpr, BAGS: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """Per id, bag by bag (the forward's tiling): its global row (the sort key, with the
    forward's bounds repair), its feature, where its output-gradient row starts, and the
    factor on that row (per-sample weight, 1/L for MEAN)."""
    feature = tl.program_id(1).to(tl.int64)
    meta = feature_meta_ptr + feature * _META_COLS
    rows = tl.load(meta + _META_ROWS)
    row_base = tl.load(meta + _META_ROW_BASE)
    out_offset = tl.load(meta + _META_OUT_OFFSET)
    b = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
    b_mask = b < B
    bag = feature * B + b
    start, end = _checked_bag_bounds(offsets_ptr, bag, b_mask, num_indices, total_bags, scratch_ptr, CHECK)
    length = end - start
    inv_len = tl.div_rn(1.0, tl.maximum(length, 1).to(tl.float32))
    for l0 in range(0, tl.max(length, axis=0), BLOCK_L):
        l = l0 + tl.arange(0, BLOCK_L)
        mask = l[:, None] < length[None, :]
        pos = start[None, :] + l[:, None]
        ids = _checked_ids(indices_ptr, pos, mask, rows, scratch_ptr, CHECK)
        tl.store(rows_out_ptr + pos, row_base + ids, mask=mask)
        tl.store(feature_out_ptr + pos, feature.to(tl.int32) + tl.zeros_like(pos).to(tl.int32), mask=mask)
        if UNPOOLED:
            grad_offset = pos * grad_stride
        else:
            grad_offset = b[None, :].to(tl.int64) * grad_stride + out_offset + 0 * pos
        tl.store(grad_offset_out_ptr + pos, grad_offset, mask=mask)
        if WEIGHTED or MEAN:
            scale = tl.full(pos.shape, 1.0, tl.float32)
            if WEIGHTED:
                scale *= tl.load(psw_ptr + pos, mask=mask, other=0.0).to(tl.float32)
            if MEAN:
                scale *= inv_len[None, :]
            tl.store(scale_out_ptr + pos, scale, mask=mask)
        if WRITE_BAGS:
            tl.store(bag_out_ptr + pos, bag[None, :] + tl.zeros_like(pos), mask=mask)


@triton.jit
def _sorted_operands_kernel(
    perm_ptr, sorted_rows_ptr, feature_ptr, grad_offset_ptr, scale_ptr, feature_meta_ptr,
    sorted_w_start_ptr, sorted_dim_ptr, sorted_grad_offset_ptr, sorted_scale_ptr,
    num_indices, sentinel, SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Per sorted id, what the update kernel needs, stored contiguously in sorted order:
    where its row starts in the flat weights, its D, its output-gradient row and factor."""
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(sorted_rows_ptr + q, mask=q < num_indices, other=sentinel)
    valid = row != sentinel
    p = tl.load(perm_ptr + q, mask=valid, other=0)
    meta = feature_meta_ptr + tl.load(feature_ptr + p, mask=valid, other=0) * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    local = row - tl.load(meta + _META_ROW_BASE, mask=valid, other=0)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET, mask=valid, other=0) + local * dim
    tl.store(sorted_w_start_ptr + q, w_start, mask=valid)
    tl.store(sorted_dim_ptr + q, dim.to(tl.int32), mask=valid)
    tl.store(sorted_grad_offset_ptr + q, tl.load(grad_offset_ptr + p, mask=valid, other=0), mask=valid)
    if SCALED:
        tl.store(sorted_scale_ptr + q, tl.load(scale_ptr + p, mask=valid, other=0.0), mask=valid)


@triton.jit
def _psw_grad_kernel(
    grad_ptr, grad_stride, weights_ptr, feature_meta_ptr, rows_ptr, bag_ptr, offsets_ptr,
    out_ptr, scratch_ptr, B, total_bags, num_indices, sentinel,
    MEAN: tl.constexpr, CHECK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """d loss / d per_sample_weight[p] = <grad of p's bag, p's weight row> (/ L for MEAN)."""
    p = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(rows_ptr + p, mask=p < num_indices, other=sentinel)
    valid = row != sentinel
    bag = tl.load(bag_ptr + p, mask=valid, other=0)
    meta = feature_meta_ptr + (bag // B) * _META_COLS
    dim = tl.load(meta + _META_DIM, mask=valid, other=0)
    local = row - tl.load(meta + _META_ROW_BASE, mask=valid, other=0)
    w_start = tl.load(meta + _META_WEIGHT_OFFSET, mask=valid, other=0) + local * dim
    g_start = (bag % B) * grad_stride + tl.load(meta + _META_OUT_OFFSET, mask=valid, other=0)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for d0 in range(0, tl.max(dim, axis=0), BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = valid[:, None] & (cols[None, :] < dim[:, None])
        w = tl.load(weights_ptr + w_start[:, None] + cols[None, :], mask=mask, other=0.0)
        g = tl.load(grad_ptr + g_start[:, None] + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * g.to(tl.float32), axis=1)
    if MEAN:
        start, end = _checked_bag_bounds(offsets_ptr, bag, valid, num_indices, total_bags, scratch_ptr, CHECK)
        acc = tl.div_rn(acc, tl.maximum(end - start, 1).to(tl.float32))
    tl.store(out_ptr + p, acc, mask=p < num_indices)


SORTED_OPERANDS_BLOCK = 1024
SORTED_OPERANDS_WARPS = 4
POSITIONS_CONFIG = dict(BAGS=64, BLOCK_L=4, num_warps=4)  # measured best of 4 on the H200
PSW_CONFIG = dict(BLOCK_N=32, num_warps=8)  # 2 warps spilled 2.3 KB a thread
# Global rows are sorted as int32 below this many rows in all, int64 from there on.
INT32_KEYS_BELOW = torch.iinfo(torch.int32).max


@dataclasses.dataclass(frozen=True)
class RunsLaunch:
    """Launch sizes of the per-run kernels (``backward_runs``); ``runs_launch`` picks them,
    tests and profilers pass their own to ``backward_update``."""

    chunk_ids: int
    """Sorted ids per ``_chunk_kernel`` program (a power of two): its gather is
    ``chunk_ids x BLOCK_D``; the chunk sums take 4 * BLOCK_D / chunk_ids bytes per id."""
    chunk_warps: int
    """Warps of a chunk program."""
    fan_in: int
    """Units per group (chunks per group, groups per supergroup), and sums the crossing
    kernel adds per step (a power of two)."""
    group_warps: int
    """Warps of a ``_group_kernel`` program."""
    crossing_chunks: int
    """Chunks a ``_crossing_kernel`` program looks at (at most one crossing run ends in each)."""
    crossing_warps: int
    """Warps of a crossing program."""
    chunk_stages: int = 0
    """0: a ``_chunk_kernel`` program per chunk; n >= 1: a fixed grid of programs that loop
    over the chunks, software-pipelined n stages deep (the next chunks' gathers copied
    into shared memory while one is updated)."""
    chunk_programs_per_sm: int = 2
    """With ``chunk_stages`` >= 1: looping programs per multiprocessor."""
    prefetch_chunks: int = 0
    """> 0: each chunk program first asks L2 for the sorted arrays of the chunk this many
    chunks ahead (GPU only; the interpreter ignores it)."""

    def __post_init__(self) -> None:
        for name in ("chunk_ids", "fan_in"):
            value = getattr(self, name)
            if value < 2 or value & (value - 1):
                raise ValueError(f"RunsLaunch.{name} must be a power of two >= 2, got {value}")
        for name in ("chunk_warps", "group_warps", "crossing_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16, 32):
                raise ValueError(f"RunsLaunch.{name} must be a power of two from 1 to 32, got {getattr(self, name)}")
        if self.chunk_stages < 0 or self.chunk_programs_per_sm < 1:
            raise ValueError(
                f"RunsLaunch.chunk_stages must be >= 0 and RunsLaunch.chunk_programs_per_sm >= 1, got "
                f"{self.chunk_stages} and {self.chunk_programs_per_sm}"
            )
        if self.crossing_chunks < 1:
            raise ValueError(f"RunsLaunch.crossing_chunks must be >= 1, got {self.crossing_chunks}")


# A chunk gathers CHUNK_ELEMENTS gradient elements (32 ids at D=128) but at least
# MIN_CHUNK_IDS ids, so that the chunk sums stay at 4 * D / 32 bytes per id at large D;
# ELEMENTS_PER_WARP of them per warp. Not yet timed on the H200.
CHUNK_ELEMENTS = 4096
MIN_CHUNK_IDS = 32
ELEMENTS_PER_WARP = 256
FAN_IN = 32
GROUP_WARPS = 4
CROSSING_CHUNKS = 4
CROSSING_WARPS = 4


def runs_launch(block_d: int) -> RunsLaunch:
    """The default launch sizes for rows of at most ``block_d`` elements."""
    chunk_ids = max(MIN_CHUNK_IDS, CHUNK_ELEMENTS // block_d)
    warps = max(1, min(32, chunk_ids * block_d // ELEMENTS_PER_WARP))
    return RunsLaunch(chunk_ids=chunk_ids, chunk_warps=warps, fan_in=FAN_IN, group_warps=GROUP_WARPS,
                      crossing_chunks=CROSSING_CHUNKS, crossing_warps=CROSSING_WARPS)  # fmt: skip


_MULTIPROCESSORS: dict = {}


def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (4 for the CPU's interpreter)."""
    key = str(device)
    if key not in _MULTIPROCESSORS:
        cuda = device.type == "cuda"
        _MULTIPROCESSORS[key] = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    return _MULTIPROCESSORS[key]


_SCRATCH: dict = {}


def _scratch_status(device: torch.device) -> torch.Tensor:
    """A status vector per device that the backward's bounds checks write and nobody reads
    (one allocation and fill per process instead of three small ops a step)."""
    key = str(device)
    if key not in _SCRATCH:
        _SCRATCH[key] = new_status(device)
    return _SCRATCH[key]


def backward_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    momentum1: Optional[torch.Tensor],
    momentum2: Optional[torch.Tensor],
    step: Optional[torch.Tensor],
    feature_meta: torch.Tensor,
    max_dim: int,
    total_rows: int,
    align: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    bounds_check: bool,
    args: OptimizerArgs,
    launch: Optional[RunsLaunch] = None,
) -> Optional[torch.Tensor]:
    """Applies one optimizer step to every row the batch touched; returns the gradient
    of ``per_sample_weights`` when asked (computed from the weights before the step).

    ``align``: a power of two dividing every table's D (``vector_alignment``): rows of the
    weights, the output gradient and element-wise state start at its multiples.
    ``momentum1``/``momentum2`` are laid out as the module keeps them: element-wise state
    exactly like the flat weights, row-wise state one value per global row. ``launch``:
    the per-run kernels' sizes (``runs_launch(BLOCK_D)`` when None)."""
    device = weights.device
    num_features = feature_meta.shape[0]
    B = (offsets.numel() - 1) // num_features
    N = indices.numel()
    psw_grad = None
    if N == 0 or B == 0:
        if psw_requires_grad:
            psw_grad = torch.zeros(N, dtype=torch.float32, device=device)
        return psw_grad
    total_bags = num_features * B
    grad_output = grad_output.contiguous()
    scratch = _scratch_status(device)  # written, never read: the forward reported bad input
    key_dtype = torch.int32 if total_rows < INT32_KEYS_BELOW else torch.int64
    sentinel = torch.iinfo(key_dtype).max  # ids outside every bag: sorted last, skipped
    mean = pooling == Pooling.MEAN
    weighted = per_sample_weights is not None
    scaled = mean or weighted
    rows = torch.full((N,), sentinel, dtype=key_dtype, device=device)
    feature = torch.empty(N, dtype=torch.int32, device=device)
    grad_offset = torch.empty(N, dtype=torch.int64, device=device)
    scale = torch.empty(N if scaled else 1, dtype=torch.float32, device=device)
    bags = torch.empty(N if psw_requires_grad else 1, dtype=torch.int64, device=device)
    psw = per_sample_weights if weighted else scale
    _positions_kernel[(triton.cdiv(B, POSITIONS_CONFIG["BAGS"]), num_features)](
        feature_meta, indices, offsets, psw, rows, feature, grad_offset, scale, bags, scratch,
        B, total_bags, N, grad_output.stride(0),
        UNPOOLED=pooling == Pooling.NONE, MEAN=mean, WEIGHTED=weighted, CHECK=bounds_check,
        WRITE_BAGS=psw_requires_grad, **POSITIONS_CONFIG,
    )  # fmt: skip
    block_d = max(16, triton.next_power_of_2(max_dim))
    if psw_requires_grad:
        psw_grad = torch.empty(N, dtype=torch.float32, device=device)
        _psw_grad_kernel[(triton.cdiv(N, PSW_CONFIG["BLOCK_N"]),)](
            grad_output, grad_output.stride(0), weights, feature_meta, rows, bags, offsets,
            psw_grad, scratch, B, total_bags, N, sentinel,
            MEAN=mean, CHECK=bounds_check, BLOCK_D=min(block_d, 128), **PSW_CONFIG,
        )  # fmt: skip
    sorted_rows, perm = torch.sort(rows, stable=True)
    sorted_w_start = torch.empty(N, dtype=torch.int64, device=device)
    sorted_dim = torch.empty(N, dtype=torch.int32, device=device)
    sorted_grad_offset = torch.empty_like(grad_offset)
    sorted_scale = torch.empty_like(scale)
    _sorted_operands_kernel[(triton.cdiv(N, SORTED_OPERANDS_BLOCK),)](
        perm, sorted_rows, feature, grad_offset, scale, feature_meta, sorted_w_start, sorted_dim,
        sorted_grad_offset, sorted_scale, N, sentinel,
        SCALED=scaled, BLOCK=SORTED_OPERANDS_BLOCK, num_warps=SORTED_OPERANDS_WARPS,
    )  # fmt: skip
    while grad_output.stride(0) % align:
        align //= 2
    launch = launch or runs_launch(block_d)
    chunk = launch.chunk_ids
    fan_in = launch.fan_in
    num_chunks = triton.cdiv(N, chunk)
    num_groups = triton.cdiv(num_chunks, fan_in)
    num_supergroups = triton.cdiv(num_groups, fan_in)
    # One fp32 row per chunk, group and supergroup; only those a crossing run leaves are written.
    chunk_sums = torch.empty(num_chunks * block_d, dtype=torch.float32, device=device)
    group_sums = torch.empty(num_groups * block_d, dtype=torch.float32, device=device)
    supergroup_sums = torch.empty(num_supergroups * block_d, dtype=torch.float32, device=device)
    if step is None:
        step = rows  # never read: only Adam and LAMB take a step count
    m1 = momentum1 if momentum1 is not None else weights
    m2 = momentum2 if momentum2 is not None else weights
    hyper = (args.learning_rate, args.eps, args.beta1, args.beta2, args.weight_decay, args.seed)
    modes = dict(
        SCALED=scaled,
        OPTIMIZER=args.optimizer,
        WEIGHT_DECAY_MODE=args.weight_decay_mode,
        STOCHASTIC_ROUNDING=args.stochastic_rounding,
        CHUNK=chunk,
        BLOCK_D=block_d,
        ALIGN=align,
    )
    sorted_operands = (sorted_rows, sorted_w_start, sorted_dim, sorted_grad_offset, sorted_scale)
    chunk_grid = num_chunks
    if launch.chunk_stages:
        chunk_grid = min(num_chunks, _multiprocessors(device) * launch.chunk_programs_per_sm)
    _chunk_kernel[(chunk_grid,)](
        grad_output, *sorted_operands, weights, m1, m2, chunk_sums, step, *hyper, N, sentinel,
        STAGES=launch.chunk_stages, PREFETCH=launch.prefetch_chunks if device.type == "cuda" else 0,
        num_warps=launch.chunk_warps, **modes,
    )  # fmt: skip
    # A run crossing into a group needs its chunks' sums summed; with all chunks in one
    # group (or all groups in one supergroup) no run does, and the launch is skipped.
    if num_chunks > fan_in:
        _group_kernel[(num_groups,)](
            sorted_rows, chunk_sums, group_sums, N, chunk, BLOCK_D=block_d, FAN_IN=fan_in,
            num_warps=launch.group_warps,
        )  # fmt: skip
    if num_groups > fan_in:
        _group_kernel[(num_supergroups,)](
            sorted_rows, group_sums, supergroup_sums, N, chunk * fan_in, BLOCK_D=block_d, FAN_IN=fan_in,
            num_warps=launch.group_warps,
        )  # fmt: skip
    if num_chunks > 1:
        _crossing_kernel[(triton.cdiv(num_chunks, launch.crossing_chunks),)](
            grad_output, *sorted_operands, weights, m1, m2, chunk_sums, group_sums, supergroup_sums, step, *hyper,
            N, sentinel, FAN_IN=fan_in, CHUNKS_PER_PROGRAM=launch.crossing_chunks, num_warps=launch.crossing_warps,
            **modes,
        )  # fmt: skip
    return psw_grad
