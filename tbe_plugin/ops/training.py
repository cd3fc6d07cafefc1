"""The training step as custom ops, so that ``torch.compile`` traces a model that trains.

- ``tbe_plugin::tbe_lookup_train``: the forward of a training step (the kernels of
  ``tbe_forward``), functional: it returns the output and this call's bounds status.
- ``tbe_plugin::tbe_fused_update``: ``fused_update``, the optimizer applied in place to the
  rows a batch touched. It lists what it writes (weights, momentum1, momentum2, step,
  rounding seed) in ``mutates_args``, so the compiler keeps it although nothing reads its
  output, and orders every later reader of the tables after it.
- ``training_lookup``: the autograd.Function joining them (forward: the lookup; backward:
  the update), which the module calls under ``torch.compile``. Eager training uses the
  module's own autograd.Function; both end in ``fused_update``.

Every value that changes between steps is a tensor (learning rate, hyper-parameters, step
count, rounding seed), so changing the learning rate never recompiles a graph or a kernel.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import inspect
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from tbe_plugin.ops.bounds import merge_status, warn_once
from tbe_plugin.ops.common import STATUS_LEN, new_status, profiled
from tbe_plugin.ops.backward_graphs import BackwardGraphs
from tbe_plugin.ops.backward_launch import RunsLaunch, runs_launch
from tbe_plugin.ops.embedding_backward import (
    BackwardPlan,
    backward_update,
    forward_positions_apply,
    plan_backward,
    sort_key_dtype,
)
from tbe_plugin.ops.embedding_forward import launch_forward, output_shape
from tbe_plugin.ops.optimizers import OptimizerArgs
from tbe_plugin.ops.hot_split import hot_applies, hot_choice
from tbe_plugin.ops.positions import ForwardPositions


def fused_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    momentum1: Optional[torch.Tensor],
    momentum2: Optional[torch.Tensor],
    step: Optional[torch.Tensor],
    rounding_seed: torch.Tensor,
    learning_rate: torch.Tensor,
    feature_meta: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    max_dim: int,
    total_rows: int,
    align: int,
    pooling: int,
    bounds_check: bool,
    optimizer: int,
    weight_decay_mode: int,
    stochastic_rounding: bool,
    hyper: torch.Tensor,
    launch: Optional[RunsLaunch] = None,
    classes: Optional[List[int]] = None,
    graphs: Optional[BackwardGraphs] = None,
    plan: Optional["EarlyPlan"] = None,
) -> torch.Tensor:
    """One optimizer step (step count and rounding seed advance first, as in FBGEMM);
    returns the per-sample-weight gradient, empty unless ``psw_requires_grad``. ``launch``:
    the backward kernels' sizes (their heuristic when None); ``classes``: the module's
    classes of row tiles, (BLOCK_D, first global row) flat (``backward_update``);
    ``graphs``: the module's captured backwards, used for batches ``launch`` says to
    graph (``backward_graphs``); ``plan``: this batch's plan from its forward
    (``plan_in_forward``)."""
    if step is not None:
        step.add_(1)
    rounding_seed.add_(1)
    eps, beta1, beta2, weight_decay = hyper.tolist()  # a host tensor: no device sync
    args = OptimizerArgs(
        optimizer=optimizer,
        learning_rate=learning_rate.item(),
        eps=eps,
        beta1=beta1,
        beta2=beta2,
        weight_decay=weight_decay,
        weight_decay_mode=weight_decay_mode,
        stochastic_rounding=stochastic_rounding,
        seed=int(rounding_seed.item()),
    )
    update = graphs.backward if graphs is not None and graphs.applies(launch, indices, offsets) else backward_update
    options = {"plan": take_plan(plan)} if plan is not None and update is backward_update else {}
    psw_grad = update(
        grad_output, weights, momentum1, momentum2, step, feature_meta, max_dim, total_rows, align,
        indices, offsets, per_sample_weights, psw_requires_grad, pooling, bounds_check, args, launch, classes,
        **options,
    )  # fmt: skip
    return psw_grad if psw_grad is not None else grad_output.new_empty(0)


class UpdateConfig(NamedTuple):
    """A module's fixed settings of ``fused_update`` (a compiled graph specializes on them)."""

    max_dim: int
    total_rows: int
    align: int
    pooling: int
    bounds_check: bool
    optimizer: int
    weight_decay_mode: int
    stochastic_rounding: bool


