"""The Hydra configs: every group option and experiment composes and validates; bad
overrides fail naming the key, before anything else runs."""

from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[1] / "conf"


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipelines.app.config import register, validate

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(hydra_compose(config_name="config", overrides=list(overrides)))


def test_default_config():
    from pipelines.app.config import TrainConfig

    cfg = compose()
    assert isinstance(cfg, TrainConfig)
    assert cfg.backend.name == "triton" and cfg.pipeline.staleness == 0 and cfg.tables.num_tables == 4


@pytest.mark.parametrize(
    "group, option",
    sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml") if p.parent.name != "experiment"),
)
def test_every_group_option_composes(group, option):
    companions = {  # what an option needs set elsewhere to be valid
        ("data", "criteo"): ["data.criteo_paths=[day_0.tsv]", "data.criteo_eval_paths=[day_23.tsv]",
                             "tables.num_tables=26"],
        ("tables", "dlrm_h200"): ["model.dense_arch_layer_sizes=[512,256,128]"],
        ("tables", "ctr_dlrm"): ["model.dense_arch_layer_sizes=[512,256,128]"],
    }
    cfg = compose(f"{group}={option}", *companions.get((group, option), []))
    assert getattr(cfg, group) is not None


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes(experiment):
    cfg = compose(f"experiment={experiment}")
    assert cfg.data.batch_size == 8192 and cfg.tables.rows == 1_000_000


def test_backend_is_one_key():
    assert compose("backend=fbgemm").backend.name == "fbgemm"
    assert compose("backend.name=fbgemm").backend.name == "fbgemm"


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.hidden=3", "hidden"),  # unknown key
        ("steps=many", "steps"),  # wrong type
        ("pipeline.staleness=-1", "pipeline.staleness"),
        ("backend.name=cuda", "backend.name"),
        ("optimizer.sparse=LARS_SGD", "optimizer.sparse"),
        ("tables.dim=32", "model.dense_arch_layer_sizes"),  # the bottom MLP must end in tables.dim
        ("+tables.overrides.t9.learning_rate=0.1", "tables.overrides.t9"),
        ("sharding.sharding_types=[diagonal]", "sharding.sharding_types"),
        ("pipeline.tbe_max_sms=0", "pipeline.tbe_max_sms"),
        ("data.source=criteo", "data.criteo_paths"),
        ("data=criteo", "data.criteo_paths"),
        ("data=criteo data.criteo_paths=[x.tsv]", "tables.num_tables"),  # Criteo has 26 features
        # evaluation reads held-out files, never the training files
        ("data=criteo data.criteo_paths=[x.tsv] tables.num_tables=26", "data.criteo_eval_paths"),
        ("data=criteo data.criteo_paths=[x.tsv] data.criteo_eval_paths=[x.tsv]", "data.criteo_eval_paths"),
        ("logging.profile_steps=-1", "logging.profile_steps"),
        ("eval_every_steps=-5", "eval_every_steps"),
        ("logging.tensorboard_dir=''", "logging.tensorboard_dir"),
    ],
)
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(Exception) as info:
        compose(*override.split())
    assert key in str(info.value), str(info.value)
