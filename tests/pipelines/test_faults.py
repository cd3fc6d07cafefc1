"""Faults tried on real processes (torchrun, 2 CPU ranks, gloo): a rank killed inside a
checkpoint save, a run whose loss turns NaN, data that appears only after the job started.
Each either ends exactly where a run without the fault ends, or holds leaving the last good
checkpoint as it was. (SIGTERM mid-run: test_train_app.) The fbgemm backend keeps them fast:
what they test is the app, not the kernels."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from tbe_plugin.torchrec.process_group import free_port
from tests.pipelines.test_criteo import write_criteo
from tests.pipelines.test_train_app import ROOT, SHORT, metrics, run_app

PERIODIC = ["backend=fbgemm", "checkpoint.every_steps=4"]
STEP_4_FILES = ("__0_0.distcp", "__1_0.distcp", "train_state.json")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    result = metrics(run_app(directory, *PERIODIC, f"checkpoint.dir={directory / 'ck'}"))
    return result, directory / "ck"


def test_rank_killed_inside_a_save_resumes_from_the_previous_checkpoint(uninterrupted, tmp_path):
    """Rank 1 SIGKILLs itself after writing its shard files of step 8's save: torchrun stops
    the job, step 8 stays uncommitted; the rerun warns naming it, resumes from step 4 and ends
    with the uninterrupted run's weights and metrics."""
    expected, _ = uninterrupted
    checkpoints = tmp_path / "ck"
    killed = run_app(tmp_path, *PERIODIC, f"checkpoint.dir={checkpoints}", PIPELINES_FAULT_KILL_IN_SAVE="8:1")
    assert killed.returncode != 0 and "[rank 0] metrics" not in killed.stdout, killed.stdout[-2000:]
    assert sorted(os.listdir(checkpoints)) == ["step_4", "step_8.incomplete"]
    assert (checkpoints / "step_8.incomplete" / "__1_0.distcp").exists()  # killed after writing, before the commit
    assert not (checkpoints / "step_8.incomplete" / ".metadata").exists()
    resumed = run_app(tmp_path, *PERIODIC, f"checkpoint.dir={checkpoints}")
    assert f"{checkpoints / 'step_8.incomplete'} skipped: never committed" in resumed.stderr, resumed.stderr[-2000:]
    assert f"resumed from {checkpoints / 'step_4'} at step 4" in resumed.stdout
    got = metrics(resumed)
    for key in ("steps", "weights_checksum", "auc", "log_loss"):
        assert got[key] == expected[key], (key, got, expected)
    assert sorted(os.listdir(checkpoints)) == ["step_12", "step_4", "step_8"]  # the rerun's own step 8 replaced it


