"""Holds, checkpoint listing and pruning, and the supervisor's decisions, in one process:
the supervisor runs small stand-in jobs (a few lines of Python each) that exit as the
training app does. The real app under faults: test_faults.py."""

import json
import os
import sys
import threading
import time

import pytest
import torch

from pipelines.app.supervise import main as supervise
from pipelines.checkpoints import DCP_METADATA_FILE, TRAIN_STATE_FILE, list_checkpoints, newest_complete, prune
from pipelines.checkpoints import skipped_for
from pipelines.holds import Hold, HealthMonitor, clear_hold, local_tensors, permanent_error_reason, read_hold


def test_hold_file_round_trip_and_exit_codes(tmp_path):
    hold = Hold("data", "data_not_ready", 7, "/ck/step_6", waiting_for=["/d/day_1.tsv"])
    assert hold.write(str(tmp_path)) == str(tmp_path / "HOLD.json")
    assert read_hold(str(tmp_path)) == {"kind": "data", "reason": "data_not_ready", "step": 7,
                                        "last_good_checkpoint": "/ck/step_6", "exception": None,
                                        "waiting_for": ["/d/day_1.tsv"], "rank": 0}  # fmt: skip
    assert [Hold(k, "r", 0).exit_code for k in ("error", "data", "preempted")] == [3, 4, 0]
    assert os.listdir(tmp_path) == ["HOLD.json"]  # no partial file left beside it
    clear_hold(str(tmp_path))
    assert read_hold(str(tmp_path)) is None
    with pytest.raises(ValueError, match="Hold.kind: 'paused'"):
        Hold("paused", "r", 0)


def test_permanent_errors_are_told_from_transient_ones():
    from triton.runtime.errors import OutOfResources

    from pipelines.app.config import ConfigError

    assert permanent_error_reason(torch.OutOfMemoryError("CUDA out of memory")) == "out_of_memory"
    assert permanent_error_reason(RuntimeError("Triton Error [CUDA]: out of memory")) == "out_of_memory"
    assert permanent_error_reason(OutOfResources(300000, 232448, "shared memory")) == "compile_failure"
    try:
        try:
            raise ConfigError("tables.dim: must be >= 1")
        except ConfigError as inner:
            raise RuntimeError("while building the model") from inner
    except RuntimeError as outer:
        assert permanent_error_reason(outer) == "bad_config"  # found through the cause
    assert permanent_error_reason(RuntimeError("Connection closed by peer")) is None
    assert permanent_error_reason(FileNotFoundError("day_1.tsv")) is None


def test_health_monitor_flags_non_finite_losses_and_state():
    monitor = HealthMonitor(torch.device("cpu"), every_steps=2, rows=4)
    monitor.note_loss(torch.tensor(0.5))
    assert monitor.read() == (False, False)
    table, small = torch.zeros(10, 3), torch.zeros(3)
    monitor.sample_state(2, lambda: [table, small])
    assert monitor.read() == (False, False)
    table.fill_(float("inf"))  # every row bad: any 4 sampled rows find it
    monitor.sample_state(3, lambda: [table, small])  # not a check step
    assert monitor.read() == (False, False)
    monitor.sample_state(4, lambda: [table, small])
    assert monitor.read() == (False, True)
    monitor.note_loss(torch.tensor(float("nan")))
    assert monitor.read() == (True, True)
    small[1] = float("nan")
    assert not monitor.all_finite([torch.zeros(5), small]) and monitor.all_finite([torch.zeros(5)])


def test_local_tensors_walks_state_dicts_and_shards():
    class Shard:
        def __init__(self, tensor):
            self.tensor = tensor

    class Sharded:
        def local_shards(self):
            return [Shard(torch.ones(2, 2)), Shard(torch.ones(1, 2))]

    state = {"model": {"w": Sharded(), "b": torch.zeros(3)}, "step": torch.tensor(4), "opt": [torch.ones(1), "lr"]}
    assert sorted(tuple(t.shape) for t in local_tensors(state)) == [(1,), (1, 2), (2, 2), (3,)]  # no int step


def _checkpoint(directory, name, metadata=True, train_state=True):
    path = directory / name
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / DCP_METADATA_FILE).write_bytes(b"meta")
    if train_state:
        (path / TRAIN_STATE_FILE).write_text("{}")
    return str(path)


def test_only_committed_checkpoints_count_and_skipped_ones_are_named(tmp_path):
    good = _checkpoint(tmp_path, "step_4")
    _checkpoint(tmp_path, "step_8.incomplete", metadata=False, train_state=False)
    _checkpoint(tmp_path, "step_12", metadata=False)  # what a process killed inside dcp.save used to leave
    _checkpoint(tmp_path, "step_16", train_state=False)
    (tmp_path / "notes").mkdir()
    listed = list_checkpoints(str(tmp_path))
    assert [(c.step, c.missing is None) for c in listed] == [(4, True), (8, False), (12, False), (16, False)]
    assert newest_complete(str(tmp_path)) == good
    skipped = {c.step: c.missing for c in skipped_for(str(tmp_path))}
    assert set(skipped) == {8, 12, 16} and "never committed" in skipped[8]
    assert ".metadata" in skipped[12] and TRAIN_STATE_FILE in skipped[16]
    assert newest_complete(str(tmp_path / "absent")) is None and list_checkpoints(None) == []


