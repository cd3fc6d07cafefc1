"""The Criteo-format reader on a small file the test writes, and the app trained on it."""

import random

import pytest
import torch

from tests.pipelines.test_train_app import metrics, run_app


def write_criteo(path, lines, seed=0):
    """Criteo's TSV: label, 13 integers, 26 hexadecimal categoricals; some fields empty."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            dense = [str(rng.randint(-2, 500)) if rng.random() > 0.2 else "" for _ in range(13)]
            sparse = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.1 else "" for _ in range(26)]
            f.write("\t".join([str(rng.randint(0, 1))] + dense + sparse) + "\n")


def test_reader_parses_criteo_lines(tmp_path):
    from pipelines.app.data import CriteoTSV

    path = tmp_path / "day_0.tsv"
    write_criteo(path, 10)
    lines = [line.rstrip("\n").split("\t") for line in open(path)]
    batches = list(CriteoTSV([path], batch_size=4, rows=1000))
    assert len(batches) == 2  # 10 lines: two full batches, the rest dropped
    first = batches[0]
    assert torch.equal(first.labels, torch.tensor([float(l[0]) for l in lines[:4]]))
    expected_dense = [[torch.log1p(torch.tensor(max(float(v), 0.0))).item() if v else 0.0 for v in l[1:14]]
                      for l in lines[:4]]  # fmt: skip
    torch.testing.assert_close(first.dense_features, torch.tensor(expected_dense))
    f5 = first.sparse_features["f5"]
    column = [l[1 + 13 + 5] for l in lines[:4]]
    assert f5.lengths().tolist() == [1 if c else 0 for c in column]
    assert f5.values().tolist() == [int(c, 16) % 1000 for c in column if c]
    ranks = [list(CriteoTSV([path], 2, 1000, rank=r, world_size=2)) for r in (0, 1)]
    assert [len(b) for b in ranks] == [3, 2]  # 5 batches of 2, dealt to the ranks in turn
    assert torch.equal(ranks[1][0].labels, torch.tensor([float(l[0]) for l in lines[2:4]]))


def test_bad_line_is_reported(tmp_path):
    from pipelines.app.data import CriteoTSV

    path = tmp_path / "bad.tsv"
    path.write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match="3 columns, expected 40"):
        list(CriteoTSV([path], 1, 10))


def test_evaluation_reads_the_held_out_files(tmp_path):
    """Training batches come from ``criteo_paths`` and evaluation batches from
    ``criteo_eval_paths`` alone: the first batch of each stream is its own file's first lines."""
    import torch.distributed as dist

    from pipelines.app.config import DataConfig, TablesConfig, TrainConfig
    from pipelines.app.data import CriteoTSV
    from pipelines.app.train import data_source

    train_path, held_out = tmp_path / "day_0.tsv", tmp_path / "day_23.tsv"
    write_criteo(train_path, 8, seed=0)
    write_criteo(held_out, 8, seed=1)
    cfg = TrainConfig(data=DataConfig(source="criteo", batch_size=4, criteo_paths=[str(train_path)],
                                      criteo_eval_paths=[str(held_out)]),
                      tables=TablesConfig(num_tables=26, dim=16))  # fmt: skip
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        streams = {stream: next(iter(data_source(cfg, 0, stream))) for stream in (0, 1)}
    finally:
        dist.destroy_process_group()
    for stream, path in ((0, train_path), (1, held_out)):
        expected = next(iter(CriteoTSV([path], batch_size=4, rows=cfg.tables.rows)))
        assert torch.equal(streams[stream].dense_features, expected.dense_features), stream
        assert torch.equal(streams[stream].sparse_features.values(), expected.sparse_features.values()), stream


def test_app_trains_on_criteo_files(tmp_path):
    path, held_out = tmp_path / "day_0.tsv", tmp_path / "day_23.tsv"
    write_criteo(path, 2 * 32 * 8)
    write_criteo(held_out, 2 * 32, seed=1)  # one batch per rank
    m = metrics(run_app(tmp_path, "data=criteo", f"data.criteo_paths=[{path}]", f"data.criteo_eval_paths=[{held_out}]",
                        "data.batch_size=32", "tables.num_tables=26", "steps=6", "eval_batches=1"))  # fmt: skip
    assert m["steps"] == 6 and m["log_loss"] > 0, m
    assert "optimal_log_loss" not in m  # no planted model behind Criteo files: no optimum to report
