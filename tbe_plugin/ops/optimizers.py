"""Fused optimizer updates on embedding rows, with FBGEMM's formulas.

``load_row_state`` reads a tile of rows (one row per lane, inactive lanes masked) with
their optimizer state; ``apply_update`` takes their exact aggregated gradients and
writes the updated weights and state back in place.
The formulas follow FBGEMM's code generator (``codegen/genscript/optimizers.py``), in
its order of operations, with IEEE-rounded division and square root (``div_rn``,
``sqrt_rn``: Triton's plain ``/`` and ``sqrt`` are approximate on GPUs, CUDA's are not).
Results agree with FBGEMM's to fp32 rounding; FBGEMM computes Adam's bias correction in
fp64 (C++ double literals), we in fp32, a difference of an ulp or so.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import dataclasses
import enum
from typing import Optional

import torch
import triton
import triton.language as tl



class Optimizer(enum.IntEnum):
    """The fused optimizers (names as FBGEMM's ``EmbOptimType``)."""

    EXACT_SGD = 0
    EXACT_ROWWISE_ADAGRAD = 1
    EXACT_ADAGRAD = 2
    ADAM = 3
    PARTIAL_ROWWISE_ADAM = 4
    LAMB = 5


class WeightDecay(enum.IntEnum):
    """FBGEMM's ``WeightDecayMode`` values that we serve."""

    NONE = 0
    L2 = 1
    DECOUPLE = 2


@dataclasses.dataclass
class OptimizerArgs:
    """Runtime values of one step: none of them is a compile-time constant."""

    optimizer: int
    learning_rate: float
    eps: float = 1.0e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    weight_decay_mode: int = WeightDecay.NONE
    stochastic_rounding: bool = False
    seed: int = 0
    hyper: Optional[torch.Tensor] = None
    """These values as the device vector the kernels read (``HYPER_FIELDS``), when the
    caller keeps one (a captured graph's); None: the launcher copies them over."""


_SGD = tl.constexpr(Optimizer.EXACT_SGD)
_ROWWISE_ADAGRAD = tl.constexpr(Optimizer.EXACT_ROWWISE_ADAGRAD)
_ADAGRAD = tl.constexpr(Optimizer.EXACT_ADAGRAD)
_ADAM = tl.constexpr(Optimizer.ADAM)
_PARTIAL_ROWWISE_ADAM = tl.constexpr(Optimizer.PARTIAL_ROWWISE_ADAM)
_LAMB = tl.constexpr(Optimizer.LAMB)
_WD_L2 = tl.constexpr(WeightDecay.L2)
_WD_DECOUPLE = tl.constexpr(WeightDecay.DECOUPLE)


HYPER_FIELDS = ("learning_rate", "eps", "beta1", "beta2", "weight_decay", "seed")
"""The runtime values of a step, in the order of the fp64 device vector kernels read them
from (``load_hyper``): on the device, so that a captured CUDA graph reads this step's."""
SEED_LIMIT = 2**53
"""Rounding seeds are kept below this (exact in fp64): ``hyper_values`` wraps them."""


def hyper_values(args: "OptimizerArgs") -> list:
    """``args``' runtime values in ``HYPER_FIELDS`` order, for the fp64 device vector."""
    return [float(args.learning_rate), float(args.eps), float(args.beta1), float(args.beta2),
            float(args.weight_decay), float(args.seed % SEED_LIMIT)]  # fmt: skip


@triton.jit
def load_hyper(hyper_ptr):
    """(lr, eps, beta1, beta2, weight_decay, seed) from the fp64 vector (``HYPER_FIELDS``):
    the floats rounded to fp32 as Triton rounds a Python float argument, the seed an int."""
    lr = tl.load(hyper_ptr).to(tl.float32)
    eps = tl.load(hyper_ptr + 1).to(tl.float32)
    beta1 = tl.load(hyper_ptr + 2).to(tl.float32)
    beta2 = tl.load(hyper_ptr + 3).to(tl.float32)
    weight_decay = tl.load(hyper_ptr + 4).to(tl.float32)
    seed = tl.load(hyper_ptr + 5).to(tl.int64)
    return lr, eps, beta1, beta2, weight_decay, seed


@triton.jit
def _round_to_weights(x, ptrs, seed, rand_offsets, STOCHASTIC_ROUNDING: tl.constexpr):
    """fp32 -> the weights' dtype; stochastically for fp16/bf16 when asked (FBGEMM's
    scheme: add uniform noise below the target's last mantissa bit, then truncate)."""
    target = ptrs.dtype.element_ty
    if STOCHASTIC_ROUNDING and (target == tl.float16 or target == tl.bfloat16):
        bits = x.to(tl.uint32, bitcast=True)
        random = tl.randint(seed, rand_offsets).to(tl.uint32)
        sign_exp = bits & 0xFF800000
        if target == tl.float16:
            noise_bits = sign_exp | (random >> 19)
        else:
            noise_bits = sign_exp | (random >> 16)
        noise = noise_bits.to(tl.float32, bitcast=True) - sign_exp.to(tl.float32, bitcast=True)
        return (x + noise).to(target, fp_downcast_rounding="rtz")
    return x.to(target)


@triton.jit
def load_row_state(
    w_ptrs, w_start, row, cols, row_mask, active, momentum1_ptr, momentum2_ptr,
    OPTIMIZER: tl.constexpr, EVICT: tl.constexpr = False,
):  # fmt: skip
    """The weights (as fp32) and optimizer state of rows ``row`` (global numbers): the
    update's loads, which kernels issue early so that they overlap the gradient gathers.

    ``w_start`` is each row's first element in the flat weights and ``row_mask`` its
    columns. Optimizer state is laid out as the module keeps it: element-wise state like
    the weights (row ``r`` at ``w_start``), row-wise state by global row. Returns
    (weights, momentum1, momentum2), a state the optimizer lacks as 0. EVICT
    (``RunsLaunch.piece_evict``): the loads marked L2 evict-first.
    """
    mask = row_mask & active[:, None]
    w = tl.load(w_ptrs, mask=mask, other=0.0, eviction_policy="evict_first" if EVICT else "").to(tl.float32)
    element = w_start[:, None] + cols[None, :]
    m1 = 0.0
    m2 = 0.0
    if OPTIMIZER == _ROWWISE_ADAGRAD:
        m1 = tl.load(momentum1_ptr + row, mask=active, other=0.0, eviction_policy="evict_first" if EVICT else "")
    elif OPTIMIZER == _ADAGRAD:
        m1 = tl.load(momentum1_ptr + element, mask=mask, other=0.0, eviction_policy="evict_first" if EVICT else "")
    elif OPTIMIZER != _SGD:
        m1 = tl.load(momentum1_ptr + element, mask=mask, other=0.0, eviction_policy="evict_first" if EVICT else "")
        if OPTIMIZER == _PARTIAL_ROWWISE_ADAM:
            m2 = tl.load(momentum2_ptr + row, mask=active, other=0.0, eviction_policy="evict_first" if EVICT else "")
        else:
            m2 = tl.load(momentum2_ptr + element, mask=mask, other=0.0, eviction_policy="evict_first" if EVICT else "")
    return w, m1, m2


@triton.jit
def apply_update(
    g, w, m1, m2, active, row_mask, w_ptrs, w_start, row, cols, dim,
    momentum1_ptr, momentum2_ptr, step_ptr, hyper_ptr,
    OPTIMIZER: tl.constexpr, WEIGHT_DECAY_MODE: tl.constexpr, STOCHASTIC_ROUNDING: tl.constexpr,
    EVICT: tl.constexpr = False,
):  # fmt: skip
    """One optimizer step on rows ``row`` with gradients ``g`` [R, BLOCK_D], from the
    weights and state ``load_row_state`` read (same operands); stores the new ones.
    ``active`` masks lanes with no row to update; ``dim`` is each row's D. EVICT: the
    stores marked L2 evict-first.
    """
    # Loaded here (cached lines), not by the kernels: not live in registers across their loops.
    lr, eps, beta1, beta2, weight_decay, seed = load_hyper(hyper_ptr)
    mask = row_mask & active[:, None]
    g = tl.where(mask, g, 0.0)
    dim_f = tl.maximum(dim, 1).to(tl.float32)
    element = w_start[:, None] + cols[None, :]

    if OPTIMIZER == _SGD:  # FBGEMM's exact SGD has no weight decay
        w = w - lr * g
    elif OPTIMIZER == _ROWWISE_ADAGRAD:
        if WEIGHT_DECAY_MODE == _WD_L2:
            g = tl.where(mask, g + weight_decay * w, 0.0)
        m = m1 + tl.div_rn(tl.sum(g * g, axis=1), dim_f)
        tl.store(momentum1_ptr + row, m, mask=active, eviction_policy="evict_first" if EVICT else "")
        multiplier = tl.div_rn(lr, tl.sqrt_rn(m) + eps)
        if WEIGHT_DECAY_MODE == _WD_DECOUPLE:
            w = w * (1.0 - lr * weight_decay)
        w = w - multiplier[:, None] * g
    elif OPTIMIZER == _ADAGRAD:  # no weight decay either
        m = m1 + g * g
        tl.store(momentum1_ptr + element, m, mask=mask, eviction_policy="evict_first" if EVICT else "")
        w = w - tl.div_rn(lr * g, tl.sqrt_rn(m) + eps)
    else:
        # Adam family and LAMB: bias-corrected moments with the module's step count;
        # weight decay enters the update (``+ weight_decay * w``), as in FBGEMM.
        t = tl.load(step_ptr).to(tl.float32)
        m1 = beta1 * m1 + (1.0 - beta1) * g
        tl.store(momentum1_ptr + element, m1, mask=mask, eviction_policy="evict_first" if EVICT else "")
        m1_hat = tl.div_rn(m1, 1.0 - tl.exp2(t * tl.log2(beta1)))
        if OPTIMIZER == _PARTIAL_ROWWISE_ADAM:
            m2 = beta2 * m2 + (1.0 - beta2) * tl.div_rn(tl.sum(g * g, axis=1), dim_f)
            tl.store(momentum2_ptr + row, m2, mask=active, eviction_policy="evict_first" if EVICT else "")
            m2_hat = tl.div_rn(m2, 1.0 - tl.exp2(t * tl.log2(beta2)))[:, None]
        else:
            m2 = beta2 * m2 + (1.0 - beta2) * g * g
            tl.store(momentum2_ptr + element, m2, mask=mask, eviction_policy="evict_first" if EVICT else "")
            m2_hat = tl.div_rn(m2, 1.0 - tl.exp2(t * tl.log2(beta2)))
        update = tl.where(mask, tl.div_rn(m1_hat, tl.sqrt_rn(m2_hat) + eps) + weight_decay * w, 0.0)
        if OPTIMIZER == _LAMB:
            w_norm = tl.sqrt_rn(tl.sum(w * w, axis=1))
            u_norm = tl.sqrt_rn(tl.sum(update * update, axis=1))
            # FBGEMM: ratio = |w| / |update| (a zero row stays zero); a zero update moves
            # nothing whatever the ratio, where FBGEMM's 0/0 would write NaN.
            ratio = tl.div_rn(w_norm, tl.where(u_norm > 0, u_norm, 1.0))
            update = update * ratio[:, None]
        w = w - lr * update
    # Random stream per (row, column); int32 offsets (wrapping) are plenty for rounding noise.
    rand_offsets = (row[:, None] * 4096 + cols[None, :]).to(tl.int32)
    w_new = _round_to_weights(w, w_ptrs, seed, rand_offsets, STOCHASTIC_ROUNDING)
    tl.store(w_ptrs, w_new, mask=mask, eviction_policy="evict_first" if EVICT else "")
