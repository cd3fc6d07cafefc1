"""Host-side input validation and bounds-check reporting for the TBE ops.

The kernels count bad ids and bad offsets into a small int64 status vector (see
``common.STATUS_*``). This module turns that vector into FBGEMM's ``BoundsCheckMode``
behaviour: FATAL raises a Python exception naming the feature, bag and id; WARNING
warns once per status vector; IGNORE and NONE say nothing. On CUDA the WARNING check
is read one call late, from a pinned copy, so that it never stalls the stream.

Lives in ``tbe_plugin.ops``: imports torch only.
"""

import warnings
from typing import Dict, Optional, Sequence, Tuple

import torch

from tbe_plugin.ops.common import (
    NO_POSITION,
    STATUS_BAD_IDS,
    STATUS_BAD_OFFSETS,
    STATUS_FIRST_BAD_BAG,
    STATUS_FIRST_BAD_ID_POS,
    SUPPORTED_INDEX_DTYPES,
    BoundsCheck,
)


class BoundsCheckError(IndexError):
    """An id out of its table's range or a malformed offsets tensor (BoundsCheckMode.FATAL)."""


def validate_forward_inputs(
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    num_features: int,
    device: torch.device,
) -> int:
    """Checks what can be checked without reading device memory; returns B."""
    for name, t in (("indices", indices), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the embedding tables are on {device}")
    if offsets.numel() < 1 or (offsets.numel() - 1) % num_features:
        raise ValueError(
            f"offsets has {offsets.numel()} elements; expected T*B+1 for T={num_features} "
            f"features (feature-major, one offset per bag plus the end)"
        )
    if per_sample_weights is not None:
        if not isinstance(per_sample_weights, torch.Tensor) or not per_sample_weights.is_floating_point():
            raise TypeError("per_sample_weights must be a floating-point tensor")
        if per_sample_weights.shape != indices.shape:
            raise ValueError(
                f"per_sample_weights has shape {tuple(per_sample_weights.shape)} but indices "
                f"has shape {tuple(indices.shape)}: one weight per id is needed"
            )
        if per_sample_weights.device != device:
            raise ValueError(
                f"per_sample_weights is on {per_sample_weights.device} but the embedding "
                f"tables are on {device}"
            )
    return (offsets.numel() - 1) // num_features


def _locate(offsets: torch.Tensor, position: int, B: int) -> Tuple[int, int]:
    """(feature, bag) of the bag holding ``position`` in indices."""
    host = offsets.cpu().to(torch.int64)
    flat_bag = int(torch.searchsorted(host[1:], torch.tensor(position), right=True))
    flat_bag = min(flat_bag, host.numel() - 2)
    return flat_bag // B, flat_bag % B


def describe_problems(
    values: Sequence[int],
    indices: torch.Tensor,
    offsets: torch.Tensor,
    rows_per_feature: torch.Tensor,
) -> str:
    """A message naming the first bad id (feature, bag, id, rows) and/or the first bad bag."""
    rows_per_feature = rows_per_feature.tolist()
    num_features = len(rows_per_feature)
    B = (offsets.numel() - 1) // num_features
    parts = []
    if values[STATUS_BAD_OFFSETS]:
        flat_bag = values[STATUS_FIRST_BAD_BAG]
        start, end = offsets[flat_bag : flat_bag + 2].tolist()
        parts.append(
            f"{values[STATUS_BAD_OFFSETS]} bag(s) have invalid offsets; the first is bag "
            f"{flat_bag % B} of feature {flat_bag // B} with offsets [{start}, {end}) and "
            f"{indices.numel()} indices in all (offsets must be non-decreasing, within "
            f"[0, len(indices)], and the last must equal len(indices))"
        )
    if values[STATUS_BAD_IDS]:
        pos = values[STATUS_FIRST_BAD_ID_POS]
        feature, bag = _locate(offsets, pos, B)
        bad_id = int(indices[pos])
        parts.append(
            f"{values[STATUS_BAD_IDS]} id(s) out of range; the first is id {bad_id} at "
            f"indices[{pos}], bag {bag} of feature {feature}, whose table has "
            f"{rows_per_feature[feature]} rows"
        )
    return "; ".join(parts)


class _DeferredWarning:
    """Pinned copies of status vectors, read one call later so WARNING never syncs."""

    def __init__(self) -> None:
        self.pending: Dict[int, Tuple[torch.Tensor, torch.cuda.Event]] = {}
        self.warned: set = set()

    def poll(self, key: int) -> Optional[Sequence[int]]:
        entry = self.pending.get(key)
        if entry is None or not entry[1].query():
            return None
        return entry[0].tolist()

    def post(self, key: int, status: torch.Tensor) -> None:
        if key not in self.pending:
            if len(self.pending) > 256:  # keys of freed status vectors
                self.pending.pop(next(iter(self.pending)))
            host = torch.empty_like(status, device="cpu").pin_memory()
            self.pending[key] = (host, torch.cuda.Event())
        host, event = self.pending[key]
        host.copy_(status, non_blocking=True)
        event.record()


_deferred = _DeferredWarning()


def report_bounds(
    status: torch.Tensor,
    mode: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    rows_per_feature: torch.Tensor,
) -> None:
    """Acts on the status vector after a launch, as ``mode`` says."""
    if mode in (BoundsCheck.NONE, BoundsCheck.IGNORE):
        return
    if mode == BoundsCheck.FATAL:
        values = status.tolist()
        if values[STATUS_BAD_IDS] or values[STATUS_BAD_OFFSETS]:
            message = describe_problems(values, indices, offsets, rows_per_feature)
            status.copy_(torch.tensor([0, NO_POSITION, 0, NO_POSITION]))
            raise BoundsCheckError(f"tbe_plugin bounds check (FATAL): {message}")
        return
    key = status.data_ptr()
    if key in _deferred.warned:
        return
    if status.is_cuda:
        values = _deferred.poll(key)
        _deferred.post(key, status)
        detail = "an earlier batch"
    else:
        values = status.tolist()
        detail = "this batch"
    if values is not None and (values[STATUS_BAD_IDS] or values[STATUS_BAD_OFFSETS]):
        _deferred.warned.add(key)
        warnings.warn(
            f"tbe_plugin bounds check (WARNING) in {detail}: "
            f"{values[STATUS_BAD_IDS]} id(s) out of range were read as row 0 and "
            f"{values[STATUS_BAD_OFFSETS]} bag(s) with invalid offsets were clamped. "
            "Warned once; use bounds_check_mode=FATAL to find the bad input.",
            RuntimeWarning,
            stacklevel=4,
        )
