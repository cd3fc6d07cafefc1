"""Hot rows' gradient sums as a product: ``sums[f] = counts[f] @ grad[:, columns of f]``.

A building block for summing each table's hottest rows apart from the sort (not wired into
the backward yet; ``benchmarks/probe_hot_dense.py`` times it against cuBLAS). ``counts`` is
(F, K, B) fp32: how often feature f's hot row k sits in bag b (exact small integers);
``grad`` the (B, sum D) output gradient; feature f's D columns start at ``col_offsets[f]``.

Two kernels, each sum in a fixed order (bitwise the same from run to run): programs of
(feature, slice of SPLIT_B bags, block of BLOCK_D columns) sum their slice with fp32 dots
(``input_precision="ieee"``: full fp32 products, no TF32) into ``partials``; a second kernel
adds a feature's slices in slice order.

Lives in ``tbe_plugin.ops``: imports Triton and torch only.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _hot_partials_kernel(
    counts_ptr, grad_ptr, col_offsets_ptr, dims_ptr, partials_ptr, B, grad_stride, slices,
    K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_B: tl.constexpr,
):  # fmt: skip
    """partials[f, s, :, d-block] = counts[f, :, s-th SPLIT_B bags] @ grad[those bags, f's columns]."""
    f = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_D
    dim = tl.load(dims_ptr + f)
    if d0 < dim:
        col0 = tl.load(col_offsets_ptr + f)
        ks = tl.arange(0, K)
        cols = d0 + tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        acc = tl.zeros([K, BLOCK_D], dtype=tl.float32)
        first = s.to(tl.int64) * SPLIT_B
        for b0 in range(0, SPLIT_B, BLOCK_B):
            bags = first + b0 + tl.arange(0, BLOCK_B)
            inside = bags < B
            c = tl.load(counts_ptr + (f * K + ks[:, None]) * B + bags[None, :], mask=inside[None, :], other=0.0)
            g = tl.load(grad_ptr + bags[:, None] * grad_stride + col0 + cols[None, :],
                        mask=inside[:, None] & col_mask[None, :], other=0.0)  # fmt: skip
            acc = tl.dot(c, g.to(tl.float32), acc, input_precision="ieee")
        out = partials_ptr + ((f * slices + s) * K + ks[:, None]) * BLOCK_D * tl.num_programs(2) + cols[None, :]
        tl.store(out, acc, mask=col_mask[None, :])


@triton.jit
def _hot_sum_kernel(partials_ptr, sums_ptr, dims_ptr, slices, width, K: tl.constexpr, BLOCK_D: tl.constexpr):
    """sums[f, k, d-block] = partials[f, 0, k] + partials[f, 1, k] + ... in slice order."""
    f = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_D
    dim = tl.load(dims_ptr + f)
    if d0 < dim:
        ks = tl.arange(0, K)
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = cols[None, :] < dim
        total = tl.zeros([K, BLOCK_D], dtype=tl.float32)
        for s in range(0, slices):
            total += tl.load(partials_ptr + ((f * slices + s) * K + ks[:, None]) * width + cols[None, :], mask=mask,
                             other=0.0)  # fmt: skip
        tl.store(sums_ptr + (f * K + ks[:, None]) * width + cols[None, :], total, mask=mask)


def hot_sums(counts: torch.Tensor, grad: torch.Tensor, col_offsets: torch.Tensor, dims: torch.Tensor,
             split_b: int = 1024, block_b: int = 32, block_d: int = 64, num_warps: int = 4) -> torch.Tensor:  # fmt: skip
    """(F, K, max D) fp32: ``counts[f] @ grad[:, col_offsets[f] : col_offsets[f] + dims[f]]``, zero past
    each feature's D. ``counts`` (F, K, B) fp32 with K a power of two >= 16; ``grad`` (B, sum D),
    unit column stride; ``col_offsets``/``dims`` int64 on ``grad``'s device. Bitwise repeatable."""
    if counts.dim() != 3 or counts.dtype != torch.float32:
        raise ValueError(f"hot_sums: counts must be (F, K, B) fp32, got {counts.dtype} of shape {tuple(counts.shape)}")
    F, K, B = counts.shape
    if K < 16 or K & (K - 1):
        raise ValueError(f"hot_sums: K (hot rows a feature) must be a power of two >= 16 (tl.dot), got {K}")
    if grad.dim() != 2 or grad.shape[0] != B or grad.stride(1) != 1:
        raise ValueError(f"hot_sums: grad must be (B={B}, sum D) with unit column stride, got {tuple(grad.shape)}")
    if split_b % block_b:
        raise ValueError(f"hot_sums: split_b ({split_b}) must be a multiple of block_b ({block_b})")
    max_dim = int(dims.max()) if F else 0
    blocks = triton.cdiv(max(max_dim, 1), block_d)
    width = blocks * block_d
    slices = triton.cdiv(B, split_b)
    counts = counts.contiguous()
    partials = torch.zeros(F, slices, K, width, dtype=torch.float32, device=grad.device)
    sums = torch.zeros(F, K, width, dtype=torch.float32, device=grad.device)
    if F == 0 or B == 0:
        return sums[:, :, :max_dim]
    _hot_partials_kernel[(F, slices, blocks)](
        counts, grad, col_offsets, dims, partials, B, grad.stride(0), slices, K=K, BLOCK_B=block_b, BLOCK_D=block_d,
        SPLIT_B=split_b, num_warps=num_warps,
    )  # fmt: skip
    _hot_sum_kernel[(F, blocks)](partials, sums, dims, slices, width, K=K, BLOCK_D=block_d)
    return sums[:, :, :max_dim]
