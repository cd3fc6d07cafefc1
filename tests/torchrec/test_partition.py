"""The imbalance report on a plan whose costs are computed by hand, the presets' sharding
types through TorchRec's planner, feedback planning, and the partition and simulation
commands on tiny models."""

import json

import pytest

from tbe_plugin.torchrec.cost import (
    INDEX_BYTES,
    CostModel,
    KernelSpeed,
    PlacedShard,
    imbalance_report,
    load_shards,
    rank_lookups,
    save_shards,
)
from tbe_plugin.torchrec.stats import FeatureStatistics, TableStatistics

KERNEL = KernelSpeed(forward_bytes_per_s=1e9, backward_bytes_per_s=1e9, source="test")


def table(name, rows, dim, pooling, heavy=(), distinct_fraction=0.5):
    """Statistics of one table: ``pooling`` ids per bag, ``heavy`` (row, lookups per batch)
    and the rest uniform over 4 buckets (100 bags per batch)."""
    lookups = 100 * pooling
    rest = lookups - sum(c for _, c in heavy)
    return TableStatistics(name=name, feature=f"f_{name}", rows=rows, dim=dim, weight_bytes=4, batches=1,
                           bags_per_batch=100, lookups_per_batch=lookups, mean_pooling=pooling, p99_pooling=pooling,
                           distinct_per_rank_batch=lookups * distinct_fraction, distinct_fraction=distinct_fraction,
                           hot_0p1pct_share=0.5, hot_1pct_share=0.5, heavy_rows=list(heavy),
                           row_buckets=[rest / 4] * 4)  # fmt: skip


def stats(*tables):
    return FeatureStatistics(list(tables), world_size=1, rank_batch_size=100, sample_every=1, steps_observed=1)


def test_report_on_a_hand_computed_plan():
    """Table a (8 ids a bag) whole on rank 0; table b (2 ids a bag, row 10 of 100 draws
    half of them) split by rows over ranks 0 and 1. Global batch = 2 ranks x 50 bags."""
    s = stats(table("a", 1000, 16, 8.0), table("b", 100, 8, 2.0, heavy=[(10, 100.0)]))
    model = CostModel(KERNEL, world_size=2, local_world_size=2, rank_batch_size=50, intra_host_bytes_per_s=1e9,
                      inter_host_bytes_per_s=1e9, state_bytes_per_row=4)  # fmt: skip
    shards = [PlacedShard("a", "table_wise", 0, 0, 1000, 0, 16),
              PlacedShard("b", "row_wise", 0, 0, 50, 0, 8), PlacedShard("b", "row_wise", 1, 50, 50, 0, 8)]  # fmt: skip
    report = imbalance_report(shards, s, model)
    # b's 200 lookups a batch: the heavy row's 100 on rank 0, the other 100 split evenly.
    assert rank_lookups(report) == pytest.approx([800 + 150, 50])
    # Rank 1 by hand: 50 lookups of 8 fp32 columns and their ids, 100 pooled outputs of 8.
    lookup_bytes = 50 * (8 * 4 + INDEX_BYTES) + 100 * 8 * 4
    update_bytes = 100 * 8 * 4 + 25 * 2 * (8 * 4 + 4) + 50 * (8 + 16)
    comm_bytes = 50 * 8 + 2 * 100 * 8 * 4
    rank1 = report.ranks[1]
    assert (rank1.lookup_bytes, rank1.update_bytes, rank1.comm_bytes) == pytest.approx(
        (lookup_bytes, update_bytes, comm_bytes))
    assert rank1.seconds == pytest.approx((lookup_bytes + update_bytes + comm_bytes) / 1e9)
    assert report.hottest_rank == 0
    assert report.max_over_mean == pytest.approx(report.ranks[0].seconds / ((report.ranks[0].seconds + rank1.seconds) / 2))
    assert report.predicted_step_ms == pytest.approx(report.ranks[0].seconds * 1e3)
    hottest = report.hottest_tables()
    assert [h["table"] for h in hottest] == ["a", "b"] and sum(h["share_of_rank"] for h in hottest) == pytest.approx(1)
    line = report.line("test")
    assert "max/mean" in line and "hottest rank 0 of 2" in line and "a tw" in line
    with pytest.raises(ValueError, match="without statistics"):
        imbalance_report([PlacedShard("zz", "table_wise", 0, 0, 1, 0, 4)], s, model)
    with pytest.raises(ValueError, match="rank 5"):
        imbalance_report([PlacedShard("a", "table_wise", 5, 0, 1000, 0, 16)], s, model)


