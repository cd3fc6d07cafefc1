"""What each gloo rank runs in the partitioning tests (imported by spawned processes):
statistics, a planned DMP's measured lookups per rank against the report's prediction,
and a re-shard through torch.distributed.checkpoint in mid-training."""

import copy
import os
from typing import Any, Dict, List

import numpy as np
import torch
import torch.distributed as dist

# (name, rows, dim, mean ids per bag, zipf exponent): t0 is hot (long bags, one row
# drawing a third of them), the others light. Dims split in two stay multiples of 4.
TABLES = [("t0", 512, 16, 12.0, 1.3), ("t1", 300, 8, 2.0, 1.1), ("t2", 400, 16, 3.0, 1.2), ("t3", 256, 8, 1.5, 1.1)]
BATCH = 48
LR = 0.01


def batch(rank: int, step: int, bags: int = BATCH):
    """This rank's batch at ``step``: ``bags`` bags per feature, Poisson bag lengths, Zipf
    ids, row 5 of t0 hot."""
    from torchrec import KeyedJaggedTensor

    rng = np.random.default_rng([rank, step, 17])
    lengths, values = [], []
    for name, rows, _, pooling, alpha in TABLES:
        bag_lengths = rng.poisson(pooling, bags)
        ids = (rng.zipf(alpha, int(bag_lengths.sum())) * 7919) % rows
        if name == "t0":
            ids[rng.random(ids.size) < 0.33] = 5
        lengths.append(bag_lengths)
        values.append(ids)
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f{n[1:]}" for n, *_ in TABLES],
                                               values=torch.tensor(np.concatenate(values)),
                                               lengths=torch.tensor(np.concatenate(lengths)))  # fmt: skip


def make_ebc(device: str = "meta", optimizer: str = "sgd"):
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    configs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f{n[1:]}"])
               for n, r, d, _, _ in TABLES]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device(device))
    if device == "meta":
        optimizer_class, kwargs = {"sgd": (torch.optim.SGD, {"lr": LR}),
                                   "rowwise_adagrad": (RowWiseAdagrad, {"lr": LR, "eps": 1e-8})}[optimizer]  # fmt: skip
        _apply_optimizer_in_backward(optimizer_class, ebc.embedding_bags.parameters(), kwargs)
    return ebc


def make_dmp(backend: str, plan: Dict[str, Any], optimizer: str = "sgd"):
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from tbe_plugin.torchrec import get_sharders

    plan = copy.deepcopy(plan)
    for parameter_sharding in plan.values():
        parameter_sharding.compute_kernel = {"triton": "fused_triton", "fbgemm": "fused"}[backend]
    return DistributedModelParallel(make_ebc(optimizer=optimizer), env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    plan=ShardingPlan({"": plan}), device=torch.device("cpu"),
                                    sharders=get_sharders(backend))  # fmt: skip


