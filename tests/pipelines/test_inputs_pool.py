"""The autoscaled reader pool: the controller's decisions on a scripted sequence of
observations (exact), and real reader processes behind real pipes: every partition once and
in order (a killed reader's partition read by another), and a trainer whose consumption steps
up 4x and back down growing the pool and shrinking it back to its minimum."""

import json
import os
import signal
import time

import pytest

from pipelines.bench.inputs import drive_trainer
from pipelines.inputs.graph import ctr_graph
from pipelines.inputs.pool import ReaderPool
from pipelines.inputs.raw import SyntheticRawLog
from pipelines.inputs.reader import NoSig, SigReader, StoreClient
from pipelines.inputs.scaling import ScalingController, ScalingPolicy
from pipelines.inputs.store import PartStore


def test_controller_decisions_on_a_scripted_load():
    policy = ScalingPolicy(min_readers=1, max_readers=5, initial_readers=1, step=2, cooldown_s=1.0, low_water=0.25,
                           high_water=0.75, busy_above=0.8, idle_below=0.5)  # fmt: skip
    controller = ScalingController(policy)
    script = [  # time, queue depth, utilization, size -> action, size after, reason contains
        (0.0, 0.0, 0.9, 1, "grow", 3, "queue 0.00 <= 0.25"),
        (0.5, 0.0, 1.0, 3, "hold", 3, "cooldown (0.50 s left; wanted grow)"),
        (1.0, 0.25, 0.8, 3, "grow", 5, "busy 0.80 >= 0.8"),  # the bounds are inclusive
        (2.5, 0.0, 1.0, 5, "hold", 5, "within bounds"),  # at the maximum
        (2.6, 0.5, 0.3, 5, "hold", 5, "within bounds"),  # the queue is neither low nor full
        (3.0, 1.0, 0.1, 5, "shrink", 3, "queue 1.00 >= 0.75"),
        (3.5, 1.0, 0.1, 3, "hold", 3, "wanted shrink"),
        (4.0, 0.75, 0.5, 3, "shrink", 1, "busy 0.50 <= 0.5"),
        (6.0, 1.0, 0.0, 1, "hold", 1, "within bounds"),  # at the minimum
        (6.1, 0.1, 0.5, 1, "hold", 1, "within bounds"),  # a low queue with idle readers: not theirs to fix
        (6.2, 0.0, 0.95, 1, "grow", 3, "queue"),
    ]
    for t, depth, utilization, size, action, after, reason in script:
        decision = controller.decide(t, depth, utilization, size)
        assert (decision.action, decision.size_after) == (action, after), (t, decision)
        assert reason in decision.reason and decision.size_before == size


@pytest.mark.parametrize("fields, named", [({"min_readers": 0}, "min_readers"), ({"max_readers": 0}, "max_readers"),
                                           ({"initial_readers": 9}, "initial_readers"), ({"step": 0}, "step"),
                                           ({"low_water": 0.9}, "low_water"), ({"busy_above": 0.1}, "idle_below")])  # fmt: skip
def test_a_bad_policy_fails_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=f"^{named}:"):
        ScalingPolicy(**fields)


@pytest.fixture
def job(tmp_path):
    raw = SyntheticRawLog(str(tmp_path / "raw"), rows=1000, seed=2, users=100)
    graph = ctr_graph(num_sparse=6, rows=500)
    store = PartStore(str(tmp_path / "store"))
    spec = {"graph": graph.to_json(), "raw": raw.spec(), "sig": {"kind": "store", "url": store.url}}
    return raw, graph, store, spec


def test_every_partition_once_in_order_even_when_a_reader_dies(job):
    raw, graph, store, spec = job
    policy = ScalingPolicy(min_readers=2, max_readers=2, initial_readers=2, queue_capacity=3, interval_s=0.1)
    got = []
    with ReaderPool(spec, range(8), policy) as pool:
        for _ in range(2):
            got.append(pool.get())
        victim = pool.reader_pids[0]
        os.kill(victim, signal.SIGKILL)
        while (item := pool.get()) is not None:
            got.append(item)
        assert victim not in pool.reader_pids and len(pool.reader_pids) == 2  # replaced
    assert [p for p, _ in got] == list(range(8))
    baseline = SigReader(graph, raw, NoSig())
    assert all(table.equals(baseline.read(p)) for p, table in got)
    assert pool.stats.partitions >= 8 and len(store.manifest()) == 8


def test_a_failing_partition_raises_in_the_trainer_naming_it(job):
    from pipelines.inputs.pool import ReaderFailed
    from pipelines.inputs.raw import TsvRawLog

    raw, graph, store, spec = job
    good = raw.ensure(0)
    bad = os.path.join(os.path.dirname(good), "bad.tsv")
    open(bad, "w").write("not\ta criteo line\n")
    spec = dict(spec, raw=TsvRawLog([good, bad]).spec())
    with ReaderPool(spec, range(2), ScalingPolicy(max_readers=1, interval_s=0.1)) as pool:
        assert pool.get()[0] == 0
        with pytest.raises(ReaderFailed, match="partition 1: RawLogError: .*bad.tsv"):
            pool.get()