def test_keep_last_prunes_older_checkpoints_and_leftovers(tmp_path):
    for step in (4, 8, 12):
        _checkpoint(tmp_path, f"step_{step}")
    _checkpoint(tmp_path, "step_16.incomplete", metadata=False)
    assert prune(str(tmp_path), keep_last=0) == [] and len(os.listdir(tmp_path)) == 4
    prune(str(tmp_path), keep_last=2)
    assert sorted(os.listdir(tmp_path)) == ["step_12", "step_8"]


# A stand-in for the training job: each launch appends to launches.txt, then exits as the
# next entry of its script says (a hold kind, or a bare exit code).
JOB = """
import json, os, sys
run_dir, script = sys.argv[1], json.loads(sys.argv[2])
with open(os.path.join(run_dir, "launches.txt"), "a") as f:
    f.write("x")
launch = len(open(os.path.join(run_dir, "launches.txt")).read()) - 1
step = script[min(launch, len(script) - 1)]
if isinstance(step, dict):
    hold = {"reason": "r", "step": launch, "last_good_checkpoint": None, "exception": None, "waiting_for": [], **step}
    json.dump(hold, open(os.path.join(run_dir, "HOLD.json"), "w"))
    sys.exit({"error": 3, "data": 4, "preempted": 0}[hold["kind"]])
sys.exit(step)
"""


def _supervise(tmp_path, script, *options):
    log = tmp_path / "decisions.jsonl"
    code = supervise(["--run-dir", str(tmp_path), "--poll-seconds", "0.05", "--poll-max-seconds", "0.1",
                      "--log", str(log), *options, "--", sys.executable, "-c", JOB, str(tmp_path),
                      json.dumps(script)])  # fmt: skip
    launches = len((tmp_path / "launches.txt").read_text())
    decisions = [json.loads(line)["decision"] for line in log.read_text().splitlines()]
    return code, launches, decisions


def test_supervisor_waits_for_data_then_relaunches(tmp_path):
    day = tmp_path / "day_1.tsv"
    appear = threading.Timer(0.3, day.touch)
    appear.start()
    code, launches, decisions = _supervise(tmp_path, [{"kind": "data", "waiting_for": [str(day)]}, 0])
    appear.join()
    assert (code, launches) == (0, 2), decisions
    assert decisions[:3] == ["launch", "exited", "waiting for data"]
    assert decisions[-4:] == ["data ready: relaunching", "launch", "exited", "stop: finished"]
    assert not (tmp_path / "HOLD.json").exists()  # cleared before the relaunch


def test_supervisor_stops_on_an_error_hold(tmp_path, capsys):
    code, launches, decisions = _supervise(tmp_path, [{"kind": "error"}, 0], "--max-restarts", "5")
    assert (code, launches) == (3, 1) and decisions[-1] == "stop: permanent error, not relaunching"
    assert '"kind": "error"' in capsys.readouterr().out  # the hold, printed


def test_supervisor_gives_up_waiting_after_max_wait(tmp_path):
    waits = [{"kind": "data", "waiting_for": [str(tmp_path / "never")]}]
    code, launches, decisions = _supervise(tmp_path, waits, "--max-wait-seconds", "0.2")
    assert (code, launches) == (4, 1) and decisions[-1] == "gave up waiting for data"


@pytest.mark.parametrize("relaunch", [False, True])
def test_supervisor_relaunches_a_preempted_job_only_when_asked(tmp_path, relaunch):
    options = ["--relaunch-preempted"] if relaunch else []
    code, launches, _ = _supervise(tmp_path, [{"kind": "preempted"}, 0], *options)
    assert (code, launches) == (0, 2 if relaunch else 1)


def test_supervisor_restarts_crashes_up_to_the_limit(tmp_path):
    (tmp_path / "recovers").mkdir()
    assert _supervise(tmp_path / "recovers", [1, 0], "--max-restarts", "1")[:2] == (0, 2)
    code, launches, decisions = _supervise(tmp_path, [1], "--max-restarts", "1")
    assert (code, launches) == (1, 2) and decisions[-1] == "stop: crashed"


def test_once_only_translates_the_outcome(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "done").mkdir()
    assert _supervise(tmp_path / "data", [{"kind": "data", "waiting_for": ["/x"]}], "--once")[:2] == (4, 1)
    assert _supervise(tmp_path / "done", [0], "--once")[:2] == (0, 1)
    assert _supervise(tmp_path, [7], "--once", "--max-restarts", "3")[:2] == (7, 1)


def test_supervisor_arguments_are_checked(capsys):
    with pytest.raises(SystemExit):
        supervise(["--poll-seconds", "1"])
    assert "give the launch command after --" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        supervise(["--max-restarts", "-1", "--", "true"])
    assert "--max-restarts: must be >= 0" in capsys.readouterr().err
