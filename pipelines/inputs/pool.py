"""An autoscaled pool of reader processes feeding the trainer's queue.

``ReaderPool(spec, partitions, policy)`` starts reader processes (``SigReader``s built from
``spec``, JSON: graph, raw log, SIG client), hands each an ordered partition to read when
the trainer's queue (results waiting plus partitions being read) has room, and gives the
trainer the tables in partition order (``get``). Every ``policy.interval_s`` it shows the
``ScalingController`` the queue's depth and the readers' utilization (the share of the last
interval they spent on a partition) and starts or stops ``step`` readers as decided; every
decision is kept (``decisions``), logged, and written as a JSON line to ``decisions_file``.
``policy.standby`` more readers wait started and idle, so that a grow takes effect as soon as
it is decided rather than after processes start. ``timeline`` samples depth, size and
utilization; ``dry_spells`` are the times the trainer waited on an empty queue. A reader
that dies has its partition read by another (and is replaced, standby ones included).

A reader process exchanges frames of JSON and Arrow IPC with the pool over its stdin and
stdout (``pipelines.inputs.wire``): no pickle. It starts with a bare ``pipelines`` package
(its path, none of its ``__init__``), so it imports pyarrow, numpy and fsspec, not torch.
Readers run as processes on this machine (``ScalingPolicy.backend`` ``process``); Ray actors
(readers on other machines, ``ray``) are not built, and the policy refuses them by name.
"""

import collections
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any, Deque, Dict, Iterable, List, Optional, Tuple

from pipelines.inputs.graph import TransformGraph
from pipelines.inputs.raw import raw_log_from_spec
from pipelines.inputs.reader import NoSig, ReaderStats, SigReader, StoreClient
from pipelines.inputs.scaling import Decision, ScalingController, ScalingPolicy
from pipelines.inputs.store import PartStore
from pipelines.inputs.wire import bytes_table, read_frame, table_bytes, write_frame

log = logging.getLogger(__name__)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOTSTRAP = (
    "import importlib, os, sys, types\n"
    "root, target = sys.argv[1], sys.argv[2]\n"
    "sys.path.insert(0, root)\n"
    "package = types.ModuleType('pipelines')\n"
    "package.__path__ = [os.path.join(root, 'pipelines')]\n"
    "sys.modules['pipelines'] = package\n"
    "module, _, function = target.partition(':')\n"
    "getattr(importlib.import_module(module), function)(*sys.argv[3:])\n"
)


def light_command(target: str, *args: str) -> List[str]:
    """The command line of a process that calls ``target`` (``module:function``) with
    ``args`` under a bare ``pipelines`` package: none of ``pipelines/__init__``'s imports
    (torch, TorchRec: seconds per process) run, only the modules ``target`` needs."""
    return [sys.executable, "-c", _BOOTSTRAP, _ROOT, target, *args]


def reader_from_spec(spec: Dict[str, Any]) -> SigReader:
    """The ``SigReader`` a JSON spec describes: ``graph`` (``TransformGraph.to_json``), ``raw``
    (a raw log's ``spec()``), ``sig`` (``{"kind": "store", "url"}``, ``{"kind": "service",
    "url"}`` or ``{"kind": "none"}``), ``publish`` and ``latency_s`` (see ``reader_main``)."""
    sig = spec["sig"]
    if sig["kind"] == "store":
        client: Any = StoreClient(PartStore(sig["url"]))
    elif sig["kind"] == "service":
        from pipelines.inputs.service import HttpClient

        client = HttpClient(sig["url"])
    elif sig["kind"] == "none":
        client = NoSig()
    else:
        raise ValueError(f"sig.kind {sig['kind']!r}: not store, service or none")
    graph = TransformGraph.from_json(spec["graph"])
    return SigReader(graph, raw_log_from_spec(spec["raw"]), client, publish=bool(spec.get("publish", True)))


