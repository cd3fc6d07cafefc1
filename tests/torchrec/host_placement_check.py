"""``python -m tests.torchrec.host_placement_check``: plans chosen by ``RankMaxHostPartitioner``
(hosts of row-shard groups by the hottest rank they make) built by TorchRec's DMP on gloo
ranks, 2 per host, give the same pooled outputs as the unsharded tables.

A manual check, not collected by pytest (two spawns of 4 and 6 ranks take about a minute
on 2 cores); ``test_partition.test_rank_max_host_placement_avoids_colliding_hot_row_blocks``
plans the same tables without building them. At 4 ranks table c goes to host 0, where
TorchRec's own rule (least host total) would put it on host 1.
"""

import os
from typing import Any, Dict

import torch
import torch.distributed as dist

LOCAL_WORLD_SIZE = 2
TABLE_NAMES = ("a", "b", "c")


def scenario():
    """The statistics of the test: a hot in row block 1, b and c in row block 0."""
    from tests.torchrec.test_partition import stats, table

    return stats(table("a", 1000, 8, 10.0, heavy=[(900, 950.0)]), table("b", 1000, 8, 8.0, heavy=[(100, 760.0)]),
                 table("c", 1000, 8, 6.0, heavy=[(100, 570.0)]))  # fmt: skip


def worker(rank: int, world_size: int, grid: bool) -> Dict[str, Any]:
    """Plans a, b, c table-row-wise (c grid of 2 column blocks when ``grid``) with the
    rank_max rule, builds the DMP, and compares its pooled outputs on this rank's batch
    with ``embedding_bag`` over the gathered full tables."""
    # run_distributed gives one host; TorchRec reads the host size from the environment.
    os.environ.update(LOCAL_WORLD_SIZE=str(LOCAL_WORLD_SIZE), LOCAL_RANK=str(rank % LOCAL_WORLD_SIZE))
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec.cost import CostModel, KernelSpeed
    from tbe_plugin.torchrec.partition import TableSplit, meta_collection, plan_splits

    s = scenario()
    topology = Topology(world_size=world_size, local_world_size=LOCAL_WORLD_SIZE, compute_device="cpu")
    model = CostModel.from_topology(topology, KernelSpeed(1e9, 1e9, "check"), rank_batch_size=100)
    splits = {t.name: TableSplit("table_row_wise", t.dim, 0.0, 0.0) for t in s.tables}
    if grid:
        splits["c"] = TableSplit("grid_shard", 4, 0.0, 0.0)
    sharders = get_sharders("fbgemm")
    result = plan_splits(meta_collection(s), sharders, topology, s, model, "fused", splits, "check", "rank_max")
    torch.manual_seed(0)
    dmp = DistributedModelParallel(meta_collection(s), env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=ShardingPlan(result.plan.plan), device=torch.device("cpu"),
                                   sharders=sharders)  # fmt: skip
    full = {}
    for key, value in dmp.state_dict().items():
        whole = torch.zeros(tuple(value.size()))
        for shard in value.local_shards():
            (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            whole[r0:r0 + n, c0:c0 + m] = shard.tensor.detach()
        dist.all_reduce(whole)  # shards do not overlap: the sum is the table
        full[key.split(".")[-2]] = whole
    generator = torch.Generator().manual_seed(rank)
    lengths = [torch.randint(0, 6, (16,), generator=generator) for _ in TABLE_NAMES]
    ids = [torch.randint(0, 1000, (int(n.sum()),), generator=generator) for n in lengths]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{t}" for t in TABLE_NAMES], values=torch.cat(ids),
                                              lengths=torch.cat(lengths))  # fmt: skip
    pooled = dmp(kjt).to_dict()
    worst = 0.0
    for name, bag_lengths, bag_ids in zip(TABLE_NAMES, lengths, ids):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), bag_lengths.cumsum(0)[:-1]])
        reference = torch.nn.functional.embedding_bag(bag_ids, full[name], offsets, mode="sum")
        worst = max(worst, (pooled[f"f_{name}"] - reference).abs().max().item())
    placed = sorted((sh.table, sh.first_col, sh.first_row, sh.rank) for sh in result.shards)
    return {"placed": placed, "max_abs_diff": worst}


def main() -> None:
    from tbe_plugin.benchmarks.report import git_state
    from tests.torchrec.distributed import run_distributed

    state = git_state()
    print(f"commit {state['git_commit'][:7]} (dirty: {state['git_dirty']})")
    for world_size, grid in ((4, False), (6, True)):
        results = run_distributed(worker, world_size, grid)
        same = all(r["placed"] == results[0]["placed"] for r in results)
        diffs = [f"{r['max_abs_diff']:.1e}" for r in results]
        print(f"{world_size} ranks, c {'grid' if grid else 'table-row-wise'}: (table, first col, first row, rank) "
              f"{results[0]['placed']}; same plan on every rank: {same}; max |DMP - embedding_bag| per rank "
              f"{diffs}")  # fmt: skip


if __name__ == "__main__":
    main()
