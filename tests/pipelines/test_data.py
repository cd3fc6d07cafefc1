"""The planted click log: fresh batches from each table's Zipf law, Poisson bags, labels
drawn from the planted model whose Bayes-optimal logits ``planted_logits`` gives; streams
that never repeat; batch cycling (``data.distinct_batches``) for the benchmarks."""

import itertools
import json
import math

import pytest
import torch

from pipelines.app.config import ConfigError, DataConfig, TablesConfig, TrainConfig
from pipelines.app.data import PlantedClickLog, SyntheticClickLog
from pipelines.metrics import binary_quality
from tbe_plugin.workloads import table_sampler

TABLES = TablesConfig(num_tables=3, rows=400, dim=4, pooling_factor=3, zipf_alpha=1.1)


def _draw(data: DataConfig, batches: int, stream: int = 0, tables: TablesConfig = TABLES):
    log = PlantedClickLog(tables, data, 5, num_batches=batches, stream=stream)
    drawn = list(log)
    return log, drawn


def test_distinct_batches_cycle_and_zero_means_all_new():
    tables = TablesConfig(num_tables=2, rows=50, dim=4, pooling_factor=2)
    cycled = list(SyntheticClickLog(tables, DataConfig(batch_size=8, distinct_batches=2), 3, num_batches=5))
    assert [cycled[i] is cycled[i % 2] for i in range(5)] == [True] * 5
    fresh = list(SyntheticClickLog(tables, DataConfig(batch_size=8), 3, num_batches=5))
    assert torch.equal(fresh[1].dense_features, cycled[1].dense_features)  # the same stream, then new batches
    assert not torch.equal(fresh[2].dense_features, cycled[2].dense_features)
    dense = [b.dense_features for b in fresh]
    assert all(not torch.equal(dense[i], dense[j]) for i in range(5) for j in range(i))


def test_streams_and_ranks_are_disjoint_and_each_is_reproducible():
    data = DataConfig(batch_size=16, seed=4)
    train = PlantedClickLog(TABLES, data, 5, rank=1, stream=0).batch(0)
    again = PlantedClickLog(TABLES, data, 5, rank=1, stream=0).batch(0)
    held_out = PlantedClickLog(TABLES, data, 5, rank=1, stream=1).batch(0)
    other_rank = PlantedClickLog(TABLES, data, 5, rank=0, stream=0).batch(0)
    assert torch.equal(train.sparse_features.values(), again.sparse_features.values())
    assert torch.equal(train.labels, again.labels) and torch.equal(train.dense_features, again.dense_features)
    for other in (held_out, other_rank):
        assert not torch.equal(other.dense_features, train.dense_features)


def test_bags_are_poisson_and_ids_follow_each_tables_zipf_law():
    log, batches = _draw(DataConfig(batch_size=2048), 2)
    for t in range(TABLES.num_tables):
        lengths = torch.cat([b.sparse_features[f"f{t}"].lengths() for b in batches]).double()
        # Poisson(3): mean 3, variance 3 (a uniform law on 1..5 would give variance 2, none empty)
        assert abs(lengths.mean().item() - 3) < 0.1 and abs(lengths.var().item() - 3) < 0.3, t
        assert (lengths == 0).double().mean().item() == pytest.approx(math.exp(-3), abs=0.01)
        ids = torch.cat([b.sparse_features[f"f{t}"].values() for b in batches])
        assert ids.min() >= 0 and ids.max() < TABLES.rows
        hottest = int(torch.bincount(ids).argmax())
        assert hottest == int(table_sampler(TABLES.rows, TABLES.zipf_alpha, t).rank_to_row(torch.tensor([1]))[0])
    features = batches[0].sparse_features
    assert features.length_per_key() == [int(features[f"f{t}"].lengths().sum()) for t in range(TABLES.num_tables)]


def test_labels_are_calibrated_to_the_planted_probability():
    """Examples binned by the planted probability: each bin's click rate is its mean
    probability within 4 standard errors, so ``planted_logits`` is what drew the labels."""
    log, batches = _draw(DataConfig(batch_size=4096, seed=1), 3)
    p = torch.sigmoid(torch.cat([log.planted_logits(b) for b in batches]).double())
    labels = torch.cat([b.labels for b in batches]).double()
    order = torch.argsort(p)
    for bin_ in order.chunk(8):
        expected = p[bin_].mean().item()
        error = math.sqrt(expected * (1 - expected) / len(bin_))
        assert abs(labels[bin_].mean().item() - expected) < 4 * error + 1e-3, (expected, labels[bin_].mean())
    assert p.min() < 0.15 and p.max() > 0.85  # the model is far from trivial at the defaults


