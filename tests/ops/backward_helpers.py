"""What the backward's tests share: the optimizers, small mixed-D tables, a module built
on them, and a pure-PyTorch trainer to compare it with after every step (the reference
aggregates duplicate ids densely and applies ``optimizer_step_reference`` to the touched
rows in fp32, then rounds to the weights' dtype)."""

import dataclasses

import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops.backward_launch import RunsLaunch
from tbe_plugin.ops.reference import aggregate_row_gradients, optimizer_step_reference
from tests.helpers import make_bags

OPTIMIZERS = ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM", "LAMB"]
# The pieces design on small sizes (cells of 4 ids, groups of 2 cells, as test_backward_pieces'
# PIECES), eager and planned in the backward.
SMALL_PIECES = RunsLaunch(design="pieces", piece_ids=4, fan_in=2, piece_elements=256, piece_warps=1, tree_warps=1,
                          piece_programs_per_sm=1, loop_programs_per_sm=1, graph_max_ids=0,
                          plan_in_forward=False)  # fmt: skip
ROWWISE_STATE = {"EXACT_ROWWISE_ADAGRAD": ("row",), "PARTIAL_ROWWISE_ADAM": ("element", "row")}
SPECS = [(23, 8), (9, 20), (30, 4)]
FEATURE_TABLE_MAP = [0, 1, 2, 0]
DTYPE_NAMES = {torch.float32: "FP32", torch.float16: "FP16", torch.bfloat16: "BF16"}
WEIGHT_TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class ReferenceTrainer:
    """The module's tables and states, trained by the pure-PyTorch reference."""

    def __init__(self, emb, optimizer, **hyper):
        self.emb, self.optimizer, self.hyper, self.step = emb, optimizer, hyper, 0
        self.tables = [w.detach().clone() for w in emb.split_embedding_weights()]
        self.states = [[s.detach().clone() for s in table] for table in emb.split_optimizer_states()]

    def train(self, indices, offsets, grad_output, psw):
        self.step += 1
        grads, touched = aggregate_row_gradients(
            self.tables, self.emb.feature_table_map, indices, offsets, grad_output, psw,
            int(self.emb.pooling_mode),
        )  # fmt: skip
        for t, table in enumerate(self.tables):
            rows = touched[t]
            w = table[rows].float()
            states = [s[rows] for s in self.states[t]] if self.states else []
            states += [None] * (2 - len(states))
            optimizer_step_reference(self.optimizer, w, grads[t][rows], *states, self.step, **self.hyper)
            table[rows] = w.to(table.dtype)
            for s, new in zip(self.states[t] if self.states else [], states):
                s[rows] = new

    def assert_matches(self, emb):
        dtype = emb.weights_precision
        for ours, ref in zip(emb.split_embedding_weights(), self.tables):
            torch.testing.assert_close(ours.float(), ref.float(), atol=WEIGHT_TOL[dtype], rtol=WEIGHT_TOL[dtype])
        for ours_t, ref_t in zip(emb.split_optimizer_states(), self.states):
            for ours, ref in zip(ours_t, ref_t):
                torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def build(optimizer, pooling="SUM", dtype=torch.float32, specs=SPECS, ftm=FEATURE_TABLE_MAP, device="cpu", **kwargs):
    emb = TritonTableBatchedEmbeddingBags(
        specs, feature_table_map=ftm, optimizer=optimizer, pooling_mode=pooling,
        weights_precision=DTYPE_NAMES[dtype], stochastic_rounding=False, device=device, **kwargs,
    )  # fmt: skip
    torch.manual_seed(0)
    emb.init_embedding_weights_uniform(-1.0, 1.0)
    return emb


def train_steps(emb, steps, B, max_len, seed, hot, psw=False):
    """``steps`` training steps of ``emb`` on ``make_bags`` batches (seeds ``seed``, ``seed`` +
    1, ...) and gradients N(0, 1) seeded by the step; ``psw``: per-sample weights U(0, 1)
    (no gradient). Returns ``emb``."""
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    for step in range(steps):
        indices, offsets = make_bags(rows, B=B, max_len=max_len, seed=seed + step, hot_fraction=hot)
        weights = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)) if psw else None
        out = emb(indices, offsets, weights)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
    return emb


