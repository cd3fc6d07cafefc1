"""The backward as CUDA graphs for small batches (``ops.backward_graphs``).

On the CPU the padded path runs eagerly (``BackwardGraphs(capture=False)``): padding a batch
to its bucket must not change one bit of the step. The graphs themselves run on the device
(``-m gpu``)."""

import dataclasses

import pytest
import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops.backward_graphs import BUCKET_MULTIPLE, BackwardGraphs, describe, padded_ids
from tbe_plugin.ops.backward_launch import RunsLaunch
from tests.helpers import assert_bitwise_equal, make_bags

SPECS = [(23, 8), (9, 20), (30, 4)]
FTM = [0, 1, 2, 0]
GRAPHED = RunsLaunch(graph_max_ids=1 << 20, graph_grad_in_place=False, graph_fill=False)  # gradient copied in
IN_PLACE = RunsLaunch(graph_max_ids=1 << 20, graph_grad_in_place=True, graph_fill=False)  # filled by launches
FILLED = RunsLaunch(graph_max_ids=1 << 20, graph_grad_in_place=True, graph_fill=True)  # inputs filled in the graph
EAGER = RunsLaunch(graph_max_ids=0)


def test_buckets_cover_every_size_with_bounded_padding():
    previous = 0
    for n in list(range(1, 5000, 37)) + [65_536, 327_680, 1_000_000, 1 << 20]:
        bucket = padded_ids(n)
        assert bucket >= n and bucket % BUCKET_MULTIPLE == 0 and bucket >= previous
        if n > 8 * BUCKET_MULTIPLE:
            assert bucket <= 1.19 * n + BUCKET_MULTIPLE  # one step of 2**(1/4), then a multiple of 1024
        previous = bucket
    assert len({padded_ids(n) for n in range(300_000, 400_000, 1000)}) <= 3  # a few graphs for a range of sizes


def build(optimizer, dtype="FP32", pooling="SUM", specs=SPECS, **kwargs):
    emb = TritonTableBatchedEmbeddingBags(specs, feature_table_map=FTM, optimizer=optimizer, pooling_mode=pooling,
                                          weights_precision=dtype, learning_rate=0.05, **kwargs)  # fmt: skip
    torch.manual_seed(0)
    emb.init_embedding_weights_uniform(-1.0, 1.0)
    return emb


def train_pair(optimizer, dtype="FP32", pooling="SUM", weighted=False, steps=3, specs=SPECS, launch=GRAPHED,
               **kwargs):  # fmt: skip
    """Two modules from the same weights, one plain, one through the padded path (under
    ``launch``), on the same batches of different sizes, the learning rate changed between
    steps; returns both and the per-sample-weight gradients of each step."""
    plain, padded = (build(optimizer, dtype, pooling, specs, **kwargs) for _ in range(2))
    padded.backward_launch = launch
    padded.backward_graphs = BackwardGraphs(capture=False)
    rows = [specs[t][0] for t in FTM]
    psw_grads = []
    for step in range(steps):
        indices, offsets = make_bags(rows, B=3 + step, max_len=6, seed=step, hot_fraction=0.5)
        psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)) if weighted else None
        grads = []
        for emb in (plain, padded):
            emb.set_learning_rate(0.05 / (step + 1))
            weights = psw.clone().requires_grad_() if weighted else None
            out = emb(indices, offsets, weights)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step)).to(out.dtype))
            grads.append(weights.grad if weighted else None)
        psw_grads.append(grads)
    return plain, padded, psw_grads