def full_tables(dmp) -> Dict[str, torch.Tensor]:
    """Every table whole on every rank: local shards written into zeros, summed over
    ranks (shards do not overlap, so the sum is exact)."""
    out = {}
    for key, value in dmp.state_dict().items():
        table = key.split(".")[-2]
        rows, dim = value.size()
        full = torch.zeros(rows, dim)
        for shard in value.local_shards():
            (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            full[r0:r0 + n, c0:c0 + m] = shard.tensor.detach()
        dist.all_reduce(full)
        out[table] = full
    return out


def set_tables(dmp, full: Dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            for shard in value.local_shards():
                (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(full[key.split(".")[-2]][r0:r0 + n, c0:c0 + m])


def train(dmp, rank: int, steps: range, bags: int) -> List[float]:
    """Losses of ``steps``; the loss sums the features in name order, each made
    contiguous, so its arithmetic does not depend on the plan's output order."""
    losses = []
    for step in steps:
        pooled = dmp(batch(rank, step, bags)).to_dict()
        loss = sum((pooled[k].contiguous() ** 2).sum() for k in sorted(pooled)) / 2
        loss.backward()
        losses.append(loss.item())
    return losses


def fixed_plan(assignment: Dict[str, Any]) -> Dict[str, Any]:
    from torchrec.distributed import sharding_plan as sp

    generators = {"tw0": sp.table_wise(rank=0), "tw1": sp.table_wise(rank=1), "cw01": sp.column_wise(ranks=[0, 1]),
                  "cw10": sp.column_wise(ranks=[1, 0]), "rw": sp.row_wise()}  # fmt: skip
    return dict(sp.construct_module_sharding_plan(make_ebc(), {t: generators[g] for t, g in assignment.items()},
                                                  local_size=2, world_size=2, device_type="cpu"))  # fmt: skip


# Plan B moves every table that plan A does not split by rows: whole tables to the other
# rank, the column shards' ranks swapped, and (FBGEMM) a whole table cut into columns. On
# Triton a table keeps its width and only moves: cut from 8 columns into two of 4, t1's
# weights came out different in the last bits after the same steps (observed at 1c2f716),
# so a column re-split is a change of arithmetic there, not only of placement.
PLAN_A = {"t0": "cw01", "t1": "tw0", "t2": "tw1", "t3": "rw"}
PLAN_B = {"fbgemm": {"t0": "cw10", "t1": "cw01", "t2": "tw0", "t3": "rw"},
          "triton": {"t0": "cw10", "t1": "tw1", "t2": "tw0", "t3": "rw"}}
RESHARD_BAGS = 8


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return isinstance(value, torch.Tensor) or hasattr(value, "local_shards")


def checkpoint_state(dmp) -> Dict[str, Any]:
    """The model and, when it has any state (SGD has none: DCP drops an empty one and
    then cannot find it), the fused optimizer."""
    state = {"model": dmp.state_dict()}
    optim = dmp.fused_optimizer.state_dict()
    if _holds_tensors(optim["state"]):
        state["optim"] = optim
    return state


def reshard_worker(rank: int, world_size: int, directory: str, backends=("fbgemm", "triton"),
                   steps: int = 3, reshard_at: int = 2) -> Dict[str, Any]:
    """Per backend: ``steps`` steps under plan A from fixed weights (the reference); then
    again, saving with DCP after ``reshard_at`` steps, loading into a DMP under plan B and
    training on. The losses, the weights at the end and the plans' sharding types."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    initial = {n: torch.randn(r, d) * 0.1 for n, r, d, _, _ in TABLES}
    plan_a = fixed_plan(PLAN_A)
    results = {}
    for backend in backends:
        plan_b = fixed_plan(PLAN_B[backend])
        reference = make_dmp(backend, plan_a)
        set_tables(reference, initial)
        reference_losses = train(reference, rank, range(steps), RESHARD_BAGS)
        first = make_dmp(backend, plan_a)
        set_tables(first, initial)
        losses = train(first, rank, range(reshard_at), RESHARD_BAGS)
        path = os.path.join(directory, f"reshard-{backend}")
        dcp.save(checkpoint_state(first), checkpoint_id=path)
        second = make_dmp(backend, plan_b)  # its own random weights until the load
        state = checkpoint_state(second)
        dcp.load(state, checkpoint_id=path)
        second.load_state_dict(state["model"])
        if "optim" in state:
            second.fused_optimizer.load_state_dict(state["optim"])
        loaded = full_tables(second)
        losses += train(second, rank, range(reshard_at, steps), RESHARD_BAGS)
        results[backend] = {
            "reference_losses": reference_losses, "losses": losses,
            "reference_tables": full_tables(reference), "tables": full_tables(second), "loaded": loaded,
            "saved": full_tables(first),
            "types": sorted({(n, p.sharding_type, tuple(p.ranks)) for n, p in plan_b.items()}),
        }  # fmt: skip
    return results


def count_lookups(dmp) -> List[int]:
    """Ids each forward hands this rank's lookup kernels (after the input all-to-all)."""
    counts: List[int] = []

    def hook(module, args):
        counts.append(int(args[0].values().numel()))

    for lookup in dmp.module._lookups:
        lookup.register_forward_pre_hook(hook)
    return counts


def measurement_worker(rank: int, world_size: int, observe_steps: int = 8, measure_steps: int = 8,
                       backend: str = "fbgemm") -> Dict[str, Any]:
    """Statistics over ``observe_steps`` batches (every rank's, summed), a feedback plan
    and the plain table-wise one from them, and for each the report's predicted lookups
    per rank against the ids its kernels received over the next ``measure_steps`` steps."""
    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders
    from tbe_plugin.torchrec._compat import triton_kernel
    from tbe_plugin.torchrec.cost import CostModel, KernelSpeed, default_kernel_benchmark, rank_lookups
    from tbe_plugin.torchrec.partition import feedback_plan, plan_preset
    from tbe_plugin.torchrec.stats import FeatureStatisticsCollector, tables_of_ebc

    collector = FeatureStatisticsCollector(tables_of_ebc(make_ebc("cpu")), torch.device("cpu"), sample_every=1)
    for step in range(observe_steps):
        collector.observe(batch(rank, step))
    stats = collector.statistics()
    topology = Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu")
    model = CostModel.from_topology(topology, KernelSpeed.from_benchmark(default_kernel_benchmark()), BATCH)
    sharders, kernel = get_sharders("fbgemm"), triton_kernel() if backend == "triton" else "fused"
    plans = {"fdp": feedback_plan(make_ebc(), sharders, topology, stats, model, kernel),
             "table_wise": plan_preset(make_ebc(), sharders, topology, stats, model, "table_wise", kernel)}  # fmt: skip
    out: Dict[str, Any] = {"statistics": stats.to_dict()}
    for name, result in plans.items():
        dmp = make_dmp(backend, dict(result.plan.plan[""]))
        counts = count_lookups(dmp)
        steps = range(observe_steps, observe_steps + measure_steps)
        with torch.no_grad():
            for step in steps:
                dmp(batch(rank, step))
        per_step = sum(counts) / len(steps)
        out[name] = {"predicted": rank_lookups(result.report)[rank], "measured": per_step,
                     "max_over_mean": result.report.max_over_mean, "line": result.report.line(name),
                     "types": sorted({s.sharding_type for s in result.shards})}  # fmt: skip
    return out


def main() -> None:
    """``python -m tests.torchrec.partition_workers``: the measurement on 2 gloo ranks,
    written to results/partition_cpu_measurement_<commit>.json (the commit and dirty flag)."""
    import json

    from tbe_plugin.benchmarks.report import git_state
    from tbe_plugin.torchrec.cost import RESULTS_DIR
    from tests.torchrec.distributed import run_distributed

    per_rank = run_distributed(measurement_worker, 2)
    state = git_state()
    rows = [{"rank": rank, "plan": plan, **{k: result[plan][k] for k in ("predicted", "measured", "max_over_mean", "types")},
             "error": result[plan]["measured"] / result[plan]["predicted"] - 1}
            for rank, result in enumerate(per_rank) for plan in ("fdp", "table_wise")]  # fmt: skip
    path = os.path.join(RESULTS_DIR, f"partition_cpu_measurement_{state['git_commit'][:7]}.json")
    with open(path, "w") as f:
        json.dump({**state, "what": "lookups per global batch on each rank: the report's prediction from 8 steps' "
                   "statistics against the ids the DMP's kernels received over the next 8 (2 gloo ranks, FBGEMM CPU)",
                   "rows": rows, "lines": [per_rank[0][p]["line"] for p in ("fdp", "table_wise")]}, f, indent=1)  # fmt: skip
    for row in rows:
        print(f"rank {row['rank']} {row['plan']:>10}: predicted {row['predicted']:8.1f} measured {row['measured']:8.1f} "
              f"({row['error']:+.1%})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
