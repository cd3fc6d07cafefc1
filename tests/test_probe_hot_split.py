"""``benchmarks.probe_hot_split``: its split of a batch is the backward's (the ids
``RunsLaunch.hot_split`` compacts for the sort), and its smoke run writes its file."""

import json

import torch

from tbe_plugin.benchmarks import probe_hot_split
from tbe_plugin.ops import embedding_backward
from tbe_plugin.ops.backward_launch import RunsLaunch
from tbe_plugin.ops.common import Pooling
from tbe_plugin.workloads import generate_batch


def test_the_probes_split_is_the_backwards(monkeypatch):
    from tbe_plugin import TritonTableBatchedEmbeddingBags

    workload = probe_hot_split.SMOKE
    result = probe_hot_split.probe(workload, [16], [8, 64])
    indices, offsets, _ = generate_batch(workload, 0, "cpu")
    emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in workload.tables])
    kept, original = [], embedding_backward.compact_kept

    def spied(*args):
        out = original(*args)
        kept.append(out[0].numel())
        return out

    monkeypatch.setattr(embedding_backward, "compact_kept", spied)
    for entry in result["split"]:
        kept.clear()
        launch = RunsLaunch(hot_rows=16, hot_sample=entry["sample"], hot_split=True, hot_min_ids=0, graph_max_ids=0)
        embedding_backward.plan_backward(emb.feature_meta, sum(emb.table_rows), indices, offsets, None, False,
                                         int(Pooling.SUM), True, 1, (workload.batch_size, 24), launch,
                                         emb._row_classes, 8)  # fmt: skip
        assert kept == [entry["left"]["ids"]]
        assert abs(entry["hot_share"] - (1 - kept[0] / result["ids"])) < 1e-3
        assert 0 < entry["hot_share"] <= entry["oracle_share"] + 1e-9
    left = [e["left"] for e in result["split"]]
    assert all(part["ids_in_short_runs"] + part["ids_in_long_runs"] == part["ids"] for part in left)
    assert result["default"]["ids"] == result["ids"] == indices.numel()


def test_smoke_run_writes_its_file(tmp_path):
    probe_hot_split.main(["--out", str(tmp_path), "--smoke", "--hot", "16", "--samples", "8"])
    written = json.loads((tmp_path / "probe_hot_split.json").read_text())
    assert written["git"]["git_commit"] and written["configs"][0]["config"] == "smoke-split"
    assert torch.tensor([written["configs"][0]["split"][0]["hot_share"]]).item() > 0
