"""The host-time probe's stopwatch (``benchmarks/probe_graph_launch``): it adds up each wrapped
function's time per call, returns what the function returns, keeps counting through a raise,
and puts every function back (the probe itself needs CUDA; its GPU run is in results/)."""

import time
import types

import pytest

from tbe_plugin.benchmarks.probe_graph_launch import _Stopwatch


def test_stopwatch_times_wraps_and_restores():
    calls = []

    def slow(x):
        calls.append(x)
        time.sleep(0.01)
        return 2 * x

    def fails():
        time.sleep(0.005)
        raise RuntimeError("boom")

    owner = types.SimpleNamespace(__name__="owner", slow=slow, fails=fails)
    watch = _Stopwatch([(owner, "slow"), (owner, "fails")])
    assert owner.slow is not slow and owner.slow(3) == 6 and owner.slow(4) == 8 and calls == [3, 4]
    with pytest.raises(RuntimeError, match="boom"):
        owner.fails()
    assert watch.totals["owner.slow"] >= 2 * 10_000 * 0.9  # us: two calls of >= 10 ms
    assert watch.totals["owner.fails"] >= 5_000 * 0.9
    watch.restore()
    assert owner.slow is slow and owner.fails is fails


def test_stopwatch_on_a_class_method():
    class Graph:
        def replay(self):
            return "replayed"

    original = Graph.replay
    watch = _Stopwatch([(Graph, "replay")])
    assert Graph().replay() == "replayed" and watch.totals["Graph.replay"] > 0
    watch.restore()
    assert Graph.replay is original
