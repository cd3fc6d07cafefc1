"""The training app on ``data=sig``, end to end on CPU: ``python -m pipelines.app.train data=sig``
trains through an autoscaled pool of reader processes, its readers publish what they computed
(a later job over the same store hits every stored node without parsing the raw log) and log
every scaling decision; ``data.sig.readers.backend=ray`` fails while the config is validated,
naming the key."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# FBGEMM's CPU kernels: the app's data path is under test here, not the Triton backend
# (which the interpreter runs many times slower).
OVERRIDES = ["data=sig", "backend=fbgemm", "steps=12", "eval_batches=2", "data.batch_size=32",
             "logging.progress_bar=false", "data.sig.decisions_file='decisions-{rank}.jsonl'"]  # fmt: skip


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipelines.app.config import register, validate

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return validate(hydra_compose(config_name="config", overrides=list(overrides)))


@pytest.fixture(scope="module")
def app_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("sig_app")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-m", "pipelines.app.train", *OVERRIDES], cwd=work, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("[rank 0] metrics "))
    return work, json.loads(line[len("[rank 0] metrics ") :])


def test_the_app_trains_on_data_sig(app_run):
    work, metrics = app_run
    assert metrics["steps"] == 12
    assert math.isfinite(metrics["first_loss"]) and metrics["last_loss"] < metrics["first_loss"], metrics
    assert 0.0 <= metrics["auc"] <= 1.0 and metrics["log_loss"] > 0
    decisions = [json.loads(line) for line in open(work / "decisions-0.jsonl")]
    assert decisions and {d["action"] for d in decisions} <= {"grow", "shrink", "hold"}


def test_the_apps_readers_published_for_the_next_job(app_run, monkeypatch):
    from pipelines.inputs.batches import app_graph, app_raw_log
    from pipelines.inputs.reader import NoSig, SigReader, StoreClient
    from pipelines.inputs.store import PartStore

    work, _ = app_run
    cfg = compose(*OVERRIDES)
    monkeypatch.chdir(work)  # the config's store and raw log are relative to the app's directory
    store = PartStore(cfg.data.sig.store)
    graph, raw = app_graph(cfg), app_raw_log(cfg.data.sig)
    train, evaluation = 0, cfg.data.sig.train_partitions  # the first partition of each stream
    committed = {r["partition"] for r in store.manifest()}
    assert len(committed) >= 2
    later_job = SigReader(graph, raw, StoreClient(store), publish=False)
    for partition in (train, evaluation):
        assert later_job.read(partition).equals(SigReader(graph, raw, NoSig(), publish=False).read(partition))
    s = later_job.stats
    assert (s.hit_rate, s.misses, s.raw_parses) == (1.0, 0, 0), s


def test_a_ray_backend_fails_validation_naming_the_key():
    from pipelines.app.config import ConfigError

    with pytest.raises(ConfigError, match=r"data\.sig\.readers\.backend: 'ray'"):
        compose(*OVERRIDES, "data.sig.readers.backend=ray")
    assert compose(*OVERRIDES).data.sig.readers.backend == "process"
