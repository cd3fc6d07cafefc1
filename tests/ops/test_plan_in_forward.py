"""RunsLaunch.plan_in_forward: the backward's id-only part (``plan_backward``) made in the
forward (on CUDA on a side stream) trains bitwise like the same part made in the backward,
in every pooling, with per-sample weights and their gradient, and in a staleness order
(two lookups, then their backwards); a plan made for another gradient layout is made again;
made by the plan thread (``RunsLaunch.plan_thread``), the same, its errors raised by the backward."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops import embedding_backward, training
from tbe_plugin.ops.backward_launch import runs_launch
from tbe_plugin.ops.embedding_backward import plan_backward
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import build

IN_BACKWARD = dataclasses.replace(runs_launch(), plan_in_forward=False, graph_max_ids=0)
IN_FORWARD = dataclasses.replace(runs_launch(), plan_in_forward=True, graph_max_ids=0)  # by the plan thread
ON_TRAINING_THREAD = dataclasses.replace(IN_FORWARD, plan_thread=False)
ON_CURRENT_STREAM = dataclasses.replace(IN_FORWARD, plan_side_stream=False)  # by the training thread, at once


def _counting_plans(monkeypatch):
    """Counts the calls of ``plan_backward`` (a list of one), the forward's and the backward's."""
    calls, original = [0], embedding_backward.plan_backward

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(training, "plan_backward", counted)
    monkeypatch.setattr(embedding_backward, "plan_backward", counted)
    return calls


@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True), ("NONE", False)])
def test_plan_in_forward_trains_like_the_plan_in_backward(monkeypatch, pooling, weighted):
    calls = _counting_plans(monkeypatch)
    modules, psw_grads = [], []
    for launch in (IN_BACKWARD, IN_FORWARD, ON_TRAINING_THREAD, ON_CURRENT_STREAM):
        emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling)
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        grads = []
        for step in range(2):
            indices, offsets = make_bags(rows, B=5, max_len=6, seed=10 + step, hot_fraction=0.5)
            psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)).requires_grad_(weighted)
            before = calls[0]
            out = emb(indices, offsets, psw if weighted else None)
            assert calls[0] - before == (1 if launch.plan_in_forward else 0)  # planned in the forward, or not
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
            assert calls[0] - before == 1  # one plan a step: the backward used the forward's
            grads.append(psw.grad)
        modules.append(emb)
        psw_grads.append(grads)
    for module in modules[1:]:
        assert_bitwise_equal(modules[0], module)
    assert not torch.equal(modules[0].weights, build("EXACT_ROWWISE_ADAGRAD", pooling=pooling).weights)  # trained
    if weighted:
        assert all(all(torch.equal(grads[0], g) for g in grads[1:]) for grads in zip(*psw_grads))
        assert psw_grads[0][0].abs().sum() > 0


def test_staleness_order_two_lookups_then_their_backwards():
    """Batch 1 looked up before batch 0's update (a pipeline's order): each backward uses its own plan."""
    modules = []
    for launch in (IN_BACKWARD, IN_FORWARD):
        emb = build("ADAM")
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        batches = [make_bags(rows, B=4, max_len=7, seed=20 + b, hot_fraction=0.6) for b in range(2)]
        outs = [emb(*batch) for batch in batches]
        for b, out in enumerate(outs):
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(b)))
        modules.append(emb)
    assert_bitwise_equal(*modules)


def test_a_plan_for_another_gradient_layout_is_made_again():
    """A plan made for an output gradient of another row stride is not used: the update
    plans again and trains as without a plan (a plan of that stride would read other rows)."""
    plain, given = build("EXACT_ROWWISE_ADAGRAD"), build("EXACT_ROWWISE_ADAGRAD")
    rows = [plain.table_rows[t] for t in plain.feature_table_map]
    indices, offsets = make_bags(rows, B=4, max_len=5, seed=3, hot_fraction=0.4)
    plain.backward_launch = given.backward_launch = IN_BACKWARD
    out = plain(indices, offsets)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(grad)
    max_dim, total_rows, _, pooling, check, optimizer = given._training_config()[:6]
    wrong = plan_backward(given.feature_meta, total_rows, indices, offsets, None, False, pooling, check, optimizer,
                          (grad.shape[0], grad.shape[1] + 8), IN_BACKWARD, given._row_classes)  # fmt: skip
    given._fused_backward(grad, indices, offsets, None, False, training.EarlyPlan(wrong, None))
    assert_bitwise_equal(plain, given)
    assert not torch.equal(plain.weights, build("EXACT_ROWWISE_ADAGRAD").weights)


def test_no_plan_for_a_graphed_batch_or_when_off():
    """A batch that will take a captured graph plans in it; the option off plans nothing ahead."""
    emb = build("EXACT_ROWWISE_ADAGRAD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=4, max_len=5, seed=5)
    args = (indices, offsets, None, False, emb(indices, offsets))
    emb.backward_launch = IN_FORWARD
    assert isinstance(emb._plan_backward(*args), training.EarlyPlan)
    emb.backward_launch = IN_BACKWARD
    assert emb._plan_backward(*args) is None
    emb.backward_launch = dataclasses.replace(IN_FORWARD, graph_max_ids=1 << 20)
    emb.backward_graphs.capture = False  # the CPU test mode of the graphs: they apply
    assert emb._plan_backward(*args) is None


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_a_plan_by_the_plan_thread_trains_like_the_plan_in_backward(monkeypatch, pooling):
    """RunsLaunch.plan_thread: the forward's plan made by the host thread, taken by the
    backward (one plan a step, made in that thread), bitwise the plan made in the backward."""
    import threading

    threads, original = [], embedding_backward.plan_backward

    def spied(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(training, "plan_backward", spied)
    modules = []
    for launch in (IN_BACKWARD, dataclasses.replace(IN_FORWARD, plan_thread=True)):
        emb = build("EXACT_ROWWISE_ADAGRAD", pooling=pooling)
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        for step in range(2):
            out = emb(*make_bags(rows, B=5, max_len=6, seed=10 + step, hot_fraction=0.5))
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
        modules.append(emb)
    assert_bitwise_equal(*modules)
    assert not torch.equal(modules[0].weights, build("EXACT_ROWWISE_ADAGRAD", pooling=pooling).weights)
    assert len(threads) == 2 and all(name.startswith("tbe_plugin_plan") for name in threads)


def test_an_error_in_the_plan_thread_is_raised_by_the_backward(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("the plan failed")

    monkeypatch.setattr(training, "plan_backward", failing)
    emb = build("EXACT_ROWWISE_ADAGRAD")
    emb.backward_launch = dataclasses.replace(IN_FORWARD, plan_thread=True)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    out = emb(*make_bags(rows, B=4, max_len=6, seed=3, hot_fraction=0.5))  # the forward returns
    with pytest.raises(RuntimeError, match="the plan failed"):
        out.backward(torch.ones(out.shape))


def test_the_plan_thread_is_the_default_and_only_for_the_plan_in_forward(monkeypatch):
    """On by default; with the plan in the backward (``plan_in_forward=False``) no plan goes
    to the thread: the backward makes it on the training thread; nor with the plan on the
    current stream (``plan_side_stream=False``): the forward makes it on the training thread."""
    import threading

    assert runs_launch().plan_thread and runs_launch().plan_in_forward
    threads, original = [], embedding_backward.plan_backward

    def spied(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(training, "plan_backward", spied)  # the forward's
    monkeypatch.setattr(embedding_backward, "plan_backward", spied)  # the backward's own
    emb = build("EXACT_ROWWISE_ADAGRAD")
    emb.backward_launch = dataclasses.replace(IN_BACKWARD, plan_thread=True)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    out = emb(*make_bags(rows, B=4, max_len=6, seed=3, hot_fraction=0.5))
    assert threads == []  # nothing planned in the forward
    out.backward(torch.ones(out.shape))
    assert threads == [threading.current_thread().name]
    emb.backward_launch = ON_CURRENT_STREAM  # planned in the forward, at once, by the training thread
    emb(*make_bags(rows, B=4, max_len=6, seed=4, hot_fraction=0.5)).backward(torch.ones(out.shape))
    assert threads == [threading.current_thread().name] * 2


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_plan_on_a_side_stream_trains_like_the_plan_in_backward(optimizer):
    """CUDA, Zipf(1.15) ids (B=16384, 983k ids, D 16/128/400): the plan runs on a side stream
    beside a long matmul on the current one, two lookups before their backwards; the tables
    and states are bitwise those of the plan made in the backward, run after run."""
    rows, dims, B, L = [200_000, 1_000_000, 50_000], [16, 128, 400], 16384, 20
    torch.manual_seed(0)
    ranks = torch.distributions.Pareto(1.0, 0.15).sample((2, 3 * B * L)).long() - 1
    batches = []
    for b in range(2):
        ids = torch.cat([ranks[b, f * B * L : (f + 1) * B * L] % rows[f] for f in range(3)]).cuda()
        batches.append((ids, torch.arange(0, 3 * B * L + 1, L, device="cuda")))
    grads = [torch.rand(B, sum(dims), device="cuda", generator=torch.Generator("cuda").manual_seed(b)) - 0.5
             for b in range(2)]  # fmt: skip
    dense = torch.randn(4096, 4096, device="cuda")
    modules = []
    for launch in (IN_BACKWARD, ON_TRAINING_THREAD, ON_TRAINING_THREAD, IN_FORWARD, ON_CURRENT_STREAM):
        emb = build(optimizer, specs=list(zip(rows, dims)), ftm=None, device="cuda")
        emb.backward_launch = launch
        outs = [emb(*batch) for batch in batches]
        for _ in range(4):
            dense = torch.tanh(dense @ dense) / 64  # the current stream busy while the plans run
        for out, grad in zip(outs, grads):
            out.backward(grad)
        modules.append(emb)
    torch.cuda.synchronize()
    assert_bitwise_equal(modules[0], modules[1])
    assert_bitwise_equal(modules[1], modules[2])
    assert_bitwise_equal(modules[0], modules[3])  # by the plan thread (RunsLaunch.plan_thread, the default)
    assert_bitwise_equal(modules[0], modules[4])  # on the current stream (RunsLaunch.plan_side_stream=False)
    assert not torch.equal(modules[0].weights, build(optimizer, specs=list(zip(rows, dims)), ftm=None,
                                                     device="cuda").weights)  # fmt: skip


def test_a_second_backward_of_one_lookup_plans_again():
    """``retain_graph``: the first backward takes the forward's plan and lets it go; a second
    backward of the same output plans by itself and applies a second update, as with the plan
    in the backward."""
    modules = []
    for launch in (IN_BACKWARD, IN_FORWARD):
        emb = build("EXACT_ROWWISE_ADAGRAD")
        emb.backward_launch = launch
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        out = emb(*make_bags(rows, B=4, max_len=6, seed=8, hot_fraction=0.5))
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
        out.backward(grad, retain_graph=True)
        once = emb.weights.clone()
        out.backward(grad)
        assert not torch.equal(once, emb.weights)  # the second update applied
        modules.append(emb)
    assert_bitwise_equal(*modules)
