"""Checkpoints that survive a crash: committed only once complete, listed newest first,
pruned to the newest ``keep_last``.

A checkpoint is ``<dir>/step_<N>/``: a ``torch.distributed.checkpoint`` (DCP) directory
(each rank's shard files and DCP's ``.metadata``) plus ``train_state.json`` (the step, the
world size, every rank's data position). A save writes ``<dir>/step_<N>.incomplete/``;
once every rank's files, the metadata and the train state are in it, rank 0 renames it
to ``step_<N>``: the rename is the commit, so a process killed inside a save leaves an
``.incomplete`` directory, never a ``step_<N>`` that looks whole. Resuming takes the
newest complete checkpoint and warns, naming each incomplete one it skipped (a
``step_<N>`` without DCP's metadata, as older code left behind, counts as incomplete).

Fault injection, for the tests that kill a rank inside a save:
``PIPELINES_FAULT_KILL_IN_SAVE=<step>:<rank>`` makes that rank SIGKILL itself after
writing its shard files of that step's save, before DCP's metadata is written.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import warnings
from typing import Any, List, Optional, Tuple

from pipelines.errors import ConfigError

INCOMPLETE_SUFFIX = ".incomplete"
TRAIN_STATE_FILE = "train_state.json"
DCP_METADATA_FILE = ".metadata"
_NAME = re.compile(r"step_(\d+)(" + re.escape(INCOMPLETE_SUFFIX) + r")?")


@dataclasses.dataclass(frozen=True)
class Listed:
    step: int
    path: str
    missing: Optional[str]
    """None for a complete checkpoint, else what makes it incomplete."""


def list_checkpoints(directory: Optional[str]) -> List[Listed]:
    """Every checkpoint directory under ``directory``, complete or not, by step (oldest first)."""
    found = []
    if directory and os.path.isdir(directory):
        for name in os.listdir(directory):
            match = _NAME.fullmatch(name)
            if not match:
                continue
            path = os.path.join(directory, name)
            if match.group(2):
                missing = "never committed (the save did not finish)"
            elif not os.path.exists(os.path.join(path, DCP_METADATA_FILE)):
                missing = f"no {DCP_METADATA_FILE} (DCP did not finish writing it)"
            elif not os.path.exists(os.path.join(path, TRAIN_STATE_FILE)):
                missing = f"no {TRAIN_STATE_FILE} (written before checkpoints recorded their data position)"
            else:
                missing = None
            found.append(Listed(int(match.group(1)), path, missing))
    return sorted(found, key=lambda c: (c.step, c.missing is None))


def newest_complete(directory: Optional[str]) -> Optional[str]:
    complete = [c for c in list_checkpoints(directory) if c.missing is None]
    return complete[-1].path if complete else None


def skipped_for(directory: Optional[str]) -> List[Listed]:
    """The incomplete checkpoints newer than the newest complete one: what a resume skips."""
    listed = list_checkpoints(directory)
    newest = max((c.step for c in listed if c.missing is None), default=-1)
    return [c for c in listed if c.missing is not None and c.step >= newest]


def prune(directory: str, keep_last: int) -> List[str]:
    """Keeps the newest ``keep_last`` complete checkpoints (0: all, and nothing is
    deleted); with a limit, incomplete leftovers go too (a resume never takes them).
    Returns the deleted paths."""
    if not keep_last:
        return []
    listed = list_checkpoints(directory)
    complete = [c for c in listed if c.missing is None]
    doomed = [c.path for c in complete[:-keep_last]] + [c.path for c in listed if c.missing is not None]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _fault_kills_this_save(step: int, rank: int) -> bool:
    spec = os.environ.get("PIPELINES_FAULT_KILL_IN_SAVE", "")
    return bool(spec) and tuple(int(v) for v in spec.split(":")) == (step, rank)


def _storage_writer(path: str, kill_after_writing: bool) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    if not kill_after_writing:
        return FileSystemWriter(path)

    class KilledAfterWriting(FileSystemWriter):
        def write_data(self, plan, planner):
            written = super().write_data(plan, planner)
            written.wait()  # this rank's shard files are on disk; DCP's metadata is not
            os.kill(os.getpid(), signal.SIGKILL)
            return written

    return KilledAfterWriting(path)


def _fsync_directory(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class CheckpointStore:
    """Saves, finds and loads this job's checkpoints in ``directory``; every method but
    ``newest`` is collective over the ranks (``group``: a gloo group for the host-side
    exchanges)."""

    def __init__(self, directory: str, keep_last: int, group: Any) -> None:
        import torch.distributed as dist

        if keep_last < 0:
            raise ValueError(f"keep_last: must be >= 0 (0 keeps every checkpoint), got {keep_last}")
        self.directory, self.keep_last, self.group = directory, keep_last, group
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def path_of(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step}")

    def newest(self, announce: bool = False) -> Optional[str]:
        """The newest complete checkpoint; with ``announce``, warns naming each incomplete
        one skipped for it."""
        if announce:
            for skipped in skipped_for(self.directory):
                warnings.warn(f"checkpoint {skipped.path} skipped: {skipped.missing}", stacklevel=2)
        return newest_complete(self.directory)

    def save(self, state: Any, step: int, data_position: Any) -> str:
        """Writes ``state`` (DCP) and every rank's ``data_position`` (JSON values), then
        commits; returns the checkpoint's path."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        final = self.path_of(step)
        partial = final + INCOMPLETE_SUFFIX
        positions: List[Any] = [None] * self.world_size
        dist.all_gather_object(positions, data_position, group=self.group)
        if self.rank == 0:
            os.makedirs(self.directory, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # the leftovers of a save killed at this step
        dist.barrier(group=self.group)
        dcp.save(state, storage_writer=_storage_writer(partial, _fault_kills_this_save(step, self.rank)))
        if self.rank == 0:  # dcp.save returned: every rank's files and the metadata are written
            with open(os.path.join(partial, TRAIN_STATE_FILE), "w") as f:
                json.dump({"step": step, "world_size": self.world_size, "data_positions": positions}, f)
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(final):  # an earlier run's checkpoint of this step (resume=false)
                shutil.rmtree(final)
            os.rename(partial, final)
            _fsync_directory(self.directory)
            prune(self.directory, self.keep_last)
        dist.barrier(group=self.group)  # no rank goes on (or lists) before the commit
        return final

    def load(self, path: str, state: Any) -> Tuple[int, Any]:
        """Fills ``state`` from the checkpoint at ``path``; returns its step and this rank's
        data position."""
        import torch.distributed.checkpoint as dcp

        with open(os.path.join(path, TRAIN_STATE_FILE)) as f:
            recorded = json.load(f)
        if recorded["world_size"] != self.world_size:
            raise ConfigError(
                f"checkpoint.dir: {path} was written by {recorded['world_size']} ranks and this job has "
                f"{self.world_size}; each rank's data position is its own, so resume with "
                f"{recorded['world_size']} ranks (or start over with checkpoint.resume=false)"
            )
        dcp.load(state, checkpoint_id=path)
        return int(recorded["step"]), recorded["data_positions"][self.rank]