class LookupConfig(NamedTuple):
    """A module's fixed settings of the training forward (``launch_forward``'s)."""

    dims: List[int]  # per feature
    pooling: int
    bounds_check: int  # a ``BoundsCheck`` mode
    output_dtype: torch.dtype
    align: int


def _without_parameters(fn, *parameters: str):
    """``fn`` less some keyword parameters, left at their defaults: an op's implementation,
    whose schema is inferred from this signature (one signature to keep, ``fn``'s). It passes
    every argument by name, so parameters after those removed keep their meaning."""
    signature = inspect.signature(fn)
    kept = signature.replace(parameters=[p for p in signature.parameters.values() if p.name not in parameters])

    def without(*args, **kwargs):
        return fn(**kept.bind(*args, **kwargs).arguments)

    without.__signature__ = kept
    without.__name__ = fn.__name__
    return without


class EarlyPlan(NamedTuple):
    """A batch's ``plan_backward`` made in its forward, and (CUDA) the event its side stream
    recorded after it; or (``RunsLaunch.plan_thread``) the plan thread's future of both."""

    plan: "BackwardPlan | Future"
    ready: Optional[torch.cuda.Event]


_PLAN_THREAD: List[ThreadPoolExecutor] = []  # RunsLaunch.plan_thread's, made at its first use


def _plan_thread() -> ThreadPoolExecutor:
    if not _PLAN_THREAD:
        _PLAN_THREAD.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tbe_plugin_plan"))
    return _PLAN_THREAD[0]


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[key]


def _plans_in_forward(settings: RunsLaunch, feature_meta: torch.Tensor, indices: torch.Tensor,
                      offsets: torch.Tensor, launch: Optional[RunsLaunch],
                      graphs: Optional[BackwardGraphs]) -> bool:  # fmt: skip
    """Whether this batch's plan is made in its forward: the option on, ids and bags, and not
    a batch for a captured graph (which plans in its graph)."""
    if not settings.plan_in_forward or indices.numel() == 0 or offsets.numel() <= feature_meta.shape[0]:
        return False
    return graphs is None or not graphs.applies(launch, indices, offsets)