@pytest.mark.parametrize(
    "optimizer, dtype, pooling, weighted",
    [("EXACT_ROWWISE_ADAGRAD", "FP32", "SUM", False), ("ADAM", "FP32", "MEAN", True),
     ("LAMB", "FP16", "SUM", True), ("EXACT_ADAGRAD", "FP32", "NONE", False)],
    ids=["rowwise", "adam-mean-weighted", "lamb-fp16-rounding", "adagrad-unpooled"],
)  # fmt: skip
def test_padding_to_the_bucket_changes_nothing(optimizer, dtype, pooling, weighted):
    """Bitwise the same tables, states and per-sample-weight gradients as the plain path
    (the padding sorts last as the sentinel row; the real ids keep their sorted positions),
    with the learning rate, step count and rounding seed read from the device vector."""
    kwargs = {"stochastic_rounding": True} if dtype == "FP16" else {}
    specs = SPECS if pooling != "NONE" else [(23, 8), (9, 8), (30, 8)]  # unpooled: one D
    plain, padded, psw_grads = train_pair(optimizer, dtype, pooling, weighted, specs=specs, **kwargs)
    assert_bitwise_equal(plain, padded)
    assert not torch.equal(plain.weights, build(optimizer, dtype, pooling, specs, **kwargs).weights)  # it trained
    for a, b in psw_grads:
        assert (a is None and b is None) or torch.equal(a, b)
    assert len(padded.backward_graphs) >= 1  # the padded path was taken


def test_padded_path_with_the_marks_in_the_operands_changes_nothing():
    """``RunsLaunch.marks_in_operands`` on a graph's padded batch (the padding sorts last as
    the sentinel row, past the valid ids the marks end at): bitwise the plain path's step."""
    launch = dataclasses.replace(FILLED, marks_in_operands=True, piece_short=2)
    plain, padded, _ = train_pair("PARTIAL_ROWWISE_ADAM", launch=launch)
    assert_bitwise_equal(plain, padded)
    assert len(padded.backward_graphs) >= 1


def test_when_the_padded_path_applies():
    graphs = BackwardGraphs(capture=False)
    ids, offsets = torch.zeros(10, dtype=torch.int64), torch.tensor([0, 4, 10])
    assert graphs.applies(RunsLaunch(graph_max_ids=10), ids, offsets)
    assert not graphs.applies(RunsLaunch(graph_max_ids=9), ids, offsets)  # too many ids
    assert graphs.applies(RunsLaunch(), ids, offsets)  # the default graphs small batches
    assert graphs.applies(None, ids, offsets)
    assert not graphs.applies(EAGER, ids, offsets)
    assert not graphs.applies(RunsLaunch(graph_max_ids=10), ids[:0], torch.tensor([0, 0, 0]))  # empty batch
    assert not BackwardGraphs(capture=True).applies(RunsLaunch(graph_max_ids=10), ids, offsets)  # CPU: no graphs
    with pytest.raises(ValueError, match="graph_max_ids"):
        RunsLaunch(graph_max_ids=-1)
    with pytest.raises(ValueError, match="graph_fill needs graph_grad_in_place"):
        RunsLaunch(graph_fill=True, graph_grad_in_place=False)
    with pytest.raises(ValueError, match="max_graphs"):
        BackwardGraphs(max_graphs=0)


@pytest.mark.parametrize("optimizer, pooling, weighted", [("EXACT_ROWWISE_ADAGRAD", "SUM", False),
                                                       ("PARTIAL_ROWWISE_ADAM", "MEAN", True)])  # fmt: skip
def test_gradient_read_in_place_changes_nothing(optimizer, pooling, weighted):
    """``graph_grad_in_place``: the padded path's kernels read each step's output gradient
    through the address cell (a new gradient tensor every step) instead of a copy: bitwise
    the plain step, per-sample-weight gradients included."""
    plain, padded, psw_grads = train_pair(optimizer, "FP32", pooling, weighted, launch=IN_PLACE)
    assert_bitwise_equal(plain, padded)
    for a, b in psw_grads:
        assert (a is None and b is None) or torch.equal(a, b)
    entries = list(padded.backward_graphs._entries.values())
    assert entries and all(e.grad_cell is not None and e.grad_output.numel() == 0 for e in entries)


