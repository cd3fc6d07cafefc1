"""Partitioning in the training app: the presets' config names and checks, and one run on
2 gloo ranks with a preset and feature statistics, whose imbalance line and statistics
JSON come out of it."""

import json

import pytest

from pipelines.config import SHARDING_PRESETS, ShardingConfig
from tests.pipelines.test_train_app import metrics, run_app


def test_config_presets_are_the_partitioners():
    from tbe_plugin.torchrec.partition import PRESETS

    assert set(SHARDING_PRESETS) == set(PRESETS)
    with pytest.raises(ValueError, match="sharding.preset"):
        ShardingConfig(preset="diagonal")
    with pytest.raises(ValueError, match="sharding.preset"):
        ShardingConfig(preset="row_wise", sharding_types=["table_wise"])
    with pytest.raises(ValueError, match="sharding.statistics_file"):
        ShardingConfig(preset="balanced")
    with pytest.raises(ValueError, match="sharding.statistics_out"):
        ShardingConfig(statistics_out="x.json")


def test_preset_constraints():
    from pipelines.repartition import preset_constraints

    constraints = preset_constraints("grid", ["t0", "t1"])
    assert {t: c.sharding_types for t, c in constraints.items()} == {"t0": ["grid_shard"], "t1": ["grid_shard"]}
    with pytest.raises(ValueError, match="statistics_file"):
        preset_constraints("balanced", ["t0"])


def test_app_logs_the_imbalance_and_saves_statistics(tmp_path):
    """Row-wise tables, statistics on every other step: the run ends with the imbalance
    line, the ratio in its metrics, and both ranks' batches in the statistics; a second
    run plans ``balanced`` from them."""
    out = tmp_path / "stats.json"
    result = run_app(tmp_path, "backend=fbgemm", "steps=6", "eval_batches=0", "sharding.preset=row_wise",
                     "sharding.statistics_every=2", f"sharding.statistics_out={out}")  # fmt: skip
    values = metrics(result)
    assert values["imbalance_max_over_mean"] >= 1.0
    line = next(line for line in result.stdout.splitlines() if "imbalance row_wise: max/mean" in line)
    assert "hottest rank" in line and " rw " in line
    stats = json.loads(out.read_text())
    assert stats["world_size"] == 2 and stats["steps_observed"] == 6
    assert all(t["batches"] == 3 and t["bags_per_batch"] == 2 * 32 for t in stats["tables"])
    balanced = run_app(tmp_path, "backend=fbgemm", "steps=2", "eval_batches=0", "sharding.preset=balanced",
                       f"sharding.statistics_file={out}")  # fmt: skip
    assert metrics(balanced)["steps"] == 2
