"""Holds: how the training job stops when going on would waste its accelerators, and tells
whoever launched it why (``pipelines.app.supervise`` reads it).

A hold is ``HOLD.json`` in the run directory (the job's working directory, Hydra's run dir
here) and an exit code:

- ``error`` (exit 3, permanent: retrying cannot help): a non-finite loss, non-finite weights
  or optimizer state, running out of device memory, a kernel that fails to compile, a bad
  configuration found after start. No checkpoint is written from the bad state; the hold
  names the last good one.
- ``data`` (exit 4, transient): the data source is not ready (a file or its marker is
  missing). The job saved first if it trained since its last checkpoint; the hold lists
  the paths it waits for.
- ``preempted`` (exit 0): a pre-emption signal; the job saved and stopped.

Also here: the one per-step host collective that makes every rank agree on stopping
(``StepSignals``) and the device-side checks of the loss and state (``HealthMonitor``),
which sync the host only when they are read. Imports torch and ``pipelines.errors`` only (no
TorchRec, no app).
"""

import dataclasses
import json
import os
import signal
import traceback
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import torch

from pipelines.errors import ConfigError

HOLD_FILE = "HOLD.json"
EXIT_ERROR_HOLD = 3
EXIT_DATA_HOLD = 4
HOLD_KINDS = {"error": EXIT_ERROR_HOLD, "data": EXIT_DATA_HOLD, "preempted": 0}

# Pre-emption notices: finish the step, drain, save, exit 0.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclasses.dataclass
class Hold:
    """What ``HOLD.json`` records."""

    kind: str
    """``error``, ``data`` or ``preempted`` (``HOLD_KINDS``)."""
    reason: str
    """Why, in words (``non_finite_loss``, ``out_of_memory``, ``data_not_ready``, ...)."""
    step: int
    """The step the job reached (for ``non_finite_loss``: the first step with a bad loss)."""
    last_good_checkpoint: Optional[str] = None
    """The newest complete checkpoint, where a relaunch resumes (null: none)."""
    exception: Optional[str] = None
    """The exception and its traceback, for holds raised as one."""
    waiting_for: List[str] = dataclasses.field(default_factory=list)
    """``data`` holds: the paths that must exist before the job can go on."""
    rank: int = 0
    """The rank that wrote the hold (an exception may reach one rank only)."""

    def __post_init__(self) -> None:
        if self.kind not in HOLD_KINDS:
            raise ValueError(f"Hold.kind: {self.kind!r} is not one of {', '.join(HOLD_KINDS)}")

    @property
    def exit_code(self) -> int:
        return HOLD_KINDS[self.kind]

    def write(self, run_dir: str) -> str:
        """Writes ``run_dir/HOLD.json`` whole or not at all (write, then rename), so a
        reader never sees half of it, even when two ranks write."""
        path = os.path.join(run_dir, HOLD_FILE)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
            f.write("\n")
        os.replace(partial, path)
        return path


class JobHeld(Exception):
    """Raised through the training loop to stop on a hold; ``agreed``: every rank raises
    it (rank 0 writes the file), else only the rank that hit the problem (it writes)."""

    def __init__(self, hold: Hold, agreed: bool) -> None:
        super().__init__(f"hold ({hold.kind}): {hold.reason} at step {hold.step}")
        self.hold, self.agreed = hold, agreed