def plan_in_forward(
    feature_meta: torch.Tensor,
    total_rows: int,
    max_dim: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    bounds_check: bool,
    optimizer: int,
    output_shape: Sequence[int],
    launch: Optional[RunsLaunch] = None,
    classes: Optional[List[int]] = None,
    graphs: Optional[BackwardGraphs] = None,
    positions: Optional[ForwardPositions] = None,
) -> Optional[EarlyPlan]:
    """The batch's backward plan (``embedding_backward.plan_backward``), started now, after
    the lookup (``RunsLaunch.plan_in_forward``): on CUDA on a side stream that waits for
    the current one, so that the plan runs beside whatever the current stream does until
    the backward (the dense layers); on the CPU and under capture at once, on the current
    stream. None where the backward will plan by itself: the option off, an empty batch, a
    batch for a captured graph. ``output_shape``: the forward output's (the output
    gradient's) shape; ``positions``: the backward's positions the forward wrote
    (``forward_positions_for``)."""
    settings = launch or runs_launch()
    if not _plans_in_forward(settings, feature_meta, indices, offsets, launch, graphs):
        return None
    grad_shape = (int(output_shape[0]), int(output_shape[1]))  # contiguous: the row stride is the width

    def plan() -> BackwardPlan:
        return plan_backward(feature_meta, total_rows, indices, offsets, per_sample_weights, psw_requires_grad,
                             pooling, bounds_check, optimizer, grad_shape, settings, classes, max_dim,
                             forward_positions=positions)  # fmt: skip

    kept = (positions.rows, positions.bags) if positions is not None else ()
    inputs = (feature_meta, indices, offsets, per_sample_weights, *kept)
    # The stream the plan runs on, chosen by this thread (the current stream is a thread's own):
    # the side stream; or (plan_side_stream=False) the current one, its event recorded all the
    # same for a backward on another stream (a pipeline's); False under capture: at once.
    side = _stream_after_current(indices.device, settings.plan_side_stream)

    def plan_and_event() -> Tuple[BackwardPlan, Optional[torch.cuda.Event]]:
        made, ran_on = _beside(plan, indices.device, inputs, "tbe_plugin::plan_backward", side)
        if ran_on is None:
            return made, None
        ready = torch.cuda.Event()
        ready.record(ran_on)
        return made, ready

    if not (settings.plan_thread and settings.plan_side_stream) or side is False:  # at once, by this thread
        return EarlyPlan(*plan_and_event())
    # The thread's closure holds the inputs until their work is queued on the side stream,
    # where _beside marks them in use: their memory is not reused before the plan reads them.
    future = _plan_thread().submit(_on_device, indices.device, plan_and_event)
    if indices.device.type != "cuda":  # Triton's interpreter runs one kernel at a time: let it finish
        wait([future])
    return EarlyPlan(future, None)


def _on_device(device: torch.device, work):
    """``work()`` with ``device`` current (a thread's CUDA device is its own)."""
    if device.type != "cuda":
        return work()
    with torch.cuda.device(device):
        return work()


def _stream_after_current(device: torch.device, side: bool = True):
    """The stream to queue work on after the current stream's work so far (queued by the
    calling thread: the current stream is a thread's own): the side stream, made to wait for
    the current one; or (``side=False``) the current stream itself. None on the CPU; False
    inside a CUDA graph's capture (a side stream's work there must join the capturing stream
    before the capture ends, which a forward captured alone would not do)."""
    if device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        return False
    current = torch.cuda.current_stream(device)
    if not side:
        return current
    stream = _side_stream(device)
    stream.wait_stream(current)
    return stream


def _beside(work, device: torch.device, inputs, name: str, side=None):
    """(``work()``, the stream it ran on): on CUDA on the side stream (``side``: from
    ``_stream_after_current``, by the thread that queued the work it follows; made here when None),
    the ``inputs`` (the caller's tensors) marked in use there so that their memory is not
    reused before it has read them; on the CPU and under capture at once on the current
    stream (None)."""
    side = _stream_after_current(device) if side is None else side
    if not side:
        return work(), None
    with torch.cuda.stream(side), profiled(name):
        made = work()
    for tensor in inputs:
        if tensor is not None:
            tensor.record_stream(side)
    return made, side


def forward_positions_for(
    feature_meta: torch.Tensor,
    total_rows: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    psw_requires_grad: bool,
    pooling: int,
    launch: Optional[RunsLaunch] = None,
    graphs: Optional[BackwardGraphs] = None,
    bounds_check: bool = True,
) -> Optional[ForwardPositions]:
    """Buffers for the backward's positions, which the training forward then writes beside
    its output (``RunsLaunch.forward_positions``), where this batch's plan is made in its
    forward (``plan_in_forward``: not an empty batch or one for a captured graph) and the
    option applies (``embedding_backward.forward_positions_apply``); else None. With
    ``RunsLaunch.hot_split`` the batch's hot rows are chosen now, before the lookup, on the
    plan's side stream (on CUDA), so that the choice runs beside the lookup."""
    settings = launch or runs_launch()
    num_features = feature_meta.shape[0]
    total_bags = (offsets.numel() - 1) // num_features * num_features
    # The option first (host arithmetic only), then whether the plan is made in the forward.
    if not forward_positions_apply(settings, pooling, per_sample_weights is not None, psw_requires_grad,
                                   indices.numel(), total_bags):  # fmt: skip
        return None
    if not _plans_in_forward(settings, feature_meta, indices, offsets, launch, graphs):
        return None
    positions = ForwardPositions(indices.numel(), sort_key_dtype(total_rows), indices.device, settings.forward_merge)
    if settings.hot_split and hot_applies(settings, pooling, per_sample_weights is not None, False, indices.numel()):
        def choose():
            return hot_choice(feature_meta, indices, offsets, total_bags // num_features, settings.hot_rows,
                              settings.hot_sample, bounds_check, total_rows)  # fmt: skip

        # On the plan's side stream, which the plan then continues after the lookup.
        positions.hot = _beside(choose, indices.device, (feature_meta, indices, offsets), "tbe_plugin::hot_choice")[0]
    return positions


