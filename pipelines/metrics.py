"""What the training app records (rank 0): a JSON-lines metrics file, TensorBoard events,
and the time per phase of a few profiled steps.

Records in the metrics file, one JSON object per line, told apart by ``kind``:
``config`` (the run's settings), ``step`` (step, loss, step_ms, examples_per_s), ``eval``
(step, auc, log_loss), ``phases`` (ms per step of each phase), ``final`` (the metrics the
app prints at the end). ``scripts/ab.py`` builds its report from them.
"""

import json
import os
from typing import Any, Dict, Optional

# Profiler event names by phase: our ops (record_function ranges in tbe_plugin.module),
# FBGEMM's (its lookup op and the autograd node of its backward), the collectives.
PHASE_PATTERNS = {
    "tbe_forward": ("tbe_plugin::lookup", "split_embedding_codegen_lookup", "split_embedding_codegen_forward"),
    "tbe_backward": ("tbe_plugin::fused_update", "SplitLookupFunction", "split_embedding_backward",
                     "_FusedLookupBackward"),
    "all_to_all": ("all_to_all", "alltoall", "all2all", "All2All"),
}  # fmt: skip


def phase_of(name: str) -> Optional[str]:
    for phase, patterns in PHASE_PATTERNS.items():
        if any(p in name for p in patterns):
            return phase
    return None


def phase_times(events: Any, steps: int, step_ms: float, device_time: bool) -> Dict[str, float]:
    """Milliseconds per step of each phase, from a profiler's events: for each event of a
    phase not inside another event of a phase, its device time (CUDA: kernels it launched,
    on any stream) or its CPU time. ``dense_and_other`` is the measured step time minus the
    phases (on CUDA, phases that overlap other work make it an underestimate of the rest)."""
    totals = {phase: 0.0 for phase in PHASE_PATTERNS}
    for event in events:
        phase = phase_of(event.name)
        if phase is None:
            continue
        parent, nested = event.cpu_parent, False
        while parent is not None:
            if phase_of(parent.name) is not None:
                nested = True
                break
            parent = parent.cpu_parent
        if not nested:
            totals[phase] += event.device_time_total if device_time else event.cpu_time_total
    out = {phase: us / 1e3 / steps for phase, us in totals.items()}
    out["step_ms"] = step_ms
    out["dense_and_other"] = max(0.0, step_ms - sum(out[p] for p in PHASE_PATTERNS))
    return out


class MetricsLog:
    """Rank 0's metrics file and TensorBoard writer (both optional); other ranks get a
    log that records nothing."""

    def __init__(self, path: Optional[str], tensorboard_dir: Optional[str], active: bool) -> None:
        self._file = None
        self._writer = None
        if not active:
            return
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = open(path, "w")
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=tensorboard_dir)

    def record(self, kind: str, step: Optional[int] = None, **values: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
            self._file.flush()
        if self._writer is not None and step is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: str) -> Dict[str, Any]:
    """A metrics file as lists per kind (``config``, ``phases`` and ``final``: the last)."""
    out: Dict[str, Any] = {"step": [], "eval": []}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            kind = record.pop("kind")
            if kind in ("step", "eval"):
                out[kind].append(record)
            else:
                out[kind] = record
    return out
