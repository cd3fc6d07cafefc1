"""Mode constants and small host-side helpers shared by the TBE ops.

Lives in ``tbe_plugin.ops``: imports torch only. The integer values equal FBGEMM's
enums of the same names, so a mode crosses the custom-op boundary as a plain int.
"""

import contextlib
import enum

import torch


class Pooling(enum.IntEnum):
    """How the rows of one bag are combined (FBGEMM ``PoolingMode``)."""

    SUM = 0
    MEAN = 1
    NONE = 2


class BoundsCheck(enum.IntEnum):
    """What happens to an out-of-range id or a malformed offsets tensor (FBGEMM ``BoundsCheckMode``).

    FATAL raises a Python exception naming the feature, bag and id (on CUDA too: no
    device-side assert); WARNING replaces the bad id by row 0 and warns once; IGNORE
    replaces it silently; NONE trusts the input and checks nothing.
    """

    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host integers (``triton.cdiv`` is a constexpr function: ~5 us a call)."""
    return -(-int(a) // int(b))


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1), in plain Python: Triton 3.6's
    ``triton.next_power_of_2`` is a constexpr function whose wrapper costs ~5 us a call,
    and the launchers run on the host every step (33 calls a forward of 32 tables took
    ~170 us of its ~270 us of Python before the kernel launch)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


SUPPORTED_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SUPPORTED_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SUPPORTED_INDEX_DTYPES = (torch.int32, torch.int64)

# Slots of the int64 status vector that the forward kernels fill when they check bounds.
STATUS_BAD_IDS = 0  # how many ids were out of range
STATUS_FIRST_BAD_ID_POS = 1  # smallest position (into indices) of such an id
STATUS_BAD_OFFSETS = 2  # how many bags had offsets out of order or out of range
STATUS_FIRST_BAD_BAG = 3  # smallest flat bag number (feature * B + bag) among them
STATUS_WARNED = 4  # set by the host once WARNING mode has warned for this vector
STATUS_LEN = 5
NO_POSITION = torch.iinfo(torch.int64).max


def new_status(device: torch.device) -> torch.Tensor:
    """A fresh status vector: zero counts, 'no position' for the first-bad slots."""
    status = torch.zeros(STATUS_LEN, dtype=torch.int64, device=device)
    for slot in (STATUS_FIRST_BAD_ID_POS, STATUS_FIRST_BAD_BAG):  # fill_, not item assignment: no
        status[slot : slot + 1].fill_(NO_POSITION)  # host-to-device copy, so the stream never syncs
    return status


def vector_alignment(dims, elem_size: int) -> int:
    """Largest power of two (in elements, at most 16 bytes) dividing every row length.

    The kernels promise Triton that row starts are multiples of this, so that a row is
    read with vector loads; tables are packed back to back, so table offsets share it.
    """
    align = max(1, 16 // elem_size)
    while align > 1 and any(d % align for d in dims):
        align //= 2
    return align


def profiled(name: str):
    """A profiler range named ``name`` while a profiler records (the phase tables of
    ``pipelines.metrics`` read them), else nothing: a range costs ~8 us of host time even
    with no profiler (``torch.profiler.record_function``'s enter and exit ops, 2 CPU cores
    of the CI machine), paid on every lookup and backward. Under ``torch.compile`` always the
    range, as before (the compiler traces ranges, not the profiler's state)."""
    if torch.compiler.is_compiling() or torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