def test_kernel_speed_from_the_benchmark_json(tmp_path):
    from tbe_plugin.torchrec.cost import default_kernel_benchmark

    speed = KernelSpeed.from_benchmark(default_kernel_benchmark())
    assert speed.forward_bytes_per_s > 1e10 and speed.backward_bytes_per_s > 1e10  # an H200's TB/s, measured
    assert "cd7e699" in speed.source
    (tmp_path / "empty.json").write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="no 'ours'"):
        KernelSpeed.from_benchmark(str(tmp_path / "empty.json"))


def tiny_statistics():
    """Six tables, two of them hot (pooling 40): enough for every preset at 2-4 ranks."""
    return stats(*[table(f"t{i}", 400 + 100 * i, 16 if i % 2 else 32, 40.0 if i < 2 else 2.0,
                         heavy=[(3, 500.0)] if i < 2 else ()) for i in range(6)])  # fmt: skip


@pytest.fixture(scope="module")
def planning():
    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec._compat import triton_kernel
    from tbe_plugin.torchrec.partition import meta_collection

    s = tiny_statistics()
    topology = Topology(world_size=4, local_world_size=2, compute_device="cuda")
    model = CostModel.from_topology(topology, KERNEL, rank_batch_size=100)
    return s, topology, model, meta_collection(s), get_sharders("triton"), triton_kernel()


@pytest.mark.parametrize("preset", ["table_wise", "row_wise", "column_wise", "table_row_wise", "grid"])
def test_presets_give_the_sharding_types_they_name(planning, preset):
    from tbe_plugin.torchrec.partition import PRESETS, plan_preset

    s, topology, model, module, sharders, kernel = planning
    result = plan_preset(module, sharders, topology, s, model, preset, kernel)
    assert {sh.sharding_type for sh in result.shards} == set(PRESETS[preset])
    assert {sh.table for sh in result.shards} == {t.name for t in s.tables}
    assert len(result.report.ranks) == 4


def test_balanced_and_feedback_beat_the_static_plan(planning):
    """Planned from the statistics, the hot tables are split; the static guesses
    (pooling 1 everywhere) leave them whole, so one rank carries them."""
    from tbe_plugin.torchrec.partition import feedback_plan, plan_preset

    s, topology, model, module, sharders, kernel = planning
    static = plan_preset(module, sharders, topology, s, model, "table_wise", kernel)
    balanced = plan_preset(module, sharders, topology, s, model, "balanced", kernel)
    fdp = feedback_plan(module, sharders, topology, s, model, kernel, target=1.15)
    assert static.report.max_over_mean > 1.5
    assert balanced.report.predicted_step_ms < static.report.predicted_step_ms
    assert fdp.report.max_over_mean <= 1.15 and fdp.report.predicted_step_ms < static.report.predicted_step_ms
    with pytest.raises(ValueError, match="preset 'nope'"):
        plan_preset(module, sharders, topology, s, model, "nope", kernel)
    with pytest.raises(ValueError, match="target"):
        feedback_plan(module, sharders, topology, s, model, kernel, target=0.5)


def test_partition_cli_plans_saves_and_reports(tmp_path, capsys):
    from tbe_plugin.torchrec.partition import main

    path, plan = tmp_path / "stats.json", tmp_path / "plan.json"
    tiny_statistics().save(str(path))
    main(["plan", "--statistics", str(path), "--preset", "fdp", "--world-size", "4", "--local-world-size", "2",
          "--out", str(plan)])  # fmt: skip
    planned = capsys.readouterr().out
    assert "max/mean" in planned and "| rank |" in planned
    shards = load_shards(str(plan))
    assert {s.table for s in shards} == {f"t{i}" for i in range(6)}
    main(["report", "--statistics", str(path), "--plan", str(plan), "--world-size", "4", "--local-world-size", "2"])
    reported = capsys.readouterr().out
    ratio = lambda out: out.split("max/mean ")[1].split(",")[0]  # noqa: E731
    assert ratio(reported) == ratio(planned)  # the saved plan reports as it was planned
    save_shards(shards[:1], str(tmp_path / "one.json"))
    with pytest.raises(SystemExit):
        main(["report", "--statistics", str(path), "--world-size", "4"])  # no --plan