def test_non_finite_loss_holds_with_exit_code_3(uninterrupted, tmp_path):
    """A dense weight turned NaN after step 5 (scripts/train.sh, as users launch): the NaN
    loss of step 6 is found when the losses are read, before step 8's save; no checkpoint of
    the bad state, HOLD.json names the reason, the step and step 4, the exit code is 3 and
    step 4 is byte for byte the uninterrupted run's."""
    _, good_checkpoints = uninterrupted
    checkpoints = tmp_path / "ck"
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT), NPROC_PER_NODE="2",
               MASTER_PORT=str(free_port()), RUN_DIR=str(tmp_path), PIPELINES_FAULT_NAN_AT_STEP="5")  # fmt: skip
    command = ["bash", str(ROOT / "scripts" / "train.sh"), *SHORT, *PERIODIC, f"checkpoint.dir={checkpoints}"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "[rank 0] metrics" not in result.stdout
    hold = json.loads((tmp_path / "HOLD.json").read_text())
    assert (hold["kind"], hold["reason"], hold["step"]) == ("error", "non_finite_loss", 6), hold
    assert hold["last_good_checkpoint"] == str(checkpoints / "step_4")
    assert os.listdir(checkpoints) == ["step_4"]
    for name in STEP_4_FILES:
        assert (checkpoints / "step_4" / name).read_bytes() == (good_checkpoints / "step_4" / name).read_bytes(), name


def test_a_bad_configuration_found_after_start_holds(uninterrupted, tmp_path):
    """Resuming 2 ranks' checkpoints with 1 rank is found only once the job runs (each rank's
    data position is its own): an error hold naming it, the checkpoints left alone."""
    _, checkpoints = uninterrupted
    before = sorted(os.listdir(checkpoints))
    result = run_app(tmp_path, *PERIODIC, f"checkpoint.dir={checkpoints}", nproc=1)
    assert result.returncode != 0 and "[rank 0] metrics" not in result.stdout
    hold = json.loads((tmp_path / "HOLD.json").read_text())
    assert (hold["kind"], hold["reason"], hold["step"]) == ("error", "bad_config", None), hold
    assert "written by 2 ranks and this job has 1" in hold["exception"]
    assert hold["last_good_checkpoint"] == str(checkpoints / "step_12")
    assert sorted(os.listdir(checkpoints)) == before


def _criteo_days(directory, ready: bool):
    """Two Criteo day files; day 0's 202 lines end inside a batch of 32, so a batch spans
    the two files. ``ready=False`` leaves day 1 and its marker out (written later). The
    evaluation reads a held-out file beside them (``held_out.tsv``)."""
    directory.mkdir()
    days = [directory / "day_0.tsv", directory / "day_1.tsv"]
    write_criteo(days[0], 202, seed=0)
    write_criteo(directory / "held_out.tsv", 64, seed=2)
    (directory / "held_out.tsv._SUCCESS").touch()
    (directory / "day_0.tsv._SUCCESS").touch()
    if ready:
        _write_day_1(days[1])
    return days


def _write_day_1(path):
    write_criteo(f"{path}.partial", 600, seed=1)
    os.rename(f"{path}.partial", path)
    open(f"{path}._SUCCESS", "w").close()


def _criteo_job(days, checkpoints):
    return [f"data.criteo_paths=[{days[0]},{days[1]}]", f"data.criteo_eval_paths=[{days[0].parent / 'held_out.tsv'}]",
            "data=criteo", "data.batch_size=32", "tables.num_tables=26",
            "data.criteo_ready_suffix=._SUCCESS", "steps=10", "eval_batches=1", "backend=fbgemm",
            f"checkpoint.dir={checkpoints}"]  # fmt: skip


def test_data_that_appears_later_resumes_under_the_supervisor(tmp_path):
    """The second day file (and its _SUCCESS marker) appears only once the job has held for
    it: the job saves, writes HOLD.json (kind data, waiting for them) and exits 4; the
    supervisor polls, relaunches, the job resumes at the saved file offset and ends with the
    weights of a run that had both files from the start."""
    reference_days = _criteo_days(tmp_path / "ready", ready=True)
    expected = metrics(run_app(tmp_path / "ready", *_criteo_job(reference_days, tmp_path / "ready" / "ck")))
    run_dir = tmp_path / "waits"
    days = _criteo_days(run_dir, ready=False)
    waited_for = []

    def write_day_1_once_held():
        deadline = time.time() + 600
        while not (run_dir / "HOLD.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        waited_for.extend(json.loads((run_dir / "HOLD.json").read_text())["waiting_for"])
        _write_day_1(days[1])

    writer = threading.Thread(target=write_day_1_once_held, daemon=True)
    writer.start()
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
              "pipelines.app.train", *SHORT, *_criteo_job(days, run_dir / "ck")]  # fmt: skip
    command = [sys.executable, "-m", "pipelines.app.supervise", "--poll-seconds", "0.5", "--poll-max-seconds", "1",
               "--log", str(run_dir / "supervise.jsonl"), "--", *launch]  # fmt: skip
    result = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=900)
    writer.join(timeout=5)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert waited_for == [str(days[1]), f"{days[1]}._SUCCESS"]
    decisions = [json.loads(line)["decision"] for line in (run_dir / "supervise.jsonl").read_text().splitlines()]
    assert decisions[:2] == ["launch", "exited"] and "data ready: relaunching" in decisions, decisions
    assert decisions[-1] == "stop: finished", decisions
    held_at = int(result.stdout.split("data not ready after step ")[1].split(":")[0])
    assert 0 < held_at < 10 and f"at step {held_at}" in result.stdout  # it trained, saved, and resumed there
    got = metrics(result)
    for key in ("steps", "weights_checksum", "auc", "log_loss"):
        assert got[key] == expected[key], (key, got, expected)
    assert not (run_dir / "HOLD.json").exists()  # the relaunched job cleared it
    shutil.rmtree(run_dir / "ck")
