"""The backward of small batches as CUDA graphs: one launch a step instead of ~20.

A small batch's backward is host-bound: on the H200 at d488ab2 the kernels of FBGEMM's
standard shape (B=512, 328k ids) took 0.27 ms of a backward whose host path took 1.8 ms
(eight Triton launches at ~50 us of Python each, a sort, a dozen torch ops). With
``RunsLaunch.graph_max_ids`` > 0, a batch of at most that many ids runs as a captured graph:

- its ids are padded to a bucket (``padded_ids``: steps of 2**(1/4), multiples of 1024), so
  that a few graphs serve batches of any size up to the limit. The padding lies after the
  last bag (the offsets copied in are clamped into [0, N]: positions N and beyond belong to
  no bag) and reads as the sentinel row, which every kernel skips: the sorted positions of
  the real ids, hence every sum and its order, are those of the unpadded batch (bitwise
  the same result, CPU tests);
- the step's inputs (ids, offsets, per-sample weights, output gradient) are copied into
  static buffers and the hyperparameters into the device vector the kernels read
  (``optimizers.HYPER_FIELDS``), then the graph is replayed on the current stream. With
  ``RunsLaunch.graph_grad_in_place`` (pieces design, a 16-byte aligned gradient) the output
  gradient is not copied: its address goes into a device cell that the kernels read it
  through;
- per key (bucket, batch size, dtypes, modes, the tables' storage), the first call runs
  the padded backward eagerly (it compiles every kernel variant the graph will use), the
  second captures the graph (capture runs nothing) and replays it; at most ``max_graphs``
  are kept (least recently used dropped), each with its own memory pool (~100 bytes an id
  of the bucket).

Eager fallbacks: a CPU device, a stream that is itself being captured (a model graphed as a
whole), more ids than the limit, an empty batch.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import collections
import dataclasses
import math
import struct
import warnings
from typing import Any, Dict, Optional, Sequence

import torch
import triton
import triton.language as tl

from tbe_plugin.ops.backward_launch import RunsLaunch, runs_launch
from tbe_plugin.ops.embedding_backward import backward_update
from tbe_plugin.ops.update_operands import hyper_tensor
from tbe_plugin.ops.optimizers import HYPER_FIELDS, OptimizerArgs, hyper_values

BUCKET_STEPS_PER_DOUBLING = 4
BUCKET_MULTIPLE = 1024
# ``RunsLaunch.graph_fill``: the step vector's words. int64: the addresses of the step's ids,
# offsets, per-sample weights (0: none) and output gradient, then its id count; then the
# hyperparameters (``HYPER_FIELDS``) as fp64, read by the kernels through a float64 view.
STEP_WORDS = ("indices", "offsets", "per_sample_weights", "grad_output", "num_indices")
STEP_LEN = len(STEP_WORDS) + len(HYPER_FIELDS)
GRAD_WORD = STEP_WORDS.index("grad_output")  # the gradient cell is this word of the vector
STEP_FORMAT = f"<{len(STEP_WORDS)}q{len(HYPER_FIELDS)}d"  # the vector's bytes (struct), packed once a step
_IDS_WORD = tl.constexpr(STEP_WORDS.index("indices"))
_OFFSETS_WORD = tl.constexpr(STEP_WORDS.index("offsets"))
_PSW_WORD = tl.constexpr(STEP_WORDS.index("per_sample_weights"))
_COUNT_WORD = tl.constexpr(STEP_WORDS.index("num_indices"))
FILL_BLOCK = 1024


@triton.jit
def _graph_fill_kernel(step_ptr, indices_ptr, offsets_ptr, psw_ptr, bucket, num_offsets, WEIGHTED: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
    """Inside a captured graph: this step's ids (zero past its count, up to the bucket),
    offsets clamped into [0, count] and per-sample weights (zero past the count) into the
    graph's buffers, read from the addresses in the step vector (``STEP_WORDS``) as pointers
    of the buffers' types."""
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(step_ptr + _COUNT_WORD)
    real = pos < n
    in_bucket = pos < bucket
    source = tl.load(step_ptr + _IDS_WORD).to(indices_ptr.dtype)
    tl.store(indices_ptr + pos, tl.load(source + pos, mask=real, other=0), mask=in_bucket)
    if WEIGHTED:
        source = tl.load(step_ptr + _PSW_WORD).to(psw_ptr.dtype)
        tl.store(psw_ptr + pos, tl.load(source + pos, mask=real, other=0.0), mask=in_bucket)
    is_offset = pos < num_offsets
    source = tl.load(step_ptr + _OFFSETS_WORD).to(offsets_ptr.dtype)
    bounds = tl.load(source + pos, mask=is_offset, other=0)
    bounds = tl.minimum(tl.maximum(bounds, 0), n.to(bounds.dtype))
    tl.store(offsets_ptr + pos, bounds, mask=is_offset)


