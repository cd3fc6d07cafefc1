"""What each gloo rank runs in the pipeline tests: a small DLRM-like model (an EBC and a
dense part, forward returning ``(loss, logits)``) trained by the pipeline and by the
reference loops, from identical starting weights."""

from typing import Any, Dict, List

import torch
import torch.distributed as dist

from tests.torchrec.workers import BATCH, LR, EPS, TABLES, make_plan, set_from_full

DENSE_IN = 3


class Model(torch.nn.Module):
    def __init__(self, device: str = "meta"):
        super().__init__()
        from torch.distributed.optim import _apply_optimizer_in_backward
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        tables = [
            EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f{n[1:]}"],
                               pooling=PoolingType[p])  # fmt: skip
            for n, r, d, p in TABLES
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
        if device == "meta":
            _apply_optimizer_in_backward(RowWiseAdagrad, self.ebc.embedding_bags.parameters(), {"lr": LR, "eps": EPS})
        generator = torch.Generator().manual_seed(1)
        width = sum(d for _, _, d, _ in TABLES)
        self.dense = torch.nn.Linear(DENSE_IN, 8)
        self.over = torch.nn.Linear(width + 8, 1)
        with torch.no_grad():
            for p in (*self.dense.parameters(), *self.over.parameters()):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)

    def forward(self, batch):
        pooled = self.ebc(batch.sparse_features)
        x = torch.cat([pooled.values(), self.dense(batch.dense_features)], dim=1)
        logits = self.over(x).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits.detach()


def make_batch(rank: int, step: int):
    """The adapter tests' sparse batch for (rank, step), with dense features and labels."""
    from torchrec.datasets.utils import Batch

    from tests.torchrec.workers import batch as sparse_batch

    g = torch.Generator().manual_seed(500_000 + 1000 * rank + step)
    return Batch(
        dense_features=torch.randn(BATCH, DENSE_IN, generator=g), sparse_features=sparse_batch(rank, step),
        labels=torch.randint(0, 2, (BATCH,), generator=g).float(),
    )  # fmt: skip


def make_trainee(backend: str, sharding_type: str, world_size: int, device: str = "cpu"):
    """A DMP of ``Model`` with the test tables' fixed weights, and its dense SGD."""
    import copy

    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from tbe_plugin.torchrec import get_sharders
    from tests.torchrec.workers import make_ebc

    plan = copy.deepcopy(make_plan(sharding_type, world_size, torch.device(device).type))
    for parameter_sharding in plan.values():
        parameter_sharding.compute_kernel = {"triton": "fused_triton", "fbgemm": "fused"}[backend]
    dmp = DistributedModelParallel(
        Model(), env=ShardingEnv.from_process_group(dist.group.WORLD), plan=ShardingPlan({"ebc": plan}),
        device=torch.device(device), sharders=get_sharders(backend),
    )  # fmt: skip
    torch.manual_seed(0)
    reference = make_ebc("cpu")
    set_from_full(dmp.module.ebc, {n: reference.embedding_bags[n].weight.detach() for n, *_ in TABLES})
    dense = [p for name, p in dmp.named_parameters() if "embedding_bags" not in name]
    return dmp, torch.optim.SGD(dense, lr=0.05)


def snapshot(dmp) -> Dict[str, torch.Tensor]:
    """Local table shards and dense parameters, flattened."""
    out = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            shards = [s.tensor.detach().flatten() for s in value.local_shards()]
            out[key] = torch.cat(shards).cpu() if shards else torch.zeros(0)
        else:
            out[key] = value.detach().cpu().clone()
    return out


def differ(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max().item() for k in a if a[k].numel()), default=0.0)