@pytest.mark.parametrize("optimizer, dtype, pooling, weighted, index_dtype",
                         [("EXACT_ROWWISE_ADAGRAD", "FP32", "SUM", False, torch.int64),
                          ("LAMB", "FP16", "MEAN", True, torch.int32)])  # fmt: skip
def test_inputs_filled_inside_the_graph_change_nothing(optimizer, dtype, pooling, weighted, index_dtype):
    """``graph_fill``: one step vector copied a step (the inputs' addresses, the id count,
    the hyperparameters) and a kernel that fills the buffers from it give bitwise the plain
    step, batches of different sizes in one bucket (the padding zeroed again each step),
    int32 and int64 ids, per-sample-weight gradients, fp16 stochastic rounding (its seed read
    from the vector) and a learning rate changed every step."""
    kwargs = {"stochastic_rounding": True} if dtype == "FP16" else {}
    plain, filled = (build(optimizer, dtype, pooling, **kwargs) for _ in range(2))
    filled.backward_launch = FILLED
    filled.backward_graphs = BackwardGraphs(capture=False)
    rows = [SPECS[t][0] for t in FTM]
    counts = []
    for step, max_len in enumerate((8, 3, 6)):  # the longest first: later steps find stale ids past their count
        indices, offsets = make_bags(rows, B=5, max_len=max_len, seed=step, hot_fraction=0.5)
        counts.append(indices.numel())
        indices, offsets = indices.to(index_dtype), offsets.to(index_dtype)
        psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)) if weighted else None
        grad = None
        grads = []
        for emb in (plain, filled):
            emb.set_learning_rate(0.05 / (step + 1))
            weights = psw.clone().requires_grad_() if weighted else None
            out = emb(indices, offsets, weights)
            if grad is None:
                grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step)).to(out.dtype)
            out.backward(grad.clone())
            grads.append(weights.grad if weighted else None)
        assert (grads[0] is None and grads[1] is None) or torch.equal(*grads)
    assert_bitwise_equal(plain, filled)
    assert not torch.equal(plain.weights, build(optimizer, dtype, pooling, **kwargs).weights)  # it trained
    entries = list(filled.backward_graphs._entries.values())
    assert entries and all(e.step is not None and e.grad_cell.data_ptr() == e.step.data_ptr() + 24 for e in entries)
    assert len(entries) == 1 and len(set(counts)) == 3  # one bucket's buffers, refilled for three id counts


def test_kernels_read_the_gradient_at_the_cells_address(monkeypatch):
    """With a cell, the kernels read the gradient at the cell's address, not the tensor
    passed (which gives only shape, strides and type): zeros passed and the real gradient's
    address in the cell train as the real gradient passed does, per-sample-weight gradient
    included; the chunk design refuses a cell."""
    from tbe_plugin.ops import training
    from tbe_plugin.ops.embedding_backward import backward_update

    def through_cell(grad_output, *args, **kwargs):  # kwargs: the forward's plan
        cell = torch.tensor([grad_output.data_ptr()], dtype=torch.int64)
        return backward_update(torch.zeros_like(grad_output), *args, grad_cell=cell, **kwargs)

    rows = [SPECS[t][0] for t in FTM]
    indices, offsets = make_bags(rows, B=5, max_len=6, seed=4, hot_fraction=0.5)
    psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(4))
    modules, psw_grads = [], []
    for patched in (False, True):
        emb = build("EXACT_ROWWISE_ADAGRAD")
        emb.backward_launch = EAGER
        if patched:
            monkeypatch.setattr(training, "backward_update", through_cell)
        weights = psw.clone().requires_grad_()
        out = emb(indices, offsets, weights)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(4)))
        modules.append(emb)
        psw_grads.append(weights.grad)
    assert_bitwise_equal(*modules)
    assert torch.equal(*psw_grads)
    assert not torch.equal(modules[0].weights, build("EXACT_ROWWISE_ADAGRAD").weights)
    emb = build("EXACT_ROWWISE_ADAGRAD")
    emb.backward_launch = RunsLaunch(design="chunks", graph_max_ids=0)
    with pytest.raises(ValueError, match="grad_cell is for the pieces design"):
        emb(indices, offsets).sum().backward()


