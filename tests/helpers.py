"""Shared test inputs and the one tolerance policy of the test suite."""

from typing import Optional, Sequence, Tuple

import torch

# Absolute and relative tolerance by output dtype, for one looked-up row; the absolute
# part grows with the pooling factor (see assert_tbe_close).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
}


def make_bags(
    rows_per_feature: Sequence[int],
    B: int,
    max_len: int,
    index_dtype: torch.dtype = torch.int64,
    seed: int = 0,
    hot_fraction: float = 0.0,
    empty_features: Sequence[int] = (),
    device: str = "cpu",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random bags in FBGEMM's layout: (indices, offsets of length F*B+1).

    Lengths are uniform in [0, max_len] (so empty bags occur); ``hot_fraction`` of the
    ids are row 0 (a hot row, duplicated within and across bags); ``empty_features``
    get no lookups at all.
    """
    g = torch.Generator().manual_seed(seed)
    F = len(rows_per_feature)
    lengths = torch.randint(0, max_len + 1, (F * B,), generator=g)
    for f in empty_features:
        lengths[f * B : (f + 1) * B] = 0
    chunks = []
    for bag in range(F * B):
        n = int(lengths[bag])
        ids = torch.randint(0, rows_per_feature[bag // B], (n,), generator=g)
        hot = torch.rand(n, generator=g) < hot_fraction
        chunks.append(torch.where(hot, torch.zeros_like(ids), ids))
    indices = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return indices.to(index_dtype).to(device), offsets.to(index_dtype).to(device)


def assert_tbe_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    max_len: int,
    lowp_reference: Optional[torch.Tensor] = None,
) -> None:
    """``actual`` matches the fp32 ``expected`` within the dtype's tolerance.

    The absolute tolerance is scaled by the pooling factor. For low-precision outputs, a
    ``lowp_reference`` (the reference computed in that dtype) also admits any error up
    to twice the reference's own error.
    """
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    atol, rtol = TOLERANCES[actual.dtype]
    atol = atol * max(1, max_len)
    if lowp_reference is not None:
        own_error = (lowp_reference.float() - expected.float()).abs().max().item()
        atol = max(atol, 2 * own_error + atol)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol)


def assert_bitwise_equal(a, b) -> None:
    """Two TBE modules hold the same tables and optimizer states, bit for bit."""
    assert torch.equal(a.weights, b.weights)
    for states_a, states_b in zip(a.split_optimizer_states(), b.split_optimizer_states()):
        for x, y in zip(states_a, states_b):
            assert torch.equal(x, y)