def take_plan(early: EarlyPlan) -> BackwardPlan:
    """The plan, for use on the current stream: it waits for the side stream's event, and
    the plan's tensors (made on the side stream) are marked in use on it."""
    if isinstance(early.plan, Future):  # RunsLaunch.plan_thread: its error, if any, is raised here
        early = EarlyPlan(*early.plan.result())
    if early.ready is not None:
        current = torch.cuda.current_stream(early.plan.class_pos.device)
        current.wait_event(early.ready)
        for tensor in _plan_tensors(early.plan):
            tensor.record_stream(current)
    return early.plan


def _plan_tensors(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _plan_tensors(item)]
    return []


# What the update writes, declared to the compiler: it keeps the op for these writes (no
# output of it need be read) and orders later readers of the tables after it. ``launch``
# (the kernels' sizes, not a schema type) stays at its heuristic under compile, and no
# captured graphs (``graphs``) serve it.
tbe_fused_update_op = torch.library.custom_op(
    "tbe_plugin::tbe_fused_update",
    _without_parameters(fused_update, "launch", "graphs", "plan"),
    mutates_args=("weights", "momentum1", "momentum2", "step", "rounding_seed"),
)


@tbe_fused_update_op.register_fake
def _(grad_output, weights, momentum1, momentum2, step, rounding_seed, learning_rate, feature_meta, indices,
      offsets, per_sample_weights, psw_requires_grad, *config, **options):  # fmt: skip
    return grad_output.new_empty((indices.shape[0],) if psw_requires_grad else (0,), dtype=torch.float32)


@torch.library.custom_op("tbe_plugin::tbe_lookup_train", mutates_args=())
def tbe_lookup_train_op(
    weights: torch.Tensor,
    feature_meta: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    dims: List[int],
    pooling: int,
    bounds_check: int,
    output_dtype: torch.dtype,
    align: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward of a training step. Functional, so that it may sit in a differentiable
    graph: it returns this call's bounds status beside the output (FATAL has already
    raised); ``merge_bounds_status`` folds it into the module's persistent one, where
    WARNING warns once."""
    status = new_status(weights.device)
    out = launch_forward(
        weights, feature_meta, indices, offsets, per_sample_weights, status, dims, pooling,
        bounds_check, output_dtype, align,
    )  # fmt: skip
    return out, status


@tbe_lookup_train_op.register_fake
def _(weights, feature_meta, indices, offsets, per_sample_weights, dims, pooling, bounds_check, output_dtype, align):
    out = weights.new_empty(output_shape(indices.shape[0], offsets.shape[0], dims, pooling), dtype=output_dtype)
    return out, weights.new_empty(STATUS_LEN, dtype=torch.int64)


@torch.library.custom_op("tbe_plugin::merge_bounds_status", mutates_args=("into",))
def merge_bounds_status_op(into: torch.Tensor, update: torch.Tensor, bounds_check: int) -> None:
    """Folds a call's bounds status into the persistent one and warns once (WARNING)."""
    merge_status(into, update)
    warn_once(into, bounds_check)