def outputs_differ(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(((x.cpu() - y.cpu()).abs().max().item() for x, y in zip(a, b)), default=0.0)


def run_pipeline(pipeline, iterator) -> List[torch.Tensor]:
    outputs = []
    while True:
        try:
            outputs.append(pipeline.progress(iterator))
        except StopIteration:
            return outputs


def plain_loop(dmp, optimizer, batches) -> List[torch.Tensor]:
    outputs = []
    for batch in batches:
        optimizer.zero_grad()
        loss, output = dmp(batch)
        loss.backward()
        optimizer.step()
        outputs.append(output)
    return outputs


def staleness_worker(
    rank: int, world_size: int, backend: str, sharding_type: str, device_type: str = "cpu", iterator_cases: bool = True
) -> Dict[str, Any]:
    """Pipeline vs plain loop (k = 0) and vs the reference (k = 1, 2), 6 batches; and the
    iterator cases: short iterators, exhaustion then a new iterator, a raising loader. On
    CUDA the pipeline gets host batches (it copies them), the loops device ones."""
    from pipelines import StalenessTrainPipeline
    from pipelines.reference import reference_train

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    host_batches = [make_batch(rank, s) for s in range(6)]
    batches = [b.to(device) for b in host_batches]

    def trainee():
        return make_trainee(backend, sharding_type, world_size, device_type)

    results: Dict[str, Any] = {}
    runs = {}
    dmp, opt = trainee()
    runs["plain"] = (plain_loop(dmp, opt, batches), snapshot(dmp))
    for k in (0, 1, 2):
        dmp, opt = trainee()
        pipeline = StalenessTrainPipeline(dmp, opt, device, staleness=k)
        runs[f"pipe{k}"] = (run_pipeline(pipeline, iter(host_batches)), snapshot(dmp))
        dmp, opt = trainee()
        runs[f"ref{k}"] = (reference_train(dmp, opt, batches, k), snapshot(dmp))
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    dmp, opt = trainee()
    runs["sparsedist"] = (run_pipeline(TrainPipelineSparseDist(dmp, opt, device), iter(host_batches)), snapshot(dmp))
    dmp, opt = trainee()
    pipeline = StalenessTrainPipeline(dmp, opt, device, staleness=1, dense_grad_lag=True)
    runs["pipe1lag"] = (run_pipeline(pipeline, iter(host_batches)), snapshot(dmp))
    dmp, opt = trainee()
    runs["ref1lag"] = (reference_train(dmp, opt, batches, 1, dense_grad_lag=True), snapshot(dmp))
    pairs = [("plain", "pipe0"), ("ref0", "pipe0"), ("sparsedist", "pipe0"), ("ref1", "pipe1"), ("ref2", "pipe2"),
             ("pipe0", "pipe1"), ("ref1lag", "pipe1lag"), ("pipe1", "pipe1lag")]  # fmt: skip
    for a, b in pairs:
        results[f"{a}~{b}"] = (outputs_differ(runs[a][0], runs[b][0]), differ(runs[a][1], runs[b][1]))
    if not iterator_cases:
        return results

    # Short iterators: fewer batches than the pipeline holds.
    for n in (0, 1, 2):
        dmp, opt = trainee()
        out = run_pipeline(StalenessTrainPipeline(dmp, opt, device, staleness=2), iter(batches[:n]))
        dmp, opt = trainee()
        ref = reference_train(dmp, opt, batches[:n], 2)
        results[f"short{n}"] = (len(out), outputs_differ(out, ref))

    # Exhaustion: StopIteration again on the spent iterator; a new one starts a new epoch.
    dmp, opt = trainee()
    pipeline = StalenessTrainPipeline(dmp, opt, device, staleness=1)
    first = iter(batches[:3])
    epoch1 = run_pipeline(pipeline, first)
    again = run_pipeline(pipeline, first)
    epoch2 = run_pipeline(pipeline, iter(batches[3:]))
    state = snapshot(dmp)
    dmp, opt = trainee()
    ref = reference_train(dmp, opt, batches[:3], 1) + reference_train(dmp, opt, batches[3:], 1)
    results["epochs"] = (
        len(epoch1), len(again), len(epoch2), outputs_differ(epoch1 + epoch2, ref), differ(state, snapshot(dmp))
    )  # fmt: skip

    # A loader that raises after 3 batches: the error propagates, drain() trains what was
    # drawn, and the model equals the reference on those batches.
    def failing():
        yield from batches[:3]
        raise RuntimeError("loader failed")

    dmp, opt = trainee()
    pipeline = StalenessTrainPipeline(dmp, opt, device, staleness=2)
    iterator, trained, error = failing(), [], None
    try:
        while True:
            trained.append(pipeline.progress(iterator))
    except RuntimeError as e:
        error = str(e)
    trained += pipeline.drain()
    state = snapshot(dmp)
    dmp, opt = trainee()
    ref = reference_train(dmp, opt, batches[:3], 2)
    results["raising"] = (error, len(trained), outputs_differ(trained, ref), differ(state, snapshot(dmp)))
    return results


def checkpoint_worker(
    rank: int, world_size: int, backend: str, sharding_type: str, directory: str
) -> Dict[str, Any]:
    """3 batches at staleness 1, ``drain()``, a ``torch.distributed.checkpoint`` save, 3
    more batches; against a fresh model that loads the checkpoint and trains the same 3
    batches in a new pipeline."""
    import os

    import torch.distributed.checkpoint as dcp

    from pipelines import StalenessTrainPipeline

    cpu = torch.device("cpu")
    batches = [make_batch(rank, s) for s in range(6)]
    path = os.path.join(directory, f"{backend}-{sharding_type}")
    dmp, opt = make_trainee(backend, sharding_type, world_size)
    pipeline = StalenessTrainPipeline(dmp, opt, cpu, staleness=1)
    iterator = iter(batches[:3])
    before = [pipeline.progress(iterator), pipeline.progress(iterator)]
    in_flight = len(pipeline.drain())  # the third batch, drawn by the second progress()
    dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=path)
    continued = run_pipeline(pipeline, iter(batches[3:]))
    expected = snapshot(dmp)

    restored, restored_opt = make_trainee(backend, sharding_type, world_size)
    initial = snapshot(restored)
    state = {"model": restored.state_dict(), "optim": restored.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=path)
    restored.load_state_dict(state["model"])
    restored.fused_optimizer.load_state_dict(state["optim"])
    resumed = run_pipeline(StalenessTrainPipeline(restored, restored_opt, cpu, staleness=1), iter(batches[3:]))
    return {
        "counts": (len(before), in_flight, len(continued), len(resumed)),
        "outputs": outputs_differ(continued, resumed),
        "state": differ(expected, snapshot(restored)),
        "moved": differ(initial, expected),
    }


