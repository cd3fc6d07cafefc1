"""The training step as custom ops, so that ``torch.compile`` traces a model that trains.

``tbe_plugin::tbe_lookup_train`` is the forward of a training step (the same kernels as
``tbe_forward``); its registered autograd backward calls ``tbe_plugin::tbe_fused_update_live``,
which applies the optimizer in place to the touched rows of the module's live tables and
state (found by a handle, so that the backward may run after other batches' updates, as in
eager). Eager training uses the cheaper ``autograd.Function`` in the module; both end in
``fused_update``.

Every value that changes between steps is a tensor (learning rate, step count, rounding
seed), so changing the learning rate never recompiles a graph or a kernel.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import weakref
from typing import Any, List, Optional, Tuple

import torch

from tbe_plugin.ops.bounds import merge_status, warn_once
from tbe_plugin.ops.common import STATUS_LEN, BoundsCheck, new_status
from tbe_plugin.ops.embedding_backward import backward_update
from tbe_plugin.ops.embedding_forward import launch_forward, output_shape
from tbe_plugin.ops.optimizers import OptimizerArgs


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
) -> torch.Tensor:
    """One optimizer step (step count and rounding seed advance first, as in FBGEMM);
    returns the per-sample-weight gradient, empty unless ``psw_requires_grad``."""
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
    psw_grad = backward_update(
        grad_output, weights, momentum1, momentum2, step, feature_meta, max_dim, total_rows, align,
        indices, offsets, per_sample_weights, psw_requires_grad, pooling, bounds_check, args,
    )  # fmt: skip
    return psw_grad if psw_grad is not None else grad_output.new_empty(0)


# Live training state by handle: the compiled backward fetches the tables and optimizer
# state here instead of saving them at the forward, because a pipeline may run other
# batches' updates in between (staleness): saved tensors would fail autograd's version
# check, and the update must see the live state anyway, as the eager path does.
_LIVE_STATE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def register_live_state(owner: Any) -> int:
    """Registers ``owner`` (whose ``live_training_state()`` returns weights, momentum1,
    momentum2, step, rounding seed) and returns its handle for ``tbe_lookup_train``."""
    handle = id(owner)
    _LIVE_STATE[handle] = owner
    return handle


@torch.library.custom_op("tbe_plugin::tbe_fused_update_live", mutates_args=())
def tbe_fused_update_live_op(
    handle: int,
    grad_output: torch.Tensor,
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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``fused_update`` on the live state of ``handle``'s owner; returns the per-sample-
    weight gradient and an empty gradient for the autograd placeholder. The tables' state
    is not among the graph's tensors (the op mutates it unseen), so the placeholder's
    gradient, a graph output, is what keeps the op from being dropped as unused."""
    owner = _LIVE_STATE.get(handle)
    if owner is None:
        raise RuntimeError("tbe_plugin: the module of this compiled lookup no longer exists; nothing to update")
    psw_grad = fused_update(
        grad_output, *owner.live_training_state(), learning_rate, feature_meta, indices, offsets,
        per_sample_weights, psw_requires_grad, max_dim, total_rows, align, pooling, bounds_check, optimizer,
        weight_decay_mode, stochastic_rounding, hyper,
    )  # fmt: skip
    return psw_grad, grad_output.new_zeros(0, dtype=torch.float32)


@tbe_fused_update_live_op.register_fake
def _(handle, grad_output, learning_rate, feature_meta, indices, offsets, per_sample_weights,
      psw_requires_grad, *config):  # fmt: skip
    psw = grad_output.new_empty((indices.shape[0],) if psw_requires_grad else (0,), dtype=torch.float32)
    return psw, grad_output.new_empty(0, dtype=torch.float32)


@torch.library.custom_op("tbe_plugin::tbe_lookup_train", mutates_args=())
def tbe_lookup_train_op(
    placeholder: torch.Tensor,
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
    dims: List[int],
    pooling: int,
    bounds_check: int,
    output_dtype: torch.dtype,
    align: int,
    total_rows: int,
    optimizer: int,
    weight_decay_mode: int,
    stochastic_rounding: bool,
    hyper: torch.Tensor,
    handle: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward of a training step; ``placeholder`` (an empty parameter) carries autograd.

    Functional, as an op with an autograd formula must be: it returns this call's bounds
    status beside the output (FATAL has already raised); ``merge_bounds_status`` folds it
    into the module's persistent one, where WARNING warns once. ``handle`` names the live
    state its backward updates (``register_live_state``, ``tbe_fused_update_live``).
    """
    status = new_status(weights.device)
    out = launch_forward(
        weights, feature_meta, indices, offsets, per_sample_weights, status, dims, pooling,
        bounds_check, output_dtype, align,
    )  # fmt: skip
    return out, status


@tbe_lookup_train_op.register_fake
def _(placeholder, weights, momentum1, momentum2, step, rounding_seed, learning_rate, feature_meta,
      indices, offsets, per_sample_weights, dims, pooling, bounds_check, output_dtype, *rest):  # fmt: skip
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


_PSW_INPUT = 10  # position of per_sample_weights among tbe_lookup_train's inputs
_NUM_INPUTS = 22


def _setup_context(ctx, inputs, output):
    (_, weights, momentum1, momentum2, step, rounding_seed, learning_rate, feature_meta, indices,
     offsets, per_sample_weights, dims, pooling, bounds_check, _, align, total_rows, optimizer,
     weight_decay_mode, stochastic_rounding, hyper, handle) = inputs  # fmt: skip
    # Not the weights or the optimizer state: the backward updates them live (by handle).
    ctx.save_for_backward(learning_rate, feature_meta, indices, offsets, per_sample_weights, hyper)
    check = bounds_check != BoundsCheck.NONE
    ctx.config = (max(dims), total_rows, align, pooling, check, optimizer, weight_decay_mode,
                  stochastic_rounding)  # fmt: skip
    ctx.handle = handle


def _backward(ctx, grad_output, _grad_status):
    learning_rate, feature_meta, indices, offsets, per_sample_weights, hyper = ctx.saved_tensors
    psw_requires_grad = ctx.needs_input_grad[_PSW_INPUT]
    psw_grad, placeholder_grad = torch.ops.tbe_plugin.tbe_fused_update_live(
        ctx.handle, grad_output.contiguous(), learning_rate, feature_meta, indices, offsets,
        per_sample_weights, psw_requires_grad, *ctx.config, hyper,
    )  # fmt: skip
    grads = [None] * _NUM_INPUTS
    grads[0] = placeholder_grad  # empty, as the placeholder: the update's link to the graph's outputs
    if psw_requires_grad:
        grads[_PSW_INPUT] = psw_grad
    return tuple(grads)


tbe_lookup_train_op.register_autograd(_backward, setup_context=_setup_context)
