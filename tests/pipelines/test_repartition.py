"""Partitioning in the training app: the presets' config names and checks, and one run on
2 gloo ranks with a preset and feature statistics, whose imbalance line and statistics
JSON come out of it; the closed loop: a run that re-shards in mid-training, then resumes,
trains bitwise as one that never re-shards."""

import json

import pytest

from pipelines.app.config import SHARDING_PRESETS, ConfigError, ShardingConfig
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
    with pytest.raises(ValueError, match="sharding.repartition_every"):
        ShardingConfig(repartition_every=10)  # no statistics to re-plan from
    with pytest.raises(ValueError, match="sharding.repartition_every"):
        ShardingConfig(repartition_every=-1, statistics_every=1)
    with pytest.raises(ValueError, match="sharding.repartition_imbalance"):
        ShardingConfig(repartition_every=10, statistics_every=1, repartition_imbalance=0.5)
    with pytest.raises(ValueError, match="sharding.repartition_min_gain"):
        ShardingConfig(repartition_every=10, statistics_every=1, repartition_min_gain=1.0)


def test_preset_constraints():
    from pipelines.app.repartition import preset_constraints

    constraints = preset_constraints("grid", ["t0", "t1"])
    assert {t: c.sharding_types for t, c in constraints.items()} == {"t0": ["grid_shard"], "t1": ["grid_shard"]}
    with pytest.raises(ValueError, match="statistics_file"):
        preset_constraints("balanced", ["t0"])


def test_app_logs_the_imbalance_and_saves_statistics(tmp_path, capsys):
    """Row-wise tables, statistics on every other step: the run ends with the imbalance
    line, the ratio in its metrics, both ranks' batches in the statistics and its plan
    beside them, which ``partition report`` reprices to the same ratio; a second run plans
    ``balanced`` from them."""
    from tbe_plugin.torchrec.partition import main as partition_main

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
    plan = tmp_path / "stats.plan.json"
    shards = json.loads(plan.read_text())["shards"]
    assert {(s["table"], s["sharding_type"]) for s in shards} == {(f"t{i}", "row_wise") for i in range(4)}
    assert {s["rank"] for s in shards} == {0, 1}
    partition_main(["report", "--statistics", str(out), "--plan", str(plan), "--world-size", "2",
                    "--local-world-size", "2", "--compute-device", "cpu", "--rank-batch-size", "32"])  # fmt: skip
    assert f"max/mean {values['imbalance_max_over_mean']:.2f}" in capsys.readouterr().out
    balanced = run_app(tmp_path, "backend=fbgemm", "steps=2", "eval_batches=0", "sharding.preset=balanced",
                       f"sharding.statistics_file={out}")  # fmt: skip
    assert metrics(balanced)["steps"] == 2


def test_repartition_needs_a_checkpoint_dir():
    from omegaconf import OmegaConf

    from pipelines.app.config import TrainConfig

    raw = OmegaConf.merge(OmegaConf.structured(TrainConfig),
                          {"sharding": {"statistics_every": 1, "repartition_every": 4}})  # fmt: skip
    with pytest.raises((ValueError, ConfigError), match="sharding.repartition_every.*checkpoint.dir"):
        OmegaConf.to_object(raw)


# t0 draws 16 ids a bag, the others 1: TorchRec's static estimate (every table alike)
# puts two tables on each rank; the measured statistics put t0 alone. Table-wise only, so
# the new plan moves whole tables (rowwise Adagrad's arithmetic is that of its table, not
# of its rank; column or row re-splits would change it).
SKEWED = "tables.per_table=[" + ",".join(
    f"{{rows:2000,pooling_factor:{p},zipf_alpha:1.05}}" for p in (16, 1, 1, 1)) + "]"
LOOP = ("backend=fbgemm", "eval_batches=0", SKEWED, "sharding.preset=table_wise", "sharding.statistics_every=1",
        "sharding.repartition_every=3")  # fmt: skip


