"""Sharded-EBC training step time, backend=triton vs backend=fbgemm, through TorchRec.

``python -m tbe_plugin.benchmarks.sharded [--smoke] [--out DIR]`` builds one
``EmbeddingBagCollection`` (a DLRM-sized set of tables by default: 26 tables, D cycling
64..256, 1e6 rows, B=8192, L=20, uniform ids, rowwise Adagrad fused), shards it table-wise
on world size 1 with each backend's sharder (``tbe_plugin.torchrec.get_sharders``), gives
both the same weights, checks their first outputs agree, then times a training step
(forward, sum loss, backward with the fused update) alternating the backends, CUDA
events, medians. Writes DIR/sharded.json and DIR/sharded.md.
"""

import argparse
import sys

import torch

from tbe_plugin.benchmarks.common import (
    benchmark_device,
    collect_environment,
    markdown_table,
    silence_fbgemm_logging,
    summarize_ms,
    time_alternating,
    write_report,
)

BACKENDS = ("triton", "fbgemm")
KERNELS = {"triton": "fused_triton", "fbgemm": "fused"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny tables; runs on CPU")
    parser.add_argument("--tables", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--dims", default="64,96,128,160,192,224,256", help="cycled over the tables")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--pooling", type=int, default=None, help="ids per bag")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    defaults = dict(tables=3, rows=100, batch=8, pooling=3, iters=2) if args.smoke else dict(
        tables=26, rows=1_000_000, batch=8192, pooling=20, iters=20
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def build_model(args, device):
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    dims = [int(d) for d in args.dims.split(",")]
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=args.rows, embedding_dim=dims[i % len(dims)],
                           feature_names=[f"f{i}"])  # fmt: skip
        for i in range(args.tables)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.embedding_bags.parameters(), {"lr": 0.01, "eps": 1e-8})
    return ebc, tables


def shard(backend, args, device):
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from tbe_plugin.torchrec import get_sharders

    ebc, tables = build_model(args, device)
    plan = construct_module_sharding_plan(
        ebc, {t.name: table_wise(rank=0) for t in tables}, local_size=1, world_size=1, device_type=device.type
    )
    for parameter_sharding in plan.values():
        parameter_sharding.compute_kernel = KERNELS[backend]
    return DistributedModelParallel(
        ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=ShardingPlan({"": plan}),
        device=device, sharders=get_sharders(backend),
    )  # fmt: skip


def make_batches(args, device, count=3):
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        lengths = torch.full((args.tables * args.batch,), args.pooling, dtype=torch.int64)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(args.tables)], values=values, lengths=lengths
        )
        batches.append(kjt.to(device))
    return batches


def step(dmp, kjt):
    dmp(kjt).values().sum().backward()


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = benchmark_device(args.smoke)
    silence_fbgemm_logging()
    import torch.distributed as dist

    from tbe_plugin.torchrec.process_group import init_process_group

    if not dist.is_initialized():
        # World size 1: the benchmark's unit is one GPU (or, in smoke mode, the CPU).
        if init_process_group(device.type)[1] != 1:
            raise SystemExit("the sharded benchmark runs in one process; start it without torchrun")
    models = {backend: shard(backend, args, device) for backend in BACKENDS}
    models["triton"].load_state_dict(models["fbgemm"].state_dict())
    batches = make_batches(args, device)
    with torch.no_grad():
        first = {b: models[b](batches[0]).to_dict() for b in BACKENDS}
    agreement = max((first["triton"][k] - first["fbgemm"][k]).abs().max().item() for k in first["fbgemm"])
    # Warm-up (2 steps each: our kernels compile, FBGEMM sets up), then alternating rounds.
    calls = {backend: (lambda i, m=models[backend]: step(m, batches[i % len(batches)])) for backend in BACKENDS}
    samples = time_alternating(calls, iters=args.iters, warmup=2, device=device)
    results = {backend: summarize_ms(samples[backend]) for backend in BACKENDS}
    ratio = results["fbgemm"]["median_ms"] / results["triton"]["median_ms"]
    config = (
        f"T={args.tables} tables, D cycling {args.dims}, {args.rows} rows each, B={args.batch}, "
        f"L={args.pooling} uniform ids, fp32, rowwise Adagrad fused, table-wise, world size 1"
    )
    report = {
        "environment": collect_environment(device),
        "config": config,
        "method": (
            "per round both backends run one training step (forward, sum of the pooled outputs, "
            "backward with the fused update), order alternating, CUDA events, medians; both "
            "DMPs start from the same weights (fbgemm's state_dict loaded into triton's)"
        ),
        "first_step_max_abs_diff": agreement,
        "results": results,
        "ratio_fbgemm_over_triton": ratio,
        "args": vars(args),
    }
    rows = [[b] + [f"{results[b][k]:.3f}" for k in ("median_ms", "p10_ms", "p90_ms")] for b in BACKENDS]
    markdown = "\n".join([
        "# Sharded EBC training step: backend=triton vs backend=fbgemm",
        "",
        f"- device: {report['environment']['device_name']}; torch {report['environment']['torch']}, "
        f"fbgemm_gpu {report['environment']['fbgemm_gpu']}, torchrec {_torchrec_version()}",
        f"- config: {config}",
        f"- method: {report['method']}",
        f"- first outputs agree within {agreement:.2e}",
        "",
        markdown_table(["backend", "median ms", "p10 ms", "p90 ms"], rows),
        "",
        f"fbgemm / triton = {ratio:.3f} (> 1: triton faster)",
    ])  # fmt: skip
    write_report(args.out, "sharded", report, markdown)
    print(markdown)
    dist.destroy_process_group()
    return report


def _torchrec_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torchrec")


if __name__ == "__main__":
    main(sys.argv[1:])
