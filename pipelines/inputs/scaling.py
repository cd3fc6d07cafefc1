"""The reader pool's scaling policy and controller: grow when the trainer's queue runs low
while the readers are busy, shrink when it stays full while they idle, by ``step`` readers
(the paper's task group) at most once per ``cooldown_s``.

``ScalingController.decide`` is a pure function of what it is shown (time, queue depth as a
fraction of the queue's capacity, the readers' utilization over the last interval, the pool
size) and of its own last change, so a scripted load tests it exactly; ``ReaderPool`` shows
it the live values every ``interval_s`` and applies what it decides. Every decision, holds
included, is returned as a ``Decision`` (the pool logs them).
"""

import dataclasses
import importlib.util
from typing import Any, Dict, Optional


READER_BACKENDS = ("process", "ray")


@dataclasses.dataclass
class ScalingPolicy:
    backend: str = "process"
    """Where readers run: ``process`` (reader processes on this machine, the one built) or
    ``ray`` (Ray actors on a cluster's machines: refused with an error naming this field,
    since this tree has no Ray backend yet and does not depend on ray)."""
    min_readers: int = 1
    """The pool never shrinks below this many reader processes."""
    max_readers: int = 4
    """Nor grows above this many."""
    initial_readers: int = 1
    """Readers started with the pool."""
    step: int = 1
    """Readers added or removed per decision (a task group)."""
    standby: int = 1
    """Reader processes kept started and idle beside the pool, not counted in its size: a
    grow puts them to work at once and starts their replacements, instead of waiting for
    new processes to import their libraries (seconds on a loaded machine: the benchmark's
    dry periods at aa0cdcb). A shrink returns idle readers to standby first."""
    cooldown_s: float = 2.0
    """Seconds after a change before the next one (a new reader needs time to start and to
    fill the queue before its effect shows)."""
    interval_s: float = 0.25
    """Seconds between the controller's looks at the queue and the readers."""
    queue_capacity: int = 8
    """Partitions read ahead at most (in the trainer's queue or being read)."""
    low_water: float = 0.25
    """Grow only when the queue holds at most this fraction of its capacity ..."""
    busy_above: float = 0.8
    """... and the readers were busy at least this fraction of the last interval."""
    high_water: float = 0.75
    """Shrink only when the queue holds at least this fraction of its capacity ..."""
    idle_below: float = 0.5
    """... and the readers were busy at most this fraction of the last interval."""

    def __post_init__(self) -> None:
        def require(condition: bool, field: str, message: str) -> None:
            if not condition:
                raise ValueError(f"{field}: {message}")

        require(self.backend in READER_BACKENDS, "backend", f"{self.backend!r} is not one of {', '.join(READER_BACKENDS)}")
        if self.backend == "ray":
            installed = importlib.util.find_spec("ray") is not None
            raise ValueError("backend: 'ray' (readers as Ray actors) is not built in this tree"
                             + ("" if installed else ", and the ray package is not installed")
                             + "; use backend: process (reader processes on this machine)")  # fmt: skip
        require(self.min_readers >= 1, "min_readers", f"must be >= 1, got {self.min_readers}")
        require(self.max_readers >= self.min_readers, "max_readers", f"must be >= min_readers ({self.min_readers})")
        require(self.min_readers <= self.initial_readers <= self.max_readers, "initial_readers",
                f"must be within min_readers..max_readers ({self.min_readers}..{self.max_readers})")  # fmt: skip
        require(self.step >= 1, "step", f"must be >= 1, got {self.step}")
        require(self.standby >= 0, "standby", f"must be >= 0, got {self.standby}")
        require(self.cooldown_s >= 0, "cooldown_s", "must be >= 0")
        require(self.interval_s > 0, "interval_s", "must be > 0")
        require(self.queue_capacity >= 1, "queue_capacity", "must be >= 1")
        require(0 <= self.low_water < self.high_water <= 1, "low_water",
                f"need 0 <= low_water < high_water <= 1, got {self.low_water}, {self.high_water}")  # fmt: skip
        require(0 <= self.idle_below < self.busy_above <= 1, "idle_below",
                f"need 0 <= idle_below < busy_above <= 1, got {self.idle_below}, {self.busy_above}")  # fmt: skip


@dataclasses.dataclass
class Decision:
    """One look of the controller: ``action`` grow, shrink or hold; ``reason`` why."""

    time: float
    action: str
    size_before: int
    size_after: int
    depth: float
    utilization: float
    reason: str

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


class ScalingController:
    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self.last_change: Optional[float] = None

    def decide(self, now: float, depth: float, utilization: float, size: int) -> Decision:
        """What to do at time ``now`` (seconds) with the queue ``depth`` full (0..1), the
        readers busy ``utilization`` of the last interval (0..1) and ``size`` readers."""
        p = self.policy
        if depth <= p.low_water and utilization >= p.busy_above and size < p.max_readers:
            wanted, target = "grow", min(p.max_readers, size + p.step)
            why = f"queue {depth:.2f} <= {p.low_water} and readers busy {utilization:.2f} >= {p.busy_above}"
        elif depth >= p.high_water and utilization <= p.idle_below and size > p.min_readers:
            wanted, target = "shrink", max(p.min_readers, size - p.step)
            why = f"queue {depth:.2f} >= {p.high_water} and readers busy {utilization:.2f} <= {p.idle_below}"
        else:
            return Decision(now, "hold", size, size, depth, utilization, "within bounds")
        if self.last_change is not None and now - self.last_change < p.cooldown_s:
            left = p.cooldown_s - (now - self.last_change)
            return Decision(now, "hold", size, size, depth, utilization, f"cooldown ({left:.2f} s left; wanted {wanted})")
        self.last_change = now
        return Decision(now, wanted, size, target, depth, utilization, why)
