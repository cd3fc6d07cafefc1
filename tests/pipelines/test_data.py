"""The synthetic click log's batch cycling (``data.distinct_batches``)."""

import torch

from pipelines.config import DataConfig, TablesConfig
from pipelines.data import SyntheticClickLog


def test_distinct_batches_cycle_and_zero_means_all_new():
    tables = TablesConfig(num_tables=2, rows=50, dim=4, pooling_factor=2)
    cycled = list(SyntheticClickLog(tables, DataConfig(batch_size=8, distinct_batches=2), 3, num_batches=5))
    assert [cycled[i] is cycled[i % 2] for i in range(5)] == [True] * 5
    assert not torch.equal(cycled[0].dense_features, cycled[1].dense_features)
    fresh = list(SyntheticClickLog(tables, DataConfig(batch_size=8), 3, num_batches=5))
    assert torch.equal(fresh[0].dense_features, cycled[0].dense_features)  # the same stream, then new batches
    assert torch.equal(fresh[1].dense_features, cycled[1].dense_features)
    assert not torch.equal(fresh[2].dense_features, cycled[2].dense_features)