def step_vector(indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor],
                grad_output: torch.Tensor, args: OptimizerArgs) -> torch.Tensor:  # fmt: skip
    """The step vector (``STEP_WORDS``, then ``HYPER_FIELDS``) on the host, pinned on CUDA:
    one non-blocking copy a step (the pinned block is reused only once that copy ran)."""
    words = (indices.data_ptr(), offsets.data_ptr(),
             per_sample_weights.data_ptr() if per_sample_weights is not None else 0,
             grad_output.data_ptr(), indices.numel())  # fmt: skip
    packed = bytearray(struct.pack(STEP_FORMAT, *words, *hyper_values(args)))
    vector = torch.frombuffer(packed, dtype=torch.int64)
    return vector.pin_memory() if indices.device.type == "cuda" else vector


def padded_ids(n: int) -> int:
    """The bucket of a batch of ``n`` ids: the least 1024 * ceil(2**(k/4)) >= n (k >= 0)."""
    if n <= BUCKET_MULTIPLE:
        return BUCKET_MULTIPLE
    k = math.ceil(BUCKET_STEPS_PER_DOUBLING * math.log2(n / BUCKET_MULTIPLE) - 1e-9)
    while True:
        bucket = BUCKET_MULTIPLE * math.ceil(2 ** (k / BUCKET_STEPS_PER_DOUBLING))
        if bucket >= n:
            return bucket
        k += 1


@dataclasses.dataclass
class _Captured:
    """A key's static buffers, and its graph once captured."""

    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: Optional[torch.Tensor]
    grad_output: torch.Tensor
    hyper: torch.Tensor
    graph: Optional[Any] = None
    """None: not captured yet; False: capture failed (eager from then on)."""
    psw_grad: Optional[torch.Tensor] = None
    """The graph's per-sample-weight gradient (its memory; copied out after each replay)."""
    grad_cell: Optional[torch.Tensor] = None
    """With ``RunsLaunch.graph_grad_in_place``: the int64 device cell holding the address of
    the step's output gradient, which the graph's kernels read in place (``grad_output`` is
    then unused)."""
    step: Optional[torch.Tensor] = None
    """With ``RunsLaunch.graph_fill``: the device step vector (``step_vector``); ``grad_cell``
    and ``hyper`` are views of it, and the graph's first kernel fills the buffers from it."""