def test_least_recently_used_buckets_are_dropped():
    emb = build("EXACT_SGD")
    emb.backward_launch = GRAPHED
    emb.backward_graphs = BackwardGraphs(max_graphs=2, capture=False)
    rows = [SPECS[t][0] for t in FTM]
    for B in (1, 300, 700, 300):  # buckets 1024, 2048, 3072 (the first dropped), 2048 again
        indices, offsets = make_bags(rows, B=B, max_len=4, seed=B)
        emb(indices, offsets).sum().backward()
    assert describe(emb.backward_graphs)["buckets"] == sorted({padded_ids(n) for n in (
        int(make_bags(rows, B=B, max_len=4, seed=B)[0].numel()) for B in (700, 300))})  # fmt: skip
    assert len(emb.backward_graphs) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer, dtype, weighted, launch", [("EXACT_ROWWISE_ADAGRAD", "FP32", False, GRAPHED),
                                                                ("ADAM", "FP16", True, GRAPHED),
                                                                ("EXACT_ROWWISE_ADAGRAD", "FP32", True, IN_PLACE),
                                                                ("ADAM", "FP16", True, FILLED),
                                                                ("EXACT_ROWWISE_ADAGRAD", "FP32", False,
                                                                 dataclasses.replace(FILLED, marks_in_operands=True))],
                         ids=["copy", "copy-adam-fp16", "in-place", "filled-adam-fp16", "filled-marks"])  # fmt: skip
def test_graphed_backward_is_the_eager_one_on_cuda(optimizer, dtype, weighted, launch):
    """On the device: batches of B=512 (Zipf ids, two sizes sharing a bucket and one of
    another) through captured graphs give bitwise the eager step's tables, states and
    per-sample-weight gradients, with the learning rate changed every step (read by the
    graph from the device vector) and fp16 stochastic rounding (its seed likewise); also
    with the graphs reading each step's output gradient (a new tensor every step) in place,
    and with the inputs filled inside the graph (``graph_fill``)."""
    rows, dims = [100_000, 50_000, 20_000], [128, 64, 32]
    modules = []
    for graphed in (False, True):
        emb = TritonTableBatchedEmbeddingBags(list(zip(rows, dims)), optimizer=optimizer, weights_precision=dtype,
                                              stochastic_rounding=dtype == "FP16", learning_rate=0.01, device="cuda")
        with torch.no_grad():
            emb.weights.copy_(torch.rand(emb.weights.shape, generator=torch.Generator().manual_seed(0)).cuda() - 0.5)
        emb.backward_launch = launch if graphed else EAGER
        modules.append(emb)
    generator = torch.Generator().manual_seed(1)
    for step, L in enumerate((20, 21, 20, 9, 20)):
        B = 512
        lengths = torch.randint(L // 2, L + L // 2 + 1, (3 * B,), generator=generator)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda()
        ranks = torch.distributions.Pareto(1.0, 0.2).sample((int(lengths.sum()),)).long() - 1
        feature = torch.repeat_interleave(torch.arange(3), lengths.view(3, B).sum(1))
        indices = (ranks % torch.tensor(rows)[feature]).cuda()
        psw = torch.rand(indices.numel(), generator=generator).cuda() if weighted else None
        grad = torch.randn(B, sum(dims), generator=generator).cuda()
        psw_grads = []
        for emb in modules:
            emb.set_learning_rate(0.01 * (1 + step))
            weights = psw.clone().requires_grad_() if weighted else None
            emb(indices, offsets, weights).backward(grad.to(emb.output_dtype))
            psw_grads.append(weights.grad if weighted else None)
        torch.cuda.synchronize()
        assert_bitwise_equal(*modules)
        if weighted:
            assert torch.equal(*psw_grads)
    info = describe(modules[1].backward_graphs)
    assert info["replays"] >= 2 and info["captured"] >= 1, info
