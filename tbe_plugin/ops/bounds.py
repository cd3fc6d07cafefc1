"""Host-side input validation and bounds-check reporting for the TBE ops.

The kernels count bad ids and bad offsets into a small int64 status vector (see
``common.STATUS_*``). This module turns that vector into FBGEMM's ``BoundsCheckMode``
behaviour: FATAL raises a Python exception naming the feature, bag and id; WARNING
warns once per status vector; IGNORE and NONE say nothing. On CUDA the WARNING check
is read one call late, from a pinned copy, so that it never stalls the stream.

Lives in ``tbe_plugin.ops``: imports torch only.
"""

import warnings
import weakref
from typing import Dict, Optional, Sequence, Tuple

import torch

from tbe_plugin.ops.common import (
    STATUS_BAD_IDS,
    STATUS_BAD_OFFSETS,
    STATUS_FIRST_BAD_BAG,
    STATUS_FIRST_BAD_ID_POS,
    STATUS_WARNED,
    SUPPORTED_INDEX_DTYPES,
    BoundsCheck,
    new_status,
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
        # data_ptr -> (weak reference to the status vector, pinned copy, copy-done event)
        self.pending: Dict[int, Tuple[weakref.ref, torch.Tensor, torch.cuda.Event]] = {}

    def poll_and_post(self, status: torch.Tensor) -> Optional[Sequence[int]]:
        """The values copied at the previous call (None if none or not done); copies now."""
        key = status.data_ptr()
        entry = self.pending.get(key)
        if entry is None or entry[0]() is not status:
            if len(self.pending) > 256:  # entries of freed status vectors
                self.pending.pop(next(iter(self.pending)))
            host = torch.empty_like(status, device="cpu").pin_memory()
            entry = (weakref.ref(status), host, torch.cuda.Event())
            self.pending[key] = entry
            values = None
        else:
            values = entry[1].tolist() if entry[2].query() else None
        entry[1].copy_(status, non_blocking=True)
        entry[2].record()
        return values


_deferred = _DeferredWarning()


def raise_if_fatal(
    status: torch.Tensor,
    mode: int,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    rows_per_feature: torch.Tensor,
) -> None:
    """FATAL: reads the status (a sync) and raises on any bad id or offset, naming it."""
    if mode != BoundsCheck.FATAL:
        return
    values = status.tolist()
    if values[STATUS_BAD_IDS] or values[STATUS_BAD_OFFSETS]:
        message = describe_problems(values, indices, offsets, rows_per_feature)
        status.copy_(new_status(status.device))
        raise BoundsCheckError(f"tbe_plugin bounds check (FATAL): {message}")


def warn_once(status: torch.Tensor, mode: int) -> None:
    """WARNING: warns the first time this status vector shows a problem (on CUDA, from the
    previous call's pinned copy, so that the stream never waits)."""
    if mode != BoundsCheck.WARNING:
        return
    if status.is_cuda:
        values = _deferred.poll_and_post(status)
        detail = "an earlier batch"
    else:
        values = status.tolist()
        detail = "this batch"
    if values is None or values[STATUS_WARNED]:
        return
    if values[STATUS_BAD_IDS] or values[STATUS_BAD_OFFSETS]:
        status[STATUS_WARNED] = 1
        warnings.warn(
            f"tbe_plugin bounds check (WARNING) in {detail}: "
            f"{values[STATUS_BAD_IDS]} id(s) out of range were read as row 0 and "
            f"{values[STATUS_BAD_OFFSETS]} bag(s) with invalid offsets were clamped. "
            "Warned once; use bounds_check_mode=FATAL to find the bad input.",
            RuntimeWarning,
            stacklevel=4,
        )


def merge_status(into: torch.Tensor, update: torch.Tensor) -> None:
    """Folds one call's status vector into a persistent one (counts add, first positions
    take the minimum, the warned flag stays)."""
    into[STATUS_BAD_IDS] += update[STATUS_BAD_IDS]
    into[STATUS_BAD_OFFSETS] += update[STATUS_BAD_OFFSETS]
    into[STATUS_FIRST_BAD_ID_POS] = torch.minimum(into[STATUS_FIRST_BAD_ID_POS], update[STATUS_FIRST_BAD_ID_POS])
    into[STATUS_FIRST_BAD_BAG] = torch.minimum(into[STATUS_FIRST_BAD_BAG], update[STATUS_FIRST_BAD_BAG])