class BackwardGraphs:
    """A module's captured backwards, by key (module docstring). ``capture=False`` runs the
    padded path eagerly every time (what the CPU tests check against the unpadded one)."""

    def __init__(self, max_graphs: int = 6, capture: bool = True) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.max_graphs = max_graphs
        self.capture = capture
        self._entries: "collections.OrderedDict[tuple, _Captured]" = collections.OrderedDict()
        self.replays = 0
        """Graph replays so far (tests and benchmarks read it)."""

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def applies(self, launch: Optional[RunsLaunch], indices: torch.Tensor, offsets: torch.Tensor) -> bool:
        """Whether this batch takes the padded (and, on CUDA, graphed) path."""
        limit = (launch or runs_launch()).graph_max_ids
        if not limit or indices.numel() == 0 or indices.numel() > limit or offsets.numel() < 2:
            return False
        if indices.device.type == "cuda":
            return not torch.cuda.is_current_stream_capturing()
        return not self.capture  # CPU: only the test mode (nothing to capture)

    def backward(
        self, grad_output: torch.Tensor, weights: torch.Tensor, momentum1: Optional[torch.Tensor],
        momentum2: Optional[torch.Tensor], step: Optional[torch.Tensor], feature_meta: torch.Tensor, max_dim: int,
        total_rows: int, align: int, indices: torch.Tensor, offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor], psw_requires_grad: bool, pooling: int, bounds_check: bool,
        args: OptimizerArgs, launch: Optional[RunsLaunch] = None, classes: Optional[Sequence[int]] = None,
    ) -> Optional[torch.Tensor]:  # fmt: skip
        """``backward_update`` of this batch through its key's graph (``applies`` first)."""
        n = indices.numel()
        bucket = padded_ids(n)
        grad_output = grad_output.contiguous()
        settings = launch or runs_launch()
        # In place: the kernels read the gradient at its address (16-byte aligned, as their
        # vector loads need), for the pieces design; otherwise it is copied into the graph's buffer.
        in_place = settings.graph_grad_in_place and settings.design == "pieces" and grad_output.data_ptr() % 16 == 0
        # Filled inside the graph from the inputs' addresses: contiguous inputs only.
        fill = in_place and settings.graph_fill and indices.is_contiguous() and offsets.is_contiguous() and (
            per_sample_weights is None or per_sample_weights.is_contiguous())
        weighted = per_sample_weights is not None
        state = (weights, momentum1, momentum2, step, feature_meta)
        key = (
            bucket, offsets.numel(), tuple(grad_output.shape), grad_output.dtype, indices.dtype, offsets.dtype,
            per_sample_weights.dtype if weighted else None, psw_requires_grad, pooling, bounds_check,
            args.optimizer, args.weight_decay_mode, args.stochastic_rounding, max_dim, total_rows, align,
            launch, tuple(classes) if classes is not None else None, in_place, fill,
            tuple((t.data_ptr(), t.dtype, tuple(t.shape)) if t is not None else None for t in state),
        )  # fmt: skip
        entry = self._entries.get(key)
        first_call = entry is None
        if first_call:
            entry = self._new_entry(bucket, offsets, grad_output, indices.dtype, per_sample_weights, in_place, fill)
            self._entries[key] = entry
            while len(self._entries) > self.max_graphs:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        if fill:
            entry.step.copy_(step_vector(indices, offsets, per_sample_weights, grad_output, args), non_blocking=True)
        else:
            self._fill(entry, n, grad_output, indices, offsets, per_sample_weights, args)

        def run() -> Optional[torch.Tensor]:  # eager or captured: a replay does not call it
            graph_args = dataclasses.replace(args, hyper=entry.hyper)
            if fill:
                psw = entry.per_sample_weights
                grid = (triton.cdiv(max(bucket, entry.offsets.numel()), FILL_BLOCK),)
                _graph_fill_kernel[grid](entry.step, entry.indices, entry.offsets, psw if psw is not None else
                                         entry.indices, bucket, entry.offsets.numel(), WEIGHTED=psw is not None,
                                         BLOCK=FILL_BLOCK)  # fmt: skip
            # In place, this step's gradient stands for every step's: the kernels take only its
            # shape, strides and type from it and read the gradient at the cell's address.
            return backward_update(
                grad_output if in_place else entry.grad_output, weights, momentum1, momentum2, step, feature_meta,
                max_dim, total_rows, align, entry.indices, entry.offsets, entry.per_sample_weights, psw_requires_grad,
                pooling, bounds_check, graph_args, launch, classes, entry.grad_cell,
            )  # fmt: skip

        if first_call or not self.capture or entry.graph is False:
            psw_grad = run()  # eager, on the padded buffers: compiles what the capture will launch
        else:
            if entry.graph is None:
                entry.graph = self._capture(entry, run)
            if entry.graph is False:
                psw_grad = run()
            else:
                entry.graph.replay()
                self.replays += 1
                psw_grad = entry.psw_grad
        if psw_grad is None:
            return None
        return psw_grad[:n].clone()

    @staticmethod
    def _capture(entry: _Captured, run) -> Any:
        """The graph of ``run`` (capture executes nothing), or False when capture fails (a
        warning; the key then stays eager)."""
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: CUDA calls of other threads (a data loader's) are not part of the
            # capture and do not fail because of it.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                entry.psw_grad = run()
        except Exception as error:  # noqa: BLE001 - the step still runs, eagerly
            warnings.warn(f"tbe_plugin: capturing the backward as a CUDA graph failed ({type(error).__name__}: "
                          f"{error}); this batch shape trains without one", RuntimeWarning, stacklevel=3)  # fmt: skip
            return False
        return graph

    @staticmethod
    def _new_entry(bucket: int, offsets: torch.Tensor, grad_output: torch.Tensor, index_dtype: torch.dtype,
                   per_sample_weights: Optional[torch.Tensor], in_place: bool = False,
                   fill: bool = False) -> _Captured:  # fmt: skip
        device = grad_output.device
        psw = None
        if per_sample_weights is not None:
            psw = torch.zeros(bucket, dtype=per_sample_weights.dtype, device=device)
        step = grad_cell = None
        if fill:  # the cell and the hyperparameters are words of the step vector
            step = torch.zeros(STEP_LEN, dtype=torch.int64, device=device)
            grad_cell = step[GRAD_WORD:GRAD_WORD + 1]
            hyper = step[len(STEP_WORDS):].view(torch.float64)
        else:
            hyper = torch.empty(len(HYPER_FIELDS), dtype=torch.float64, device=device)
            if in_place:
                grad_cell = torch.zeros(1, dtype=torch.int64, device=device)
        return _Captured(
            indices=torch.zeros(bucket, dtype=index_dtype, device=device),
            offsets=torch.empty_like(offsets), per_sample_weights=psw,
            grad_output=grad_output.new_empty(0) if in_place else torch.empty_like(grad_output),
            hyper=hyper, grad_cell=grad_cell, step=step,
        )  # fmt: skip

    @staticmethod
    def _fill(entry: _Captured, n: int, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
              per_sample_weights: Optional[torch.Tensor], args: OptimizerArgs) -> None:  # fmt: skip
        """This step's inputs into the static buffers. The padding's ids are zero (row 0 of
        any table, never out of range) and lie in no bag: the offsets are clamped into
        [0, n] (the identity for valid offsets, whose last entry is n)."""
        entry.indices[:n].copy_(indices)
        entry.indices[n:].zero_()
        torch.clamp(offsets, 0, n, out=entry.offsets)
        if per_sample_weights is not None:
            entry.per_sample_weights[:n].copy_(per_sample_weights)
        if entry.grad_cell is not None:
            entry.grad_cell.fill_(grad_output.data_ptr())  # a fill kernel on the stream: no copy, no sync
        else:
            entry.grad_output.copy_(grad_output)
        hyper_tensor(args, grad_output.device, out=entry.hyper)


def describe(graphs: BackwardGraphs) -> Dict[str, Any]:
    """What a module's graphs hold (for logs and benchmarks)."""
    return {"graphs": len(graphs), "captured": sum(bool(e.graph) for e in graphs._entries.values()),
            "replays": graphs.replays, "buckets": sorted({k[0] for k in graphs._entries})}  # fmt: skip
