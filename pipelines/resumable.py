"""Batches that know where they stand: the data position a checkpoint saves and a resumed
job starts from (exactly, without replaying the stream), and whether the next batches are
there yet.

A source gives ``(batch, position after it)`` pairs from a position (``batches_from`` in
``pipelines.app.data``); positions are JSON values. A source that is not ready raises
``DataNotReady`` naming the paths it waits for. ``PositionedBatches`` is the training
loop's iterator over such pairs. Imports nothing from the app.
"""

from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple


class DataNotReady(Exception):
    """The next batch needs data that is not there yet: ``waiting_for`` lists the paths
    (files, markers) that must exist first."""

    def __init__(self, waiting_for: List[str]) -> None:
        super().__init__("data not ready: waiting for " + ", ".join(waiting_for))
        self.waiting_for = list(waiting_for)


class PositionedBatches:
    """An iterator of at most ``limit`` batches from ``pairs`` (an iterator of ``(batch,
    position after it)``) that starts at ``start`` and remembers the position after each
    of the last ``history`` batches it handed out: ``position_after(n)`` is where the
    stream stands after its n-th batch (0: ``start``), which is what a checkpoint after n
    trained batches records even when the pipeline has drawn more.

    ``waiting_for(n)`` reads up to ``n`` batches ahead without handing them out and
    returns what the source waits for if they are not all there (empty: they are, or
    the data ends first). A source that raised ``DataNotReady`` is done: the job holds
    and a relaunch resumes from a checkpoint. Drawing past that point raises it again,
    or ends the iteration with ``stop_when_not_ready`` (evaluation reads what is there)."""

    def __init__(
        self, pairs: Iterator[Tuple[Any, Any]], start: Any, limit: Optional[int] = None,
        stop_when_not_ready: bool = False, history: int = 64,
    ) -> None:  # fmt: skip
        if limit is not None and limit < 0:
            raise ValueError(f"limit: must be >= 0 or None, got {limit}")
        if history < 1:
            raise ValueError(f"history: must be >= 1, got {history}")
        self._pairs, self._limit, self._history = pairs, limit, history
        self._stop_when_not_ready = stop_when_not_ready
        self._buffer: Deque[Tuple[Any, Any]] = deque()
        self._positions: Dict[int, Any] = {0: start}
        self._handed_out = 0
        self._exhausted = False
        self._waiting: List[str] = []

    def __iter__(self) -> "PositionedBatches":
        return self

    def _remaining(self) -> Optional[int]:
        return None if self._limit is None else self._limit - self._handed_out

    def _fill(self, count: int) -> None:
        remaining = self._remaining()
        if remaining is not None:
            count = min(count, remaining)
        while len(self._buffer) < count and not self._exhausted and not self._waiting:
            try:
                self._buffer.append(next(self._pairs))
            except StopIteration:
                self._exhausted = True
            except DataNotReady as wait:
                self._waiting = wait.waiting_for

    def __next__(self) -> Any:
        if self._remaining() == 0:
            raise StopIteration
        self._fill(1)
        if not self._buffer:
            if self._waiting and not self._stop_when_not_ready:
                raise DataNotReady(self._waiting)
            raise StopIteration
        batch, position = self._buffer.popleft()
        self._handed_out += 1
        self._positions[self._handed_out] = position
        self._positions.pop(self._handed_out - self._history, None)
        return batch

    def waiting_for(self, lookahead: int) -> List[str]:
        self._fill(lookahead)
        remaining = self._remaining()
        wanted = lookahead if remaining is None else min(lookahead, remaining)
        return list(self._waiting) if len(self._buffer) < wanted else []

    @property
    def handed_out(self) -> int:
        return self._handed_out

    def position_after(self, count: int) -> Any:
        if count not in self._positions:
            raise KeyError(
                f"position_after({count}): only the positions after batches "
                f"{min(self._positions)}..{self._handed_out} are kept (history={self._history})"
            )
        return self._positions[count]