def detach_worker(rank: int, world_size: int, backend: str) -> Dict[str, Any]:
    """Eval with batches in flight raises; after detach() the model's own forward equals the
    reference's model on the same batches, and a new progress() re-attaches it."""
    from pipelines import StalenessTrainPipeline

    cpu = torch.device("cpu")
    batches = [make_batch(rank, s) for s in range(5)]
    dmp, opt = make_trainee(backend, "row_wise", world_size)
    pipeline = StalenessTrainPipeline(dmp, opt, cpu, staleness=1)
    iterator = iter(batches[:4])
    pipeline.progress(iterator)  # trains batch 0; batch 1 in flight, batch 2 drawn
    dmp.eval()
    try:
        pipeline.progress(iterator)
        eval_error = None
    except RuntimeError as error:
        eval_error = str(error)
    dmp.train()
    model = pipeline.detach()  # trains batch 1, gives batch 2 back
    with torch.no_grad():
        _, detached_out = model(batches[4])
    trained_after = run_pipeline(pipeline, iterator)  # batch 2 (given back), then 3

    from pipelines.reference import reference_train

    plain, plain_opt = make_trainee(backend, "row_wise", world_size)
    reference_train(plain, plain_opt, batches[:2], 1)  # batch 1 was looked up before update 0
    with torch.no_grad():
        _, plain_out = plain(batches[4])
    reference_train(plain, plain_opt, batches[2:4], 1)
    return {
        "eval_error": eval_error,
        "detached": (detached_out - plain_out).abs().max().item(),
        "after": len(trained_after),
        "state": differ(snapshot(dmp), snapshot(plain)),
    }