def test_simulation_smoke(tmp_path):
    """A tiny recorded model, scaled, planned at 8 and 16 ranks: every plan gives a row,
    and the files carry the commit."""
    from tbe_plugin.torchrec import simulate

    recorded = simulate.record_statistics(num_tables=4, batch_size=32, batches=1)
    assert recorded.provenance["git_commit"] and len(recorded.tables) == 4
    path = tmp_path / "stats.json"
    recorded.save(str(path))
    scaled = simulate.scale_statistics(recorded, row_factors=(1, 10), giant_tables=1, giant_rows=10**9)
    assert len(scaled.tables) == 9 and max(t.rows for t in scaled.tables) == 10**9
    giant = scaled.tables[-1]
    assert giant.lookup_share(0, giant.rows) == pytest.approx(1.0)
    simulate.main(["run", "--statistics", str(path), "--world-sizes", "8", "16", "--row-factors", "1", "10",
                   "--giant-tables", "1", "--rank-batch-size", "64", "--out-dir", str(tmp_path)])  # fmt: skip
    [result] = tmp_path.glob("partition_simulation_*.json")
    values = json.loads(result.read_text())
    assert "git_dirty" in values["header"] and values["header"]["git_commit"]
    rows = values["rows"]
    assert [(r["world_size"], r["plan"]) for r in rows] == [(w, p) for w in (8, 16) for p in simulate.PLANS]
    assert all("error" not in r for r in rows), rows
    for w in (8, 16):
        by_plan = {r["plan"]: r for r in rows if r["world_size"] == w}
        assert by_plan["fdp"]["max_over_mean"] <= by_plan["static"]["max_over_mean"]
    assert "| ranks | plan |" in result.with_suffix(".md").read_text()


def host_blocks(shards, local):
    """Per (table, first column): the host of its row blocks, checking TorchRec's rule that
    row block i of a host-level shard group sits on local rank i of one host."""
    groups = {}
    for s in shards:
        groups.setdefault((s.table, s.first_col), []).append(s)
    hosts = {}
    for key, group in groups.items():
        group.sort(key=lambda s: s.first_row)
        host = group[0].rank // local
        assert [s.rank for s in group] == [host * local + i for i in range(local)], key
        hosts[key] = host
    return hosts


def test_rank_max_host_placement_avoids_colliding_hot_row_blocks():
    """Table a is hot in its second half (row block 1), b and c in their first (block 0).
    TorchRec's rule puts c on the host with the least total, b's host, so both hot
    blocks land on one rank; picking the host by its hottest rank puts c's hot block
    on a's cool rank 0. Grid column blocks keep one host each, row blocks in order."""
    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec._compat import triton_kernel
    from tbe_plugin.torchrec.partition import TableSplit, make_statistics_planner, meta_collection, plan_splits

    s = stats(table("a", 1000, 8, 10.0, heavy=[(900, 950.0)]), table("b", 1000, 8, 8.0, heavy=[(100, 760.0)]),
              table("c", 1000, 8, 6.0, heavy=[(100, 570.0)]))  # fmt: skip
    module, sharders, kernel = meta_collection(s), get_sharders("triton"), triton_kernel()
    row_wise_in_host = {t.name: TableSplit("table_row_wise", t.dim, 0.0, 0.0) for t in s.tables}
    with_grid = dict(row_wise_in_host, c=TableSplit("grid_shard", 4, 0.0, 0.0))
    for world_size, splits in ((4, row_wise_in_host), (6, with_grid)):
        topology = Topology(world_size=world_size, local_world_size=2, compute_device="cuda")
        model = CostModel.from_topology(topology, KERNEL, rank_batch_size=100)
        results = {placement: plan_splits(module, sharders, topology, s, model, kernel, splits, "t", placement)
                   for placement in ("host_total", "rank_max")}  # fmt: skip
        hosts = {placement: host_blocks(r.shards, 2) for placement, r in results.items()}
        assert results["rank_max"].report.max_over_mean < results["host_total"].report.max_over_mean
        if world_size == 4:
            assert hosts["host_total"] == {("a", 0): 0, ("b", 0): 1, ("c", 0): 1}
            assert hosts["rank_max"] == {("a", 0): 0, ("b", 0): 1, ("c", 0): 0}
            assert results["rank_max"].report.hottest_rank == 1  # a's hot block, alone
        else:
            assert hosts["rank_max"][("c", 0)] != hosts["rank_max"][("c", 4)]  # one host per column block
    with pytest.raises(ValueError, match="host_placement 'nope'"):
        make_statistics_planner(topology, s, model, {}, host_placement="nope")