def _records(path, kind):
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def _checkpoint_tensors(path, out):
    """Every tensor of a DCP checkpoint, whole (whatever plan wrote it)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(out))
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=False))
    return flat


def _trained_state(flat):
    """The model's and optimizers' tensors (the statistics are compared on their own)."""
    return {k: v for k, v in flat.items() if not k.startswith(".statistics.")}


def test_reshard_in_mid_run_then_resume_changes_no_result(tmp_path):
    """A run re-plans after step 3 from the statistics, moves t2 to t0's other rank and
    trains on in the same processes; it stops at step 4 and a second launch resumes under
    the new plan (and with the statistics of the checkpoint) to step 6. Its losses, every
    weight and optimizer state of its last checkpoint and its statistics are bitwise those
    of a run whose loop never re-shards (imbalance trigger above any 2-rank max/mean)."""
    import torch

    base = run_app(tmp_path, *LOOP, "steps=6", "sharding.repartition_imbalance=50",
                   f"checkpoint.dir={tmp_path / 'base'}", f"logging.metrics_file={tmp_path / 'base.jsonl'}",
                   f"sharding.statistics_out={tmp_path / 'base_stats.json'}")  # fmt: skip
    assert metrics(base)["reshard_steps"] == []
    (kept,) = _records(tmp_path / "base.jsonl", "repartition")
    assert kept["outcome"] == "balanced_enough" and kept["step"] == 3

    moved = run_app(tmp_path, *LOOP, "steps=4", "sharding.repartition_imbalance=1.0",
                    "sharding.repartition_min_gain=-1.0", f"checkpoint.dir={tmp_path / 'moved'}",
                    f"logging.metrics_file={tmp_path / 'moved.jsonl'}")  # fmt: skip
    assert metrics(moved)["reshard_steps"] == [3]
    (record,) = _records(tmp_path / "moved.jsonl", "repartition")
    assert record["outcome"] == "resharded" and record["new_plan"] != record["old_plan"]
    assert all(v.startswith("table_wise@") for v in record["new_plan"].values())
    assert record["new_max_over_mean"] < record["old_max_over_mean"]
    assert "repartition at step 3: resharded" in moved.stdout
    assert (tmp_path / "moved" / "plans" / "step_3.json").exists()

    resumed = run_app(tmp_path, *LOOP, "steps=6", "sharding.repartition_imbalance=1.0",
                      "sharding.repartition_min_gain=-1.0", f"checkpoint.dir={tmp_path / 'moved'}",
                      f"logging.metrics_file={tmp_path / 'resumed.jsonl'}",
                      f"sharding.statistics_out={tmp_path / 'resumed_stats.json'}")  # fmt: skip
    assert metrics(resumed)["steps"] == 6
    assert f"resumed from {tmp_path / 'moved' / 'step_4'} at step 4 under the plan of" in resumed.stdout
    ran_under = json.loads((tmp_path / "resumed_stats.plan.json").read_text())["shards"]
    assert {s["table"]: f"table_wise@[{s['rank']}]" for s in ran_under} == record["new_plan"]
    # The statistics came through the re-shard and the resume: those of 6 uninterrupted
    # steps. The heavy rows are a Misra-Gries sketch per rank, merged; after a resume rank 0
    # holds the totals and the others start from zero, so which counts the sketch keeps may
    # differ -- the lookups it and the row buckets account for may not.
    got, expected = (json.loads((tmp_path / f"{n}_stats.json").read_text()) for n in ("resumed", "base"))
    sketched = ("heavy_rows", "row_buckets")
    assert {k: v for k, v in got.items() if k != "tables"} == {k: v for k, v in expected.items() if k != "tables"}
    for a, b in zip(got["tables"], expected["tables"], strict=True):
        assert {k: v for k, v in a.items() if k not in sketched} == {k: v for k, v in b.items() if k not in sketched}
        total = [sum(c for _, c in t["heavy_rows"]) + sum(t["row_buckets"]) for t in (a, b)]
        assert total[0] == pytest.approx(total[1], rel=1e-12), a["name"]

    losses = [r["loss"] for r in _records(tmp_path / "moved.jsonl", "step") + _records(tmp_path / "resumed.jsonl", "step")]
    assert losses == [r["loss"] for r in _records(tmp_path / "base.jsonl", "step")]
    expected = _trained_state(_checkpoint_tensors(tmp_path / "base" / "step_6", tmp_path / "base.pt"))
    got = _trained_state(_checkpoint_tensors(tmp_path / "moved" / "step_6", tmp_path / "moved.pt"))
    assert sorted(got) == sorted(expected) and any("momentum1" in k for k in got)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_a_resume_takes_the_plan_of_the_last_reshard_before_its_checkpoint(tmp_path):
    """A re-shard's own checkpoint is written under the old plan: the plan of step N holds
    for checkpoints after N. The JSON round trip keeps every shard's place."""
    from torchrec.distributed.types import ShardingPlan

    from pipelines.app.repartition import plan_of_checkpoint, plan_summary, record_plan
    from tbe_plugin.torchrec.cost import shards_of_plan
    from tests.torchrec.partition_workers import fixed_plan

    plans = {3: fixed_plan({"t0": "cw01", "t1": "tw0", "t2": "tw1", "t3": "rw"}),
             7: fixed_plan({"t0": "cw10", "t1": "tw1", "t2": "tw0", "t3": "rw"})}  # fmt: skip
    for step, plan in plans.items():
        record_plan(str(tmp_path), step, ShardingPlan({"ebc": plan}))
    assert plan_of_checkpoint(str(tmp_path), 3) == (None, None)
    assert plan_of_checkpoint(str(tmp_path / "elsewhere"), 9) == (None, None)
    for checkpoint_step, planned_at in ((4, 3), (7, 3), (8, 7)):
        path, plan = plan_of_checkpoint(str(tmp_path), checkpoint_step)
        assert path.endswith(f"step_{planned_at}.json")
        assert shards_of_plan(plan) == shards_of_plan(ShardingPlan({"ebc": plans[planned_at]}))
        assert plan_summary(plan) == plan_summary(ShardingPlan({"ebc": plans[planned_at]}))
