"""Pure-PyTorch references for the TBE ops, used by the tests and the benchmarks.

Written for clarity, not speed: one feature at a time, ``index_add_`` for pooling.
``upcast=True`` computes in fp32 (what the kernels promise); ``upcast=False`` computes
in the weights' own dtype, to measure how much error that dtype alone brings.

Lives in ``tbe_plugin.ops``: imports torch only.
"""

from typing import List, Optional, Sequence, Tuple

import torch

from tbe_plugin.ops.common import Pooling


def tbe_forward_reference(
    tables: Sequence[torch.Tensor],
    feature_table_map: Sequence[int],
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor] = None,
    pooling: int = Pooling.SUM,
    output_dtype: torch.dtype = torch.float32,
    upcast: bool = True,
) -> torch.Tensor:
    """FBGEMM's TBE forward semantics on per-table ``[rows, D]`` weights.

    Pooled: ``[B, sum of D over features]``, feature-major column blocks; MEAN divides
    the (weighted) sum by the bag's length, and an empty bag gives zeros. Unpooled:
    ``[len(indices), max D]``, row ``i`` the (weighted) row of ``indices[i]``, zero-padded.
    Ids must be in range: the reference does not emulate bounds-check repairs.
    """
    num_features = len(feature_table_map)
    B = (offsets.numel() - 1) // num_features
    dims = [tables[t].shape[1] for t in feature_table_map]
    offsets = offsets.to(torch.int64)
    indices = indices.to(torch.int64)
    lengths = offsets[1:] - offsets[:-1]
    compute_dtype = torch.float32 if upcast else tables[0].dtype
    if pooling == Pooling.NONE:
        out = torch.zeros(indices.numel(), max(dims), dtype=compute_dtype)
    else:
        out = torch.zeros(B, sum(dims), dtype=compute_dtype)
    col = 0
    for f, t in enumerate(feature_table_map):
        lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
        ids = indices[lo:hi]
        rows = tables[t].detach().cpu().to(compute_dtype)[ids.cpu()]
        if per_sample_weights is not None:
            rows = rows * per_sample_weights[lo:hi].cpu().to(compute_dtype)[:, None]
        if pooling == Pooling.NONE:
            out[lo:hi, : dims[f]] = rows
            continue
        bag_lengths = lengths[f * B : (f + 1) * B].cpu()
        bag_of_row = torch.repeat_interleave(torch.arange(B), bag_lengths)
        pooled = torch.zeros(B, dims[f], dtype=compute_dtype).index_add_(0, bag_of_row, rows)
        if pooling == Pooling.MEAN:
            pooled = pooled / bag_lengths.clamp(min=1).to(compute_dtype)[:, None]
        out[:, col : col + dims[f]] = pooled
        col += dims[f]
    return out.to(output_dtype)


def aggregate_row_gradients(
    tables: Sequence[torch.Tensor],
    feature_table_map: Sequence[int],
    indices: torch.Tensor,
    offsets: torch.Tensor,
    grad_output: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor] = None,
    pooling: int = Pooling.SUM,
) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Per table, the dense fp32 gradient ``[rows, D]`` of the forward (duplicates summed),
    and the set of touched rows. Clear, not fast: the kernels never build these."""
    num_features = len(feature_table_map)
    B = (offsets.numel() - 1) // num_features
    offsets = offsets.to(torch.int64).cpu()
    indices = indices.to(torch.int64).cpu()
    grad_output = grad_output.detach().float().cpu()
    grads = [torch.zeros(t.shape, dtype=torch.float32) for t in tables]
    touched = [torch.zeros(t.shape[0], dtype=torch.bool) for t in tables]
    col = 0
    for f, t in enumerate(feature_table_map):
        dim = tables[t].shape[1]
        for b in range(B):
            lo, hi = int(offsets[f * B + b]), int(offsets[f * B + b + 1])
            for p in range(lo, hi):
                if pooling == Pooling.NONE:
                    g = grad_output[p, :dim].clone()
                else:
                    g = grad_output[b, col : col + dim].clone()
                if per_sample_weights is not None:
                    g = g * float(per_sample_weights[p])
                if pooling == Pooling.MEAN:
                    g = g / (hi - lo)
                grads[t][indices[p]] += g
                touched[t][indices[p]] = True
        col += dim
    return grads, touched


def optimizer_step_reference(
    optimizer: str,
    weight: torch.Tensor,
    grad: torch.Tensor,
    momentum1: Optional[torch.Tensor],
    momentum2: Optional[torch.Tensor],
    step: int,
    lr: float,
    eps: float = 1.0e-8,
    beta1: float = 0.9,
    beta2: float = 0.999,
    weight_decay: float = 0.0,
    weight_decay_mode: str = "NONE",
) -> None:
    """One step of FBGEMM's exact ``optimizer`` on touched rows, in place, all in fp32.

    ``weight``/``grad`` are ``[rows, D]`` fp32 (only touched rows); ``momentum1``/``momentum2``
    ``[rows]`` for rowwise state or ``[rows, D]``; ``step`` the count after this step (Adam/LAMB).
    """
    g = grad.clone()
    w = weight
    if optimizer == "EXACT_SGD":  # FBGEMM's exact SGD and Adagrad apply no weight decay
        w -= lr * g
    elif optimizer == "EXACT_ROWWISE_ADAGRAD":
        if weight_decay_mode == "L2":
            g += weight_decay * w
        momentum1 += (g * g).mean(dim=1)
        multiplier = lr / (momentum1.sqrt() + eps)
        if weight_decay_mode == "DECOUPLE":
            w *= 1.0 - lr * weight_decay
        w -= multiplier[:, None] * g
    elif optimizer == "EXACT_ADAGRAD":
        momentum1 += g * g
        w -= lr * g / (momentum1.sqrt() + eps)
    else:
        momentum1.mul_(beta1).add_((1.0 - beta1) * g)
        m1_hat = momentum1 / (1.0 - beta1**step)
        if optimizer == "PARTIAL_ROWWISE_ADAM":
            momentum2.mul_(beta2).add_((1.0 - beta2) * (g * g).mean(dim=1))
            m2_hat = (momentum2 / (1.0 - beta2**step))[:, None]
        else:
            momentum2.mul_(beta2).add_((1.0 - beta2) * g * g)
            m2_hat = momentum2 / (1.0 - beta2**step)
        update = m1_hat / (m2_hat.sqrt() + eps) + weight_decay * w
        if optimizer == "LAMB":
            w_norm = w.norm(dim=1, keepdim=True)
            u_norm = update.norm(dim=1, keepdim=True)
            ratio = w_norm / torch.where(u_norm > 0, u_norm, torch.ones_like(u_norm))
            update = update * ratio
        w -= lr * update