def capped_worker(rank: int, world_size: int, backend: str, max_sms: int) -> Dict[str, Any]:
    """k = 1 with the sparse stream in a green context of ``max_sms`` SMs, against the
    reference: (outputs, state) differences, or the error the cap raised."""
    from pipelines import StalenessTrainPipeline
    from pipelines.reference import reference_train

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    host_batches = [make_batch(rank, s) for s in range(6)]
    dmp, opt = make_trainee(backend, "table_wise", world_size, "cuda")
    try:
        pipeline = StalenessTrainPipeline(dmp, opt, device, staleness=1, tbe_max_sms=max_sms)
        out = run_pipeline(pipeline, iter(host_batches))
    except Exception as error:  # reported, asserted by the test
        return {"error": f"{type(error).__name__}: {error}"}
    state = snapshot(dmp)
    ref_dmp, ref_opt = make_trainee(backend, "table_wise", world_size, "cuda")
    ref = reference_train(ref_dmp, ref_opt, [b.to(device) for b in host_batches], 1)
    return {"outputs": outputs_differ(out, ref), "state": differ(state, snapshot(ref_dmp))}


class ECModel(torch.nn.Module):
    """An EmbeddingCollection (one embedding per id) and a dense scale: the pipeline's
    unpooled case."""

    def __init__(self):
        super().__init__()
        from tests.torchrec.workers import make_ec

        self.ec = make_ec()
        self.scale = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, batch):
        embeddings = self.ec(batch.sparse_features)
        per_feature = torch.stack([(embeddings[f"f{t}"].values() ** 2).sum() for t in range(3)])  # fx-traceable
        loss = self.scale * per_feature.sum() / 2 + (batch.dense_features.sum() * self.scale) ** 2
        return loss, per_feature.detach()


def ec_staleness_worker(rank: int, world_size: int, backend: str) -> Dict[str, Any]:
    """An EmbeddingCollection model (row-wise) trained by the pipeline at k = 0, 1, 2 and by
    the references: (outputs, state) differences per k."""
    import copy

    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed import sharding_plan as sp
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from pipelines import StalenessTrainPipeline
    from pipelines.reference import reference_train
    from tbe_plugin.torchrec import get_sharders
    from tests.torchrec.workers import UNPOOLED_TABLES, make_ec, unpooled_batch

    torch.manual_seed(0)
    full = {n: w.weight.detach().clone() for n, w in make_ec("cpu").embeddings.items()}
    plan = sp.construct_module_sharding_plan(
        make_ec(), {n: sp.row_wise() for n, *_ in UNPOOLED_TABLES}, local_size=world_size, world_size=world_size,
        device_type="cpu",
    )  # fmt: skip
    batches = [Batch(dense_features=torch.full((1, 1), 0.1 * s), sparse_features=unpooled_batch(rank, s),
                     labels=torch.zeros(1)) for s in range(5)]  # fmt: skip

    def trainee():
        backend_plan = copy.deepcopy(dict(plan))
        for parameter_sharding in backend_plan.values():
            parameter_sharding.compute_kernel = {"triton": "fused_triton", "fbgemm": "fused"}[backend]
        dmp = DistributedModelParallel(
            ECModel(), env=ShardingEnv.from_process_group(dist.group.WORLD),
            plan=ShardingPlan({"ec": backend_plan}), device=torch.device("cpu"), sharders=get_sharders(backend),
        )  # fmt: skip
        set_from_full(dmp.module.ec, full)
        return dmp, torch.optim.SGD([dmp.module.scale], lr=0.01)

    results = {}
    for k in (0, 1, 2):
        dmp, opt = trainee()
        out = run_pipeline(StalenessTrainPipeline(dmp, opt, torch.device("cpu"), staleness=k), iter(batches))
        ref_dmp, ref_opt = trainee()
        ref = reference_train(ref_dmp, ref_opt, batches, k)
        results[k] = (outputs_differ(out, [r for r in ref]), differ(snapshot(dmp), snapshot(ref_dmp)))
        results[f"moved{k}"] = differ(snapshot(dmp), snapshot(trainee()[0]))
    return results