def test_the_optimum_beats_any_other_predictor_and_label_flips_bound_it():
    log, batches = _draw(DataConfig(batch_size=4096, seed=2), 2)
    optimal = torch.cat([log.planted_logits(b) for b in batches])
    labels = torch.cat([b.labels for b in batches])
    quality = binary_quality(optimal * 0.5 + 0.3, labels, optimal)
    assert quality["excess_log_loss"] > 0.01 and quality["auc_gap"] == pytest.approx(0.0, abs=1e-6)
    base_rate = labels.mean().item()
    constant = -(base_rate * math.log(base_rate) + (1 - base_rate) * math.log(1 - base_rate))
    assert quality["optimal_log_loss"] < constant - 0.1 and quality["optimal_auc"] > 0.75
    flip = 0.2
    noisy, noisy_batches = _draw(DataConfig(batch_size=256, seed=2, planted_label_flip=flip), 1)
    bound = math.log((1 - flip) / flip)
    assert noisy.planted_logits(noisy_batches[0]).abs().max().item() <= bound + 1e-5


def test_fixed_and_poisson_tables_drawn_together():
    """Tables of both bag laws in one batch: fixed ones exactly their length, Poisson ones
    their host-drawn count spread over the bags, every id in its own table's range."""
    from pipelines.app.config import TableSpec

    specs = [TableSpec(rows=30, pooling_factor=2, bag_lengths="fixed", zipf_alpha=0.0),
             TableSpec(rows=5000, pooling_factor=4, bag_lengths="poisson", zipf_alpha=1.2),
             TableSpec(rows=7, pooling_factor=1, bag_lengths="fixed", zipf_alpha=1.0),
             TableSpec(rows=100, pooling_factor=0.5, bag_lengths="poisson", zipf_alpha=0.5)]  # fmt: skip
    tables = TablesConfig(num_tables=4, dim=4, per_table=specs)
    batch = PlantedClickLog(tables, DataConfig(batch_size=512, seed=3), 5).batch(0)
    features = batch.sparse_features
    assert torch.equal(features["f0"].lengths(), torch.full((512,), 2))
    assert torch.equal(features["f2"].lengths(), torch.full((512,), 1))
    assert abs(features["f1"].lengths().double().mean().item() - 4) < 0.4
    for t, spec in enumerate(specs):
        values = features[f"f{t}"].values()
        assert values.numel() == int(features[f"f{t}"].lengths().sum())
        assert values.numel() == 0 or (values.min() >= 0 and values.max() < spec.rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_drawn_ahead_are_the_batches_drawn_alone():
    """On a GPU the next batch is drawn while the current one is handed out: the batches
    (in order, out of order, past the end) are the ones a fresh log draws alone."""
    data, device = DataConfig(batch_size=256, seed=5), torch.device("cuda")
    streamed = list(PlantedClickLog(TABLES, data, 5, device, num_batches=4))

    def alone(i):
        return PlantedClickLog(TABLES, data, 5, device).batch(i)

    log = PlantedClickLog(TABLES, data, 5, device)
    for i, batch in [*enumerate(streamed), (0, log.batch(0)), (2, log.batch(2)), (3, log.batch(3))]:
        expected = alone(i)
        assert torch.equal(batch.sparse_features.values(), expected.sparse_features.values()), i
        assert torch.equal(batch.sparse_features.lengths(), expected.sparse_features.lengths()), i
        assert torch.equal(batch.labels, expected.labels) and torch.equal(batch.dense_features, expected.dense_features)
    assert log._ahead is not None and log._ahead[0] == 4  # the next one is drawn
    cycled = PlantedClickLog(TABLES, DataConfig(batch_size=256, seed=5, distinct_batches=2), 5, device)
    assert len(list(itertools.islice(iter(cycled), 5))) == 5 and cycled._ahead is None  # nothing drawn past the cycle


def test_planted_model_settings_are_validated():
    with pytest.raises(ConfigError, match="data.planted_label_flip"):
        DataConfig(planted_label_flip=0.5)
    with pytest.raises(ConfigError, match="data.criteo_eval_paths"):
        DataConfig(source="criteo", criteo_paths=["a.tsv"], criteo_eval_paths=["a.tsv"])
    with pytest.raises(ConfigError, match="data.criteo_eval_paths"):
        TrainConfig(data=DataConfig(source="criteo", criteo_paths=["a.tsv"]),
                    tables=TablesConfig(num_tables=26, dim=16))  # fmt: skip


def test_drawing_benchmark_smoke(tmp_path):
    """``pipelines.bench.planted --smoke`` times both drawings and writes its files with the commit."""
    from pipelines.bench import planted

    results = planted.main(["--smoke", "--out", str(tmp_path)])
    assert [r["drawing"] for r in results["rows"]] == ["alone", "busy", "per-table, busy"]
    assert all(r["host_ms_median"] > 0 for r in results["rows"])
    assert "git_commit" in json.loads((tmp_path / "planted.json").read_text())["git"]
    assert "| 64 | per-table, busy |" in (tmp_path / "planted.md").read_text()