def test_the_pool_follows_a_4x_step_in_consumption_and_back(job, tmp_path):
    """Readers hit SIG (the partitions are materialized first) behind a 0.1 s round trip
    (``latency_s``), so one reader gives at most 10 partitions a second however busy the
    machine's cores are. The slow phases take one every 0.3 s (one reader keeps up, idle
    most of the time), the fast phase 4x as often (one reader cannot): the pool grows; then
    slow again: it shrinks back to its minimum. Every partition comes once, in order; every
    decision, holds included, is in the decisions file."""
    raw, graph, store, spec = job
    warm = SigReader(graph, raw, StoreClient(store))
    for p in range(4):
        warm.read(p)
    slow_rate = 1 / 0.3
    policy = ScalingPolicy(min_readers=1, max_readers=3, initial_readers=1, step=1, cooldown_s=0.8, interval_s=0.1,
                           queue_capacity=4)  # fmt: skip
    decisions_file = str(tmp_path / "decisions.jsonl")
    pool = ReaderPool(dict(spec, latency_s=0.1), (i % 4 for i in range(10**6)), policy, decisions_file=decisions_file)

    def slow_until_minimum(seconds: float) -> list:
        trace, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline and not (pool.size == policy.min_readers and len(pool.reader_pids) == 1):
            trace += drive_trainer(pool, [("slow", 0.5, slow_rate)])
        return trace

    try:
        trace = slow_until_minimum(20.0)  # it may grow while the first reader starts and fills the queue
        assert pool.size == policy.min_readers, [d for d in pool.decisions if d.action != "hold"]
        trace += drive_trainer(pool, [("fast", 4.0, 4 * slow_rate)])
        fast_from = next(r["asked"] for r in trace if r["phase"] == "fast")
        grown = [d for d in pool.decisions if d.action == "grow" and d.time >= fast_from]
        assert grown, pool.decisions
        assert all(d.depth <= policy.low_water and d.utilization >= policy.busy_above for d in grown)
        trace += slow_until_minimum(20.0)
        assert pool.size == policy.min_readers and len(pool.reader_pids) == 1, pool.decisions
        assert len(pool.standby_pids) == policy.standby
    finally:
        pool.close()
    shrunk = [d for d in pool.decisions if d.action == "shrink" and d.time > grown[0].time]
    assert shrunk and all(d.depth >= policy.high_water and d.utilization <= policy.idle_below for d in shrunk)
    changes = [d.time for d in pool.decisions if d.action != "hold"]
    assert all(b - a >= policy.cooldown_s for a, b in zip(changes, changes[1:]))  # the cooldown held
    taken = [r["partition"] for r in trace]
    assert taken == [i % 4 for i in range(len(taken))]  # in order, none lost, none twice
    logged = [json.loads(line) for line in open(decisions_file)]
    assert logged == [d.to_json() for d in pool.decisions]
    assert pool.stats.hit_rate == 1.0 and pool.stats.raw_parses == 0


def test_ray_backend_and_bad_specs_are_refused_naming_them(job):
    raw, graph, store, spec = job
    with pytest.raises(ValueError, match="^backend: 'ray'.*use backend: process"):
        ScalingPolicy(backend="ray")
    with pytest.raises(ValueError, match="^backend: 'threads' is not one of process, ray"):
        ScalingPolicy(backend="threads")
    with pytest.raises(ValueError, match="latency_s"):
        ReaderPool(dict(spec, latency_s=-1), range(1), ScalingPolicy())
    with pytest.raises(ValueError, match="sig.kind 'nfs'"):
        ReaderPool(dict(spec, sig={"kind": "nfs"}), range(1), ScalingPolicy())


def test_a_grow_puts_the_standby_reader_to_work_and_starts_another(job):
    """The controller is kept out of it (it looks once an hour); its decisions are applied
    by hand to a pool of real processes."""
    from pipelines.inputs.scaling import Decision

    raw, graph, store, spec = job
    policy = ScalingPolicy(min_readers=1, max_readers=2, initial_readers=1, standby=1, interval_s=3600, queue_capacity=2)
    with ReaderPool(spec, range(6), policy) as pool:
        assert pool.get()[0] == 0  # the first reader is up
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(r.ready for r in pool._readers):
            time.sleep(0.05)
        [standby], [first] = pool.standby_pids, pool.reader_pids
        with pool._cond:
            pool._apply(Decision(0.0, "grow", 1, 2, 0.0, 1.0, "by hand"))
        assert pool.size == 2 and sorted(pool.reader_pids) == sorted([first, standby])
        [replacement] = pool.standby_pids
        assert replacement not in (first, standby)
        with pool._cond:
            pool._apply(Decision(1.0, "shrink", 2, 1, 1.0, 0.0, "by hand"))  # standby is full: one retires
        assert pool.size == 1 and pool.standby_pids == [replacement]
        got = [pool.get()[0] for _ in range(5)]
        assert pool.get() is None and got == [1, 2, 3, 4, 5]
        deadline = time.monotonic() + 30  # the retired process exits once told to stop
        while time.monotonic() < deadline and len(pool.reader_pids) > 1:
            time.sleep(0.05)
        assert len(pool.reader_pids) == 1 and [d.reason for d in pool.decisions] == ["by hand", "by hand"]
