"""On 2 gloo ranks: the imbalance report's predicted lookups per rank against the ids the
planned DMP's kernels receive, and a re-shard in mid-training (DCP save under plan A, load
under plan B) that leaves losses and weights bitwise equal to training under plan A."""

import pytest
import torch

from tests.torchrec import partition_workers
from tests.torchrec.distributed import run_distributed


@pytest.fixture(scope="module")
def measured():
    return run_distributed(partition_workers.measurement_worker, 2)


def test_measured_lookups_per_rank_match_the_report(measured):
    """Statistics from 8 steps predict the next 8 steps' lookups on each rank within 10%,
    for the feedback plan and the table-wise one; the feedback plan is better balanced."""
    for plan in ("fdp", "table_wise"):
        for rank, result in enumerate(measured):
            r = result[plan]
            assert r["measured"] > 0, (plan, rank, r)
            assert abs(r["measured"] - r["predicted"]) <= 0.1 * r["predicted"], (plan, rank, r)
    assert measured[0]["fdp"]["max_over_mean"] < measured[0]["table_wise"]["max_over_mean"]
    assert measured[0]["fdp"]["line"] == measured[1]["fdp"]["line"]  # every rank planned the same
    # The statistics are the global batch's: both ranks' bags.
    stats = measured[0]["statistics"]
    assert stats["world_size"] == 2 and stats["tables"][0]["bags_per_batch"] == 2 * partition_workers.BATCH


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    return run_distributed(partition_workers.reshard_worker, 2, str(tmp_path_factory.mktemp("reshard")))


@pytest.mark.parametrize("backend", ["fbgemm", "triton"])
def test_reshard_in_mid_training_changes_nothing(resharded, backend):
    for rank, results in enumerate(resharded):
        r = results[backend]
        assert r["losses"] == r["reference_losses"], (rank, r["losses"], r["reference_losses"])
        for table, weights in r["reference_tables"].items():
            assert torch.equal(r["loaded"][table], r["saved"][table]), (rank, table)  # the load restored the save
            assert torch.equal(r["tables"][table], weights), (rank, table)
            assert not torch.equal(r["saved"][table], weights)  # and training went on after it
