"""What the training app records (rank 0): a JSON-lines metrics file, TensorBoard events,
and the time per phase of a few profiled steps.

Records in the metrics file, one JSON object per line, told apart by ``kind``, each with
``time``, the wall clock (``time.time()``, seconds) when the record was made (a ``step``
record's: when its step ended, see there): ``config`` (the run's settings, the commit and
dirty flag), ``startup`` (just before the first step: where the start-up went, see
``pipelines.app.train``), ``step`` (step, loss, step_ms, examples_per_s; ``sync_ms`` on a
step that paid the periodic host sync), ``eval`` (step, auc, log_loss and, on the planted
click log, the optimum's; ``eval_s``), ``phases`` (ms per step of each phase, measured on the
device; the profiler's own cost), ``checkpoint`` (a drain, the state check and a save:
``drain_s``, ``check_s``, ``save_s``), ``repartition`` / ``reshard``, ``final`` (the metrics the
app prints at the end, and where the end went). A record whose work paused the training loop
(an evaluation, the profiler's start and stop, a checkpoint's check and save, a re-plan or
re-shard) says for how long in ``pause_s``: the loop's wall time less these is the time it
trained. ``scripts/ab.py`` builds its report from them.
"""

import json
import os
import time
from typing import Any, Dict, Optional, Tuple

import torch
from torch.autograd import DeviceType

# Profiler event names by phase: our ops (record_function ranges in tbe_plugin.module and
# tbe_plugin.ops.training: the backward's plan, launched during the forward, is backward work),
# FBGEMM's (its lookup op and the autograd node of its backward), TorchRec's range around a
# sharded module's lookup (FBGEMM's bounds check with it), the collectives. The innermost
# op of a phase decides.
PHASE_PATTERNS = {
    "tbe_forward": ("tbe_plugin::lookup", "split_embedding_codegen_lookup", "split_embedding_codegen_forward",
                    "[lookup]_", "fbgemm::bounds_check_indices"),
    "tbe_backward": ("tbe_plugin::fused_update", "tbe_plugin::plan_backward", "SplitLookupFunction",
                     "split_embedding_backward", "_FusedLookupBackward"),
    "all_to_all": ("all_to_all", "alltoall", "all2all", "All2All"),
}  # fmt: skip
REST = "dense_and_other"
PHASES = (*PHASE_PATTERNS, REST)


def phase_of(name: str) -> Optional[str]:
    for phase, patterns in PHASE_PATTERNS.items():
        if any(p in name for p in patterns):
            return phase
    return None


def enclosing_phase(event: Any) -> str:
    """The phase of the innermost op of a phase among ``event`` and its ancestors (``REST``
    when none is)."""
    while event is not None:
        phase = phase_of(event.name)
        if phase is not None:
            return phase
        event = event.cpu_parent
    return REST


def phase_times(events: Any, steps: int, step_ms: float, device_time: bool) -> Dict[str, Any]:
    """Milliseconds per step of each phase, every one measured (none is a difference): on
    CUDA the duration of every kernel, credited to the phase enclosing the op that launched
    it; without a GPU every op's own CPU time, credited the same way. ``total_ms`` is their
    sum (on CUDA the device's busy time summed over streams, which overlap: it may exceed
    the step), ``step_ms`` the host's median step time, ``timing`` which clock it was."""
    totals = dict.fromkeys(PHASES, 0.0)
    for event in events:
        if device_time:
            spent = sum(k.duration for k in getattr(event, "kernels", ()) if k.name != event.name)
        elif getattr(event, "device_type", None) in (None, DeviceType.CPU):
            spent = event.self_cpu_time_total
        else:
            spent = 0
        if spent:
            totals[enclosing_phase(event)] += spent
    out: Dict[str, Any] = {phase: us / 1e3 / steps for phase, us in totals.items()}
    out.update(total_ms=sum(out[p] for p in PHASES), step_ms=step_ms,
               timing="device kernels" if device_time else "host CPU (ops' own time)")  # fmt: skip
    return out


def binary_quality(logits: torch.Tensor, labels: torch.Tensor, optimal_logits: Optional[torch.Tensor] = None
                   ) -> Dict[str, float]:  # fmt: skip
    """AUC and log loss of ``logits`` on ``labels``; with the Bayes-optimal logits of the same
    examples (a planted click log's), the optimum's AUC and log loss on the same labels and
    the model's distance to them (``excess_log_loss`` >= 0 up to sampling noise)."""
    from torchmetrics.classification import BinaryAUROC

    def scores(values: torch.Tensor) -> Tuple[float, float]:
        log_loss = torch.nn.functional.binary_cross_entropy_with_logits(values, labels).item()
        return BinaryAUROC()(torch.sigmoid(values), labels.long()).item(), log_loss

    auc, log_loss = scores(logits)
    out = {"auc": auc, "log_loss": log_loss}
    if optimal_logits is not None:
        optimal_auc, optimal_log_loss = scores(optimal_logits)
        out.update(optimal_auc=optimal_auc, optimal_log_loss=optimal_log_loss, auc_gap=optimal_auc - auc,
                   excess_log_loss=log_loss - optimal_log_loss)  # fmt: skip
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

    def record(self, kind: str, step: Optional[int] = None, *, at: Optional[float] = None, **values: Any) -> None:
        """One record; ``at``: its wall-clock ``time`` when not now (a step's end, logged later).
        The time goes to the file only (TensorBoard keeps its own)."""
        if self._file is not None:
            stamp = time.time() if at is None else at
            self._file.write(json.dumps({"kind": kind, "step": step, "time": stamp, **values}) + "\n")
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