@merge_bounds_status_op.register_fake
def _(into, update, bounds_check):
    return None


class _TrainingLookup(torch.autograd.Function):
    """Forward: ``tbe_lookup_train``; backward: ``tbe_fused_update`` on the live tables.

    The backward updates the tables as they are when it runs: a staleness pipeline runs
    other batches' updates between a lookup and its backward (eager allows that). So the
    tables, optimizer state, learning rate and hyper-parameters are ``ctx`` attributes,
    whose versions autograd does not check (``save_for_backward`` would refuse a tensor
    that another update wrote). Under torch.compile, Dynamo records which tensors an
    autograd.Function keeps as attributes and AOTAutograd saves those unchecked (torch 2.11
    and 2.13, tested); a ``register_autograd`` formula is traced by AOTAutograd alone, which
    checks every tensor it saves, so the pipeline's order fails there with "modified by an
    inplace operation", as on a torch without that support. AOTAutograd keeps the backward's
    writes to forward inputs in the graph because they do not require grad. ``aot_eager``
    runs the op on copies and copies them back; inductor re-inplaces it, so the kernels
    write the module's own storage.
    """

    @staticmethod
    def forward(ctx, placeholder, per_sample_weights, indices, offsets, feature_meta, weights, momentum1,
                momentum2, step, rounding_seed, learning_rate, hyper, lookup, update, classes):  # fmt: skip
        out, status = torch.ops.tbe_plugin.tbe_lookup_train(
            weights, feature_meta, indices, offsets, per_sample_weights, *lookup
        )
        ctx.mark_non_differentiable(status)
        ctx.save_for_backward(indices, offsets, per_sample_weights, feature_meta)
        ctx.weights, ctx.momentum1, ctx.momentum2, ctx.step = weights, momentum1, momentum2, step
        ctx.rounding_seed, ctx.learning_rate, ctx.hyper = rounding_seed, learning_rate, hyper
        ctx.update, ctx.classes = update, classes
        return out, status

    @staticmethod
    def backward(ctx, grad_output, _grad_status):
        indices, offsets, per_sample_weights, feature_meta = ctx.saved_tensors
        psw_requires_grad = ctx.needs_input_grad[1]
        psw_grad = torch.ops.tbe_plugin.tbe_fused_update(
            grad_output.contiguous(), ctx.weights, ctx.momentum1, ctx.momentum2, ctx.step,
            ctx.rounding_seed, ctx.learning_rate, feature_meta, indices, offsets, per_sample_weights,
            psw_requires_grad, *ctx.update, ctx.hyper, classes=ctx.classes,
        )  # fmt: skip
        # The placeholder's gradient stays None, as in eager: the update is in the graph
        # because it mutates its inputs, not through an output.
        return (None, psw_grad if psw_requires_grad else None) + (None,) * 13


def training_lookup(
    placeholder: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    feature_meta: torch.Tensor,
    state: Sequence[Optional[torch.Tensor]],
    learning_rate: torch.Tensor,
    hyper: torch.Tensor,
    lookup: LookupConfig,
    update: UpdateConfig,
    classes: Optional[List[int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward of a training step whose backward applies the optimizer in place.

    ``placeholder``: an empty parameter that carries autograd (FBGEMM's scheme); ``state``:
    (weights, momentum1, momentum2, step, rounding seed), the tensors the backward writes
    (None where the optimizer has no such state); ``hyper``: eps, beta1, beta2, weight
    decay (a float64 host tensor); ``classes``: the tables' classes of row tiles
    (``fused_update``). Returns the output and this call's bounds status.
    """
    weights, momentum1, momentum2, step, rounding_seed = state
    return _TrainingLookup.apply(
        placeholder, per_sample_weights, indices, offsets, feature_meta, weights, momentum1, momentum2,
        step, rounding_seed, learning_rate, hyper, lookup, update, classes,
    )  # fmt: skip
