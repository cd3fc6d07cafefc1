"""Pure-PyTorch references for the TBE ops, used by the tests and the benchmarks.

Written for clarity, not speed: one feature at a time, ``index_add_`` for pooling.
``upcast=True`` computes in fp32 (what the kernels promise); ``upcast=False`` computes
in the weights' own dtype, to measure how much error that dtype alone brings.

Lives in ``tbe_plugin.ops``: imports torch only.
"""

from typing import Optional, Sequence

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
            rows = rows * per_sample_weights[lo:hi].detach().cpu().to(compute_dtype)[:, None]
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