def read_hold(run_dir: str) -> Optional[dict]:
    path = os.path.join(run_dir, HOLD_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def clear_hold(run_dir: str) -> None:
    """Removes a hold left by an earlier launch (a running job is no longer held)."""
    try:
        os.remove(os.path.join(run_dir, HOLD_FILE))
    except FileNotFoundError:
        pass


def _permanent_error_types() -> Tuple[Tuple[type, str], ...]:
    """Exception types that retrying the same job cannot fix, with the hold's reason; the
    libraries that define some of them are probed, not assumed."""
    found: List[Tuple[type, str]] = [(torch.OutOfMemoryError, "out_of_memory"), (ConfigError, "bad_config")]
    probes = [
        ("triton.compiler.errors", "CompilationError", "compile_failure"),
        ("triton.runtime.errors", "OutOfResources", "compile_failure"),  # a launch that cannot fit the SM
        ("triton.runtime.errors", "PTXASError", "compile_failure"),
        ("torch._dynamo.exc", "BackendCompilerFailed", "compile_failure"),
        ("torchrec.distributed.planner.types", "PlannerError", "bad_config"),  # a table no kernel can serve
    ]
    import importlib

    for module_name, name, reason in probes:
        try:
            found.append((getattr(importlib.import_module(module_name), name), reason))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def permanent_error_reason(error: BaseException) -> Optional[str]:
    """The hold reason of ``error`` or of an exception it was raised from; None when a
    relaunch might succeed (a lost peer, a killed process, a full disk cleared later)."""
    types = _permanent_error_types()
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for kind, reason in types:
            if isinstance(error, kind):
                return reason
        # Triton's launcher and some CUDA paths report an allocation failure as a RuntimeError.
        if isinstance(error, RuntimeError) and "out of memory" in str(error).lower():
            return "out_of_memory"
        error = error.__cause__ or error.__context__
    return None


def error_hold(error: BaseException, reason: str, step: int, last_good: Optional[str], rank: int) -> Hold:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return Hold("error", reason, step, last_good_checkpoint=last_good, exception=text, rank=rank)


@dataclasses.dataclass
class Agreed:
    """What every rank agreed on at a step: any rank's flag is everyone's."""

    preempted: bool
    waiting_for_data: bool
    unhealthy: bool


class StepSignals:
    """Remembers a pre-emption signal, and makes the ranks agree once a step, in one host
    all-reduce over ``group`` (a gloo group), on stopping: pre-empted, data not ready,
    or unhealthy."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.preemption_requested = False
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self._notice)

    def _notice(self, signum: int, frame: Any) -> None:
        self.preemption_requested = True

    def agree(self, waiting_for_data: bool = False, unhealthy: bool = False) -> Agreed:
        import torch.distributed as dist

        flags = torch.tensor([self.preemption_requested, waiting_for_data, unhealthy], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return Agreed(*(bool(v) for v in flags.tolist()))


def local_tensors(state: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors this rank holds in a (nested) state dict: plain tensors,
    a ShardedTensor's local shards, a DTensor's local part."""
    if isinstance(state, dict):
        for value in state.values():
            yield from local_tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from local_tensors(value)
    elif hasattr(state, "local_shards"):
        for shard in state.local_shards():
            yield from local_tensors(shard.tensor)
    elif hasattr(state, "to_local"):
        yield from local_tensors(state.to_local())
    elif isinstance(state, torch.Tensor) and torch.is_floating_point(state) and state.numel():
        yield state


class HealthMonitor:
    """Device-side flags of a non-finite loss and of non-finite weights or optimizer state.

    ``note_loss`` ORs a step's loss into the first flag; ``sample_state`` checks, every
    ``every_steps`` steps, ``rows`` random rows of each local state tensor (whole tensors
    when smaller) into the second. Neither syncs the host: ``read`` does, at the logging
    interval, when the losses are read anyway. ``all_finite`` checks whole tensors (before
    a checkpoint is written)."""

    def __init__(self, device: torch.device, every_steps: int, rows: int, seed: int = 0) -> None:
        self.device, self.every_steps, self.rows = device, every_steps, rows
        self._flags = torch.zeros(2, dtype=torch.bool, device=device)  # [loss, state]
        self._generator = torch.Generator(device=device).manual_seed(seed)

    def note_loss(self, loss: torch.Tensor) -> None:
        self._flags[0] |= ~torch.isfinite(loss.detach()).all()

    def sample_state(self, step: int, tensors: Callable[[], Iterable[torch.Tensor]]) -> None:
        if not self.every_steps or step % self.every_steps:
            return
        finite = []
        for tensor in tensors():
            if tensor.dim() and tensor.size(0) > self.rows:
                rows = torch.randint(0, tensor.size(0), (self.rows,), device=self.device, generator=self._generator)
                tensor = tensor.index_select(0, rows.to(tensor.device))
            finite.append(torch.isfinite(tensor).all().to(self.device))
        if finite:
            self._flags[1] |= ~torch.stack(finite).all()

    def read(self) -> Tuple[bool, bool]:
        """(a loss was non-finite, a sampled state was), since the monitor was made: one sync."""
        loss_bad, state_bad = self._flags.tolist()
        return bool(loss_bad), bool(state_bad)

    def all_finite(self, tensors: Iterable[torch.Tensor]) -> bool:
        checks = [torch.isfinite(t).all().to(self.device) for t in tensors]
        return bool(torch.stack(checks).all().item()) if checks else True