def reader_main(spec_json: str) -> None:
    """A reader process: reads the partitions its stdin asks for, answers on its stdout.
    The spec's ``latency_s`` (default 0) is slept before each read: a remote log's or store's
    round trip, which tests and the benchmark add so that a reader's throughput is set by
    it rather than by how many of a shared machine's cores are free."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = json.loads(spec_json)
    latency_s = float(spec.get("latency_s", 0.0))
    if latency_s < 0:
        raise ValueError(f"latency_s: must be >= 0, got {latency_s}")
    reader = reader_from_spec(spec)
    replies, requests = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # a stray print must not land inside a frame
    write_frame(replies, {"ready": True, "pid": os.getpid()})
    while True:
        frame = read_frame(requests)
        if frame is None or frame[0].get("op") == "stop":
            return
        task, partition = frame[0]["task"], int(frame[0]["partition"])
        try:
            time.sleep(latency_s)
            table = reader.read(partition)
        except Exception as error:  # reported to the trainer, which raises it there
            write_frame(replies, {"task": task, "partition": partition, "error": f"{type(error).__name__}: {error}"})
            continue
        write_frame(replies, {"task": task, "partition": partition, "stats": reader.last_stats.to_json()},
                    table_bytes(table))  # fmt: skip


@dataclasses.dataclass
class _Reader:
    process: subprocess.Popen
    ready: bool = False
    retiring: bool = False
    standby: bool = False  # started, given no partitions until a grow puts it to work
    task: Optional[Tuple[int, int]] = None  # (sequence number, partition)
    busy_since: float = 0.0
    busy_s: float = 0.0  # in the current interval


class ReaderFailed(RuntimeError):
    """A reader process could not read a partition; the message is its error."""


class ReaderPool:
    """See the module docstring. ``partitions`` may be endless; ``get`` returns None after
    the last one."""

    def __init__(
        self, spec: Dict[str, Any], partitions: Iterable[int], policy: ScalingPolicy,
        decisions_file: Optional[str] = None,
    ) -> None:  # fmt: skip
        if float(spec.get("latency_s", 0.0)) < 0:
            raise ValueError(f"spec latency_s: must be >= 0, got {spec['latency_s']}")
        if policy.backend != "process":
            raise ValueError(f"policy.backend {policy.backend!r}: this pool runs reader processes only")
        reader_from_spec(spec)  # a bad spec fails here, naming its field, not in every reader started
        self.spec_json, self.policy = json.dumps(spec), policy
        self.controller = ScalingController(policy)
        self.decisions: List[Decision] = []
        self.timeline: List[Dict[str, Any]] = []
        self.dry_spells: List[Tuple[float, float]] = []
        self.stats = ReaderStats()
        self._decisions_file = open(decisions_file, "a") if decisions_file else None
        self._tasks = iter(partitions)
        self._retry: Deque[Tuple[int, int]] = collections.deque()
        self._results: Dict[int, Tuple[int, Any, Optional[str]]] = {}
        self._readers: List[_Reader] = []
        self._cond = threading.Condition()
        self._next_task = self._next_out = 0
        self._exhausted = self._closed = False
        self.started = self._window_start = time.monotonic()  # times are reported since then
        self._threads: List[threading.Thread] = []
        with self._cond:
            for _ in range(policy.initial_readers):
                self._spawn()
            self._top_up_standby()
        self._control = threading.Thread(target=self._control_loop, name="sig-pool-controller", daemon=True)
        self._control.start()

    # -- reader processes (called with the lock held) --
    def _spawn(self, standby: bool = False) -> None:
        process = subprocess.Popen(light_command("pipelines.inputs.pool:reader_main", self.spec_json),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        reader = _Reader(process, standby=standby)
        self._readers.append(reader)
        thread = threading.Thread(target=self._listen, args=(reader,), name=f"sig-reader-{process.pid}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _send(self, reader: _Reader, header: Dict[str, Any]) -> bool:
        try:
            write_frame(reader.process.stdin, header)
            return True
        except (BrokenPipeError, OSError, ValueError):  # it died (or its pipe was closed): its listener cleans up
            return False

    def _top_up_standby(self) -> None:
        for _ in range(self.policy.standby - sum(r.standby for r in self._readers)):
            self._spawn(standby=True)

    @property
    def reader_pids(self) -> List[int]:
        """The process ids of the pool's readers (running, starting or retiring; not standby)."""
        with self._cond:
            return [r.process.pid for r in self._readers if not r.standby]

    @property
    def standby_pids(self) -> List[int]:
        """The process ids of the standby readers."""
        with self._cond:
            return [r.process.pid for r in self._readers if r.standby]

    @property
    def depth(self) -> int:
        """Partitions read and waiting for the trainer (in or out of order)."""
        with self._cond:
            return len(self._results)

    @property
    def size(self) -> int:
        """Readers counted by the controller (starting or running; not retiring, not standby)."""
        return sum(not r.retiring and not r.standby for r in self._readers)

    def _in_flight(self) -> int:
        return sum(r.task is not None for r in self._readers)

    def _dispatch(self) -> None:
        """Gives idle readers partitions while the queue has room."""
        if self._closed:
            return
        for reader in self._readers:
            if not reader.ready or reader.task is not None or reader.standby:
                continue
            if reader.retiring:
                reader.ready = False  # stopped: its listener removes it when it exits
                self._send(reader, {"op": "stop"})
                continue
            if len(self._results) + self._in_flight() >= self.policy.queue_capacity:
                return
            if self._retry:
                task = self._retry.popleft()
            elif not self._exhausted:
                try:
                    task = (self._next_task, int(next(self._tasks)))
                    self._next_task += 1
                except StopIteration:
                    self._exhausted = True
                    return
            else:
                return
            reader.task, reader.busy_since = task, time.monotonic()
            if not self._send(reader, {"op": "read", "task": task[0], "partition": task[1]}):
                reader.task = None
                self._retry.appendleft(task)

    def _listen(self, reader: _Reader) -> None:
        """One reader's replies, until its process ends."""
        while True:
            table = None
            try:
                frame = read_frame(reader.process.stdout)
                if frame is not None and "task" in frame[0] and not frame[0].get("error"):
                    # Decoded and validated outside the lock: the trainer and the other
                    # readers' listeners do not wait on it.
                    table = bytes_table(frame[1])
            except (EOFError, OSError, ValueError) as error:  # WireError is a ValueError
                log.warning("reader %d: broken reply (%s); stopping it", reader.process.pid, error)
                reader.process.kill()  # its partition goes to another reader
                frame = None
            with self._cond:
                if frame is None:
                    self._reader_ended(reader)
                    self._cond.notify_all()
                    return
                header, payload = frame
                if header.get("ready"):
                    reader.ready = True
                else:
                    now = time.monotonic()
                    reader.busy_s += now - max(reader.busy_since, self._window_start)
                    reader.task = None
                    error = header.get("error")
                    if not error:
                        self.stats.add(ReaderStats.from_json(header["stats"]))
                    self._results[int(header["task"])] = (int(header["partition"]), table, error)
                self._dispatch()
                self._cond.notify_all()

    def _reader_ended(self, reader: _Reader) -> None:
        self._readers.remove(reader)
        reader.process.wait()
        if reader.task is not None:
            self._retry.appendleft(reader.task)
        if not self._closed and not reader.retiring:
            log.warning("reader %d exited (code %s) unasked; replacing it", reader.process.pid, reader.process.returncode)
        if not self._closed:
            if self.size < self.policy.min_readers:
                self._spawn()
            self._top_up_standby()
        self._dispatch()

    # -- the controller --
    def _utilization(self, now: float) -> float:
        running = [r for r in self._readers if not r.standby and (r.ready or r.task is not None)]
        if not running or now <= self._window_start:
            return 0.0
        busy = sum(r.busy_s + (now - max(r.busy_since, self._window_start) if r.task else 0.0) for r in running)
        return min(1.0, busy / ((now - self._window_start) * len(running)))

    def _control_loop(self) -> None:
        while True:
            time.sleep(self.policy.interval_s)
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                utilization, depth = self._utilization(now), len(self._results)
                for reader in self._readers:
                    reader.busy_s = 0.0
                self._window_start = now
                size = self.size
                decision = self.controller.decide(now - self.started, depth / self.policy.queue_capacity, utilization, size)
                self._apply(decision)
                self.timeline.append({"t": now - self.started, "depth": depth, "size": size, "utilization": utilization,
                                      "handed_out": self._next_out})  # fmt: skip

    def _apply(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if self._decisions_file:
            self._decisions_file.write(json.dumps(decision.to_json()) + "\n")
            self._decisions_file.flush()
        if decision.action == "hold":
            return
        log.info("reader pool: %s %d -> %d (%s)", decision.action, decision.size_before, decision.size_after,
                 decision.reason)  # fmt: skip
        change = decision.size_after - decision.size_before
        if change > 0:  # standby readers (ready ones first) go to work; new processes make up the rest
            for reader in sorted((r for r in self._readers if r.standby), key=lambda r: not r.ready)[:change]:
                reader.standby = False
                change -= 1
            for _ in range(change):
                self._spawn()
            self._top_up_standby()
        else:  # idle readers leave first, busy ones after their partition; to standby while it has room
            leaving = sorted((r for r in self._readers if not r.retiring and not r.standby), key=lambda r: r.task is not None)
            room = self.policy.standby - sum(r.standby for r in self._readers)
            for k, reader in enumerate(leaving[:-change]):
                if k < room and reader.task is None:
                    reader.standby = True
                else:
                    reader.retiring = True
        self._dispatch()

    # -- the trainer's side --
    def get(self) -> Optional[Tuple[int, Any]]:
        """The next (partition, table) in order, waiting for it; None after the last."""
        with self._cond:
            self._dispatch()
            waited_from = None
            while self._next_out not in self._results:
                if self._exhausted and not self._retry and self._in_flight() == 0 and not self._results:
                    return None
                if self._closed:
                    raise RuntimeError("reader pool: closed")
                waited_from = waited_from or time.monotonic()
                self._cond.wait(timeout=1.0)
            if waited_from is not None:
                self.dry_spells.append((waited_from - self.started, time.monotonic() - self.started))
            partition, table, error = self._results.pop(self._next_out)
            self._next_out += 1
            self._dispatch()
            if error:
                raise ReaderFailed(f"reader failed on partition {partition}: {error}")
            return partition, table

    def close(self) -> None:
        """Stops every reader (each finishes its partition) and the controller."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            readers = list(self._readers)
            for reader in readers:
                self._send(reader, {"op": "stop"})
                try:
                    reader.process.stdin.close()
                except OSError:
                    pass
        for reader in readers:
            try:
                reader.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                reader.process.kill()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._decisions_file:
            self._decisions_file.close()

    def __enter__(self) -> "ReaderPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