def train_each(launches, make_module, **batches):
    """A fresh module (``make_module()``) per launch, each trained by ``train_steps(**batches)``."""
    trained = []
    for launch in launches:
        emb = make_module()
        emb.backward_launch = launch
        trained.append(train_steps(emb, **batches))
    return trained


def assert_option_trains_bitwise(optimizer, **option):
    """Two MEAN steps with ``option`` set on ``SMALL_PIECES`` (short runs of 2 apart) are bit for
    bit the steps without it, and move the tables."""
    from tests.helpers import assert_bitwise_equal

    base = dataclasses.replace(SMALL_PIECES, piece_short=2)
    trained = train_each((base, dataclasses.replace(base, **option)),
                         lambda: build(optimizer, pooling="MEAN", learning_rate=0.05), steps=2, B=7, max_len=12,
                         seed=20, hot=0.8)  # fmt: skip
    assert_bitwise_equal(*trained)
    assert not torch.equal(trained[0].weights, build(optimizer, pooling="MEAN").weights)


def step_on_bad_inputs(launches, specs, ftm, optimizer="ADAM"):
    """A fresh module a launch (``bounds_check_mode="WARNING"``), one step each on one batch
    with ids outside their tables and a decreasing offset inside feature 1 (the forward's
    report expected); returns the modules."""
    import pytest

    rows = [specs[t][0] for t in ftm]
    indices, offsets = make_bags(rows, B=6, max_len=8, seed=5, hot_fraction=0.7)
    indices[3], indices[-2] = 999, -4  # outside their tables
    offsets[7] = offsets[6] - 1  # a decreasing offset inside feature 1
    modules = []
    for launch in launches:
        emb = build(optimizer, specs=specs, ftm=ftm, learning_rate=0.05, bounds_check_mode="WARNING")
        emb.backward_launch = launch
        with pytest.warns(RuntimeWarning):
            out = emb(indices, offsets)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)))
        modules.append(emb)
    return modules


def train_and_compare(emb, optimizer, steps=3, B=4, max_len=5, hot=0.3, weighted=False, **hyper):
    reference = ReferenceTrainer(emb, optimizer, **hyper)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    for step in range(steps):
        indices, offsets = make_bags(rows, B=B, max_len=max_len, seed=100 + step, hot_fraction=hot)
        psw = torch.rand(indices.numel()) if weighted else None
        out = emb(indices, offsets, psw)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(step))
        out.backward(grad.to(out.dtype))
        reference.train(indices, offsets, grad, psw)
        reference.assert_matches(emb)


def cuda_zipf_steps(optimizer, launches, dims=(16, 128, 400)):
    """On CUDA, one training step per launch (``RunsLaunch`` or None), each on a fresh module
    from the same weights, ids and output gradient: Zipf(1.15) ids over tables of D ``dims``
    (200k, 1M and 50k rows), B=16384, 20 ids a bag. Returns (modules, indices)."""
    rows, dims, B, L = [200_000, 1_000_000, 50_000], list(dims), 16384, 20
    torch.manual_seed(0)
    ranks = torch.distributions.Pareto(1.0, 0.15).sample((3 * B * L,)).long() - 1
    indices = torch.cat([ranks[f * B * L : (f + 1) * B * L] % rows[f] for f in range(3)]).cuda()
    offsets = torch.arange(0, 3 * B * L + 1, L, device="cuda")
    grad = torch.rand(B, sum(dims), device="cuda") - 0.5
    modules = []
    for launch in launches:
        emb = TritonTableBatchedEmbeddingBags(list(zip(rows, dims)), optimizer=optimizer, learning_rate=0.01,
                                              device="cuda")  # fmt: skip
        with torch.no_grad():
            for t, w in enumerate(emb.split_embedding_weights()):
                w.copy_(torch.rand(w.shape, generator=torch.Generator().manual_seed(t)).cuda() - 0.5)
        emb.backward_launch = launch
        emb(indices, offsets).backward(grad)
        modules.append(emb)
    return modules, indices


def assert_step_close(module, reference):
    """One module's tables and optimizer states after a step, against another's trained
    with sums in another order (fp32 rounding apart)."""
    torch.testing.assert_close(module.weights, reference.weights, atol=1e-5, rtol=1e-5)
    for ours, want in zip(module.split_optimizer_states(), reference.split_optimizer_states()):
        for a, b in zip(ours, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
