"""Fused backward + optimizer vs a pure-PyTorch training reference (CPU, interpreter).

Several steps on one module, new inputs each step; weights and optimizer states are
compared after every step. The reference aggregates duplicate ids densely and applies
``optimizer_step_reference`` to the touched rows in fp32, then rounds to the weights'
dtype (round to nearest: stochastic rounding is tested separately).
"""

import pytest
import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops.backward_launch import RunsLaunch, runs_launch
from tests.helpers import make_bags
from tests.ops.backward_helpers import DTYPE_NAMES, FEATURE_TABLE_MAP, OPTIMIZERS, SPECS, build, train_and_compare


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("pooling", ["SUM", "MEAN", "NONE"])
def test_optimizers_and_pooling(optimizer, pooling):
    ftm = FEATURE_TABLE_MAP if pooling != "NONE" else [0, 0, 0]
    specs = SPECS if pooling != "NONE" else [(23, 8)]
    emb = build(optimizer, pooling, specs=specs, ftm=ftm, learning_rate=0.05)
    train_and_compare(emb, optimizer, lr=0.05)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_weights(optimizer, dtype):
    emb = build(optimizer, dtype=dtype, learning_rate=0.05)
    train_and_compare(emb, optimizer, steps=2, weighted=True, lr=0.05)


@pytest.mark.parametrize(
    "optimizer, mode",
    [
        ("EXACT_ROWWISE_ADAGRAD", "L2"),
        ("EXACT_ROWWISE_ADAGRAD", "DECOUPLE"),
        ("ADAM", "NONE"),
        ("PARTIAL_ROWWISE_ADAM", "NONE"),
        ("LAMB", "NONE"),
    ],
)
def test_weight_decay(optimizer, mode):
    emb = build(optimizer, learning_rate=0.05, weight_decay=0.1, weight_decay_mode=mode)
    train_and_compare(emb, optimizer, steps=2, lr=0.05, weight_decay=0.1, weight_decay_mode=mode)


def test_int64_row_keys(monkeypatch):
    """Tables with 2**31 rows or more in all sort int64 keys: same results."""
    from tbe_plugin.ops import embedding_backward

    monkeypatch.setattr(embedding_backward, "INT32_KEYS_BELOW", 0)
    emb = build("EXACT_ROWWISE_ADAGRAD", "MEAN", learning_rate=0.05)
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, weighted=True, lr=0.05)


def small_launch(chunk_elements, segment_ids, fan_in, mode="list", halo=False):
    """Tiny chunks, segments and fan-ins, so that a few hundred ids cross every level."""
    return RunsLaunch(design="chunks", chunk_elements=chunk_elements, chunk_halo=halo, chunk_warps=1, chunk_mode=mode,
                      chunk_programs_per_sm=2, segment_ids=segment_ids, step_elements=64, fan_in=fan_in,
                      loop_warps=1, loop_programs_per_sm=1, batch=4)  # fmt: skip


# (chunk elements, segment ids, fan-in, chunk mode, halo). At BLOCK_D 16 and 32 (the
# tables' tiles): listed chunks of 2 and 1 ids and supergroups of 16 ids; chunks of 4 and
# 2 with halos, looping over every chunk; chunks of 1 and segments of 2 ids, a program per
# chunk; the defaults.
LAUNCHES = [(32, 4, 2, "list", False), (128, 8, 2, "loop", True), (16, 2, 2, "grid", False),
            (512, 64, 32, "list", False)]  # fmt: skip


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda launch: "-".join(map(str, launch)))
def test_hot_rows_across_segments_groups_and_supergroups(launch):
    """One row in most lookups: its run covers many segments, groups and supergroups (the
    long-run kernel's walk loops over supergroup sums), and the other rows' runs start and
    end at every kind of edge, inside a chunk, in its halo or past it."""
    emb = build("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05)
    emb.backward_launch = small_launch(*launch)
    B = 12 if launch[0] <= 16 else 24  # 1-id chunks: ~4 programs an id in the interpreter
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, B=B, max_len=12, hot=0.9, lr=0.05)


@pytest.mark.parametrize("launch", LAUNCHES[:3], ids=lambda launch: "-".join(map(str, launch)))
def test_runs_across_chunk_edges(launch):
    """Tiny chunks against runs of every length (weighted MEAN: every id has its factor):
    runs inside a chunk, ending in its halo or past it, chunks inside one run, runs
    starting or ending at a chunk's, segment's or group's edge."""
    emb = build("EXACT_ROWWISE_ADAGRAD", "MEAN", learning_rate=0.05)
    emb.backward_launch = small_launch(*launch)
    B = 6 if launch[0] <= 16 else 12
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=2, B=B, max_len=9, hot=0.5, weighted=True, lr=0.05)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_long_runs_every_optimizer(optimizer):
    """Every optimizer's update from the long-run kernel (hot rows over tiny chunks) and
    from the chunk kernel (the other rows)."""
    emb = build(optimizer, learning_rate=0.05)
    emb.backward_launch = small_launch(32, 4, 2)
    train_and_compare(emb, optimizer, steps=2, B=16, max_len=8, hot=0.7, lr=0.05)


def test_tables_of_four_tiles_each_use_their_own():
    """D = 8, 20, 4, 40, 130: tiles 16, 32, 16, 64, 256, numbered class by class (row-wise
    state too), each class's ids updated by its own launches; a hot row in table 0."""
    specs = [(23, 8), (9, 20), (30, 4), (12, 40), (7, 130)]
    emb = build("PARTIAL_ROWWISE_ADAM", specs=specs, ftm=[0, 1, 2, 3, 4, 0], learning_rate=0.05)
    assert emb._row_classes == [16, 0, 32, 53, 64, 62, 256, 74]
    emb.backward_launch = small_launch(32, 4, 2)
    train_and_compare(emb, "PARTIAL_ROWWISE_ADAM", steps=2, B=10, max_len=8, hot=0.6, lr=0.05)


def test_listed_chunks_are_those_where_a_run_starts():
    """The list of chunks the chunk kernel visits: per class (its ids from class_pos, cut
    into chunks of its CHUNK), the chunks holding a run's first id, in order; a chunk
    inside a hot row is not listed."""
    from tbe_plugin.ops.embedding_backward import _listed_chunks
    from tbe_plugin.ops.backward_launch import ClassLaunch

    rows = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 5, 5, 5, 5, 5, 5, 7, 9, 9, 9], dtype=torch.int32)
    class_pos = torch.tensor([0, 12, 22])  # class 0: rows 0-2 (chunks of 4); class 1: rows 5-9 (chunks of 2)
    per_class = [ClassLaunch(16, 4, 1, 8, 4), ClassLaunch(32, 2, 1, 8, 4)]
    chunk_list, list_pos = _listed_chunks(rows, class_pos, per_class)
    expected = [0, 8, 12, 18]  # class 0: chunk 4 holds nothing that starts; class 1: 14, 16 inside row 5, 20 inside row 9
    assert chunk_list[: len(expected)].tolist() == expected
    assert list_pos.tolist() == [0, 2, 4]


def test_launch_sizes_depend_on_d_only():
    """A chunk gathers 512 gradient elements (4 ids at D=128; as many again with a halo)
    over 2 warps (more beyond 512 elements a warp), long runs 4096 a gather; nothing grows
    with the batch."""
    sizes = [RunsLaunch().for_block_d(d) for d in (16, 128, 512, 2048)]
    assert [(s.chunk_ids, s.chunk_warps, s.step_ids, s.loop_warps) for s in sizes] == [
        (32, 2, 64, 4), (4, 2, 32, 4), (1, 2, 8, 16), (1, 4, 2, 16)
    ]
    with_halo = [RunsLaunch(chunk_elements=1024, chunk_halo=True).for_block_d(d) for d in (16, 128)]
    assert [(s.chunk_ids, s.chunk_warps) for s in with_halo] == [(32, 2), (4, 2)]
    assert runs_launch() == RunsLaunch()


def test_auto_chunk_mode_takes_one_program_per_chunk_for_one_class_only():
    assert [RunsLaunch(chunk_mode="auto").chunk_mode_for(n) for n in (1, 2, 5)] == ["grid", "list", "list"]
    assert RunsLaunch().chunk_mode_for(1) == "list"
    emb = build("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05)  # tiles 16 and 32: two classes
    emb.backward_launch = RunsLaunch(design="chunks", chunk_mode="auto", segment_ids=4, fan_in=2,
                                     loop_programs_per_sm=1, batch=4)  # fmt: skip
    train_and_compare(emb, "EXACT_ROWWISE_ADAGRAD", steps=1, B=8, max_len=6, hot=0.6, lr=0.05)


@pytest.mark.parametrize(
    "field, value",
    [("chunk_elements", 3), ("segment_ids", 1), ("fan_in", 6), ("chunk_warps", 3), ("loop_programs_per_sm", 0),
     ("chunk_mode", "every"), ("design", "runs"), ("piece_ids", 48), ("piece_elements", 1), ("piece_warps", 32),
     ("tree_warps", 0), ("piece_programs_per_sm", -1), ("piece_unroll", 32), ("piece_order", True),
     ("piece_lanes", 3), ("piece_lanes", 256), ("piece_lanes", 1), ("piece_short", -1), ("piece_short", 6),
     ("short_lanes", 0), ("short_lanes", 48), ("short_elements", 96), ("short_warps", 3),
     ("short_programs_per_sm", -2), ("short_warp_elements", 100), ("short_warp_elements", 1024)],
)
def test_bad_launch_sizes_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"RunsLaunch.{field}"):
        RunsLaunch(**{field: value})


def test_per_sample_weight_gradient():
    for pooling in ("SUM", "MEAN"):
        emb = build("EXACT_SGD", pooling, learning_rate=0.0)
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        indices, offsets = make_bags(rows, B=3, max_len=4, seed=7)
        psw = torch.rand(indices.numel(), requires_grad=True)
        out = emb(indices, offsets, psw)
        grad = torch.randn(out.shape)
        out.backward(grad)
        tables = [w.detach().float() for w in emb.split_embedding_weights()]
        # Autograd through a differentiable reference: per-sample weights as leaves.
        ref_psw = psw.detach().clone().requires_grad_(True)
        from tbe_plugin.ops.reference import tbe_forward_reference

        ref = tbe_forward_reference(tables, emb.feature_table_map, indices, offsets, ref_psw,
                                    pooling=int(emb.pooling_mode))  # fmt: skip
        ref.backward(grad)
        torch.testing.assert_close(psw.grad, ref_psw.grad, atol=1e-5, rtol=1e-5)


def test_deterministic_and_learning_rate_is_runtime():
    results = []
    for _ in range(2):
        emb = build("ADAM", learning_rate=0.05)
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        for step in range(2):
            indices, offsets = make_bags(rows, B=6, max_len=6, seed=step, hot_fraction=0.5)
            emb.set_learning_rate(0.05 * (step + 1))
            out = emb(indices, offsets)
            out.backward(torch.ones_like(out))
        results.append(emb.weights.clone())
    assert torch.equal(results[0], results[1])


def test_state_dict_restores_training_exactly():
    emb = build("PARTIAL_ROWWISE_ADAM", learning_rate=0.05)
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    batches = [make_bags(rows, B=4, max_len=5, seed=s) for s in range(3)]

    def step(module, batch):
        out = module(*batch)
        out.backward(torch.ones_like(out))

    step(emb, batches[0])
    restored = build("PARTIAL_ROWWISE_ADAM", learning_rate=0.05)
    restored.load_state_dict(emb.state_dict())
    for batch in batches[1:]:
        step(emb, batch)
        step(restored, batch)
    for key, value in emb.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_stochastic_rounding_is_unbiased_and_within_one_ulp(dtype):
    """Every element steps from 1.0 to exactly a quarter ulp above it (exact in fp32).
    Round-to-nearest gives 1.0 everywhere, a quarter ulp low; stochastic rounding rounds
    up with probability 1/4, so both neighbours appear and the mean is the exact value
    within 4 standard errors (0.04 ulp over 64 rows of 32)."""
    rows, D = 64, 32
    emb = TritonTableBatchedEmbeddingBags([(rows, D)], optimizer="EXACT_SGD", learning_rate=1.0,
                                          weights_precision=DTYPE_NAMES[dtype], stochastic_rounding=True,
                                          device="cpu")  # fmt: skip
    with torch.no_grad():
        emb.weights.fill_(1.0)
    out = emb(torch.arange(rows), torch.tensor([0, rows]))  # one bag, every row once
    ulp = torch.finfo(dtype).eps  # the spacing above 1.0: 2**-10 (fp16), 2**-7 (bf16)
    out.backward(torch.full_like(out, -ulp / 4))
    w = emb.weights.double()
    assert sorted(w.unique().tolist()) == [1.0, 1.0 + ulp], "both neighbours of the exact value, nothing else"
    standard_error = ulp * (0.25 * 0.75 / w.numel()) ** 0.5
    assert abs(w.mean().item() - (1.0 + ulp / 4)) < 4 * standard_error, "unbiased on average"


@pytest.mark.parametrize(
    "optimizer, kwargs",
    [
        ("EXACT_SGD", {"weight_decay": 0.1}),
        ("EXACT_ADAGRAD", {"weight_decay": 0.1, "weight_decay_mode": "L2"}),
        ("ADAM", {"weight_decay": 0.1, "weight_decay_mode": "DECOUPLE"}),
    ],
)
def test_weight_decay_fbgemm_would_ignore_is_refused(optimizer, kwargs):
    with pytest.raises(NotImplementedError, match="weight_decay"):
        TritonTableBatchedEmbeddingBags([(4, 8)], optimizer=optimizer, device="cpu", **kwargs)


class SquaredLoss(torch.nn.Module):
    """A model that trains an embedding module, for torch.compile."""

    def __init__(self, emb):
        super().__init__()
        self.emb = emb

    def forward(self, indices, offsets, psw=None):
        return (self.emb(indices, offsets, psw) ** 2).sum()


def test_compiled_update_declares_the_tensors_it_writes():
    """The update op's schema marks the tables and optimizer state as written, nothing
    else; the lookup op writes nothing."""

    def written(op):
        return {a.name for a in op.default._schema.arguments if a.alias_info is not None and a.alias_info.is_write}

    assert written(torch.ops.tbe_plugin.tbe_fused_update) == {"weights", "momentum1", "momentum2", "step",
                                                              "rounding_seed"}  # fmt: skip
    assert written(torch.ops.tbe_plugin.tbe_lookup_train) == set()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_step_updates_the_module_tables(backend, monkeypatch):
    """Nothing reads the update's output: the compiled graph keeps it for the writes it
    declares. A learning rate set between a lookup and its backward is the one applied
    (read live, as eager does). Inductor re-inplaces the update, so the kernels write the
    module's own tables, no copy of them (aot_eager writes a copy and copies it back)."""
    from tbe_plugin.ops import training

    record, original = [], training.backward_update

    def recording_update(grad_output, weights, momentum1, *args, **kwargs):
        record.append((weights.data_ptr(), momentum1.data_ptr()))
        return original(grad_output, weights, momentum1, *args, **kwargs)

    monkeypatch.setattr(training, "backward_update", recording_update)
    eager, compiled_emb = (build("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05) for _ in range(2))
    before = compiled_emb.weights.clone()
    compiled = torch.compile(SquaredLoss(compiled_emb), fullgraph=True, backend=backend)
    rows = [eager.table_rows[t] for t in eager.feature_table_map]
    indices, offsets = make_bags(rows, B=4, max_len=5, seed=3)
    for emb, model in ((eager, SquaredLoss(eager)), (compiled_emb, compiled)):
        loss = model(indices, offsets)
        emb.set_learning_rate(0.5)
        loss.backward()
    assert (compiled_emb.weights - before).abs().max() > 0.1
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(compiled_emb.state_dict()[key], value, atol=1e-6, rtol=1e-6, msg=key)
    if backend == "inductor":
        assert record[-1] == (compiled_emb.weights.data_ptr(), compiled_emb.momentum1.data_ptr())


def test_compiled_training_refuses_a_launch_it_would_ignore():
    emb = build("EXACT_SGD")
    emb.backward_launch = runs_launch()
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    with pytest.raises(Exception, match="backward_launch is not supported under torch.compile"):
        torch.compile(SquaredLoss(emb), fullgraph=True, backend="aot_eager")(*make_bags(rows, B=2, max_len=3, seed=0))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_compiled_training_matches_eager(backend, optimizer):
    """torch.compile(fullgraph=True) of a model that trains: the backward of the training
    lookup runs the fused update; weights, states, step count and psw gradients equal eager's."""
    eager, compiled_emb = (build(optimizer, learning_rate=0.05) for _ in range(2))
    compiled = torch.compile(SquaredLoss(compiled_emb), fullgraph=True, backend=backend)
    rows = [eager.table_rows[t] for t in eager.feature_table_map]
    indices, offsets = make_bags(rows, B=4, max_len=5, seed=200, hot_fraction=0.3)
    for step in range(3):
        compiled_emb.set_learning_rate(0.05 / (step + 1))
        eager.set_learning_rate(0.05 / (step + 1))
        if step == 2:  # hyper-parameters too are runtime values of the compiled graph
            for emb in (eager, compiled_emb):
                emb.update_hyper_parameters({"eps": 0.5, "beta1": 0.5})
        psw_a = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(step)).requires_grad_()
        psw_b = psw_a.detach().clone().requires_grad_()
        SquaredLoss(eager)(indices, offsets, psw_a).backward()
        # Learning rate, hyper-parameters, step count, rounding seed: runtime values, no recompile.
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            compiled(indices, offsets, psw_b).backward()
        torch.testing.assert_close(psw_b.grad, psw_a.grad)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(compiled_emb.state_dict()[key], value, atol=1e-6, rtol=1e-6, msg=key)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_backward_after_another_update(backend):
    """A pipeline's order: two compiled lookups, then their backwards. The second backward
    runs after the first one's update changed the tables (autograd's saved-tensor version
    check would refuse it were the tables saved) and updates the live tables, as eager does."""
    check_compiled_backward_after_another_update(backend, "cpu")


@pytest.mark.gpu
def test_compiled_backward_after_another_update_on_cuda():
    """The same with inductor on the device's stack (torch 2.11 on the H200)."""
    check_compiled_backward_after_another_update("inductor", "cuda")


def check_compiled_backward_after_another_update(backend, device):
    eager, compiled_emb = (build("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05, device=device) for _ in range(2))
    initial = eager.weights.clone()
    compiled = torch.compile(SquaredLoss(compiled_emb), fullgraph=True, backend=backend)
    rows = [eager.table_rows[t] for t in eager.feature_table_map]
    first, second = (
        [t.to(device) for t in make_bags(rows, B=4, max_len=5, seed=seed, hot_fraction=0.3)] for seed in (1, 2)
    )
    losses = [SquaredLoss(eager)(*first), SquaredLoss(eager)(*second)]
    for loss in losses:
        loss.backward()
    compiled_losses = [compiled(*first), compiled(*second)]
    for loss in compiled_losses:
        loss.backward()
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(compiled_emb.state_dict()[key], value, atol=1e-6, rtol=1e-6, msg=key)
    assert (eager.weights - initial).abs().max() > 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_training_hot_rows_the_same_every_time_on_cuda(optimizer):
    """Two modules with the same weights take one step on the same Zipf(1.15) batch (B=65536,
    tables of D 128 and 64): weights and states agree bit for bit. The crossing kernel once
    raced (one row over all its warps): 2 to 3 rows a step came out different, at random."""
    rows, dims, B, L = [1_000_000, 100_000], [128, 64], 65536, 20
    torch.manual_seed(0)
    ranks = torch.distributions.Pareto(1.0, 0.15).sample((2 * B * L,)).long() - 1
    indices = torch.cat([ranks[f * B * L : (f + 1) * B * L] % rows[f] for f in range(2)]).cuda()
    offsets = torch.arange(0, 2 * B * L + 1, L, device="cuda")
    grad = torch.rand(B, sum(dims), device="cuda") + 0.1
    modules = [TritonTableBatchedEmbeddingBags(list(zip(rows, dims)), optimizer=optimizer, learning_rate=0.01,
                                               device="cuda") for _ in range(2)]  # fmt: skip
    with torch.no_grad():
        for w in modules[1].split_embedding_weights():
            w.copy_(torch.rand_like(w) - 0.5)
        for a, b in zip(modules[0].split_embedding_weights(), modules[1].split_embedding_weights()):
            a.copy_(b)
    for module in modules:
        module(indices, offsets).backward(grad)
    for a, b in zip(modules[0].split_embedding_weights(), modules[1].split_embedding_weights()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for states_a, states_b in zip(modules[0].split_optimizer_states(), modules[1].split_optimizer_states()):
        for a, b in zip(states_a, states_b):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("mean, weighted", [(False, False), (True, True), (False, True)])
def test_positions_kernel_finds_every_ids_bag(mean, weighted):
    """The positions kernel (a program per BLOCK consecutive positions, each id's bag by a
    binary search of the offsets its block spans) against a loop over bags: empty bags (a
    block spanning 16), a bag across two programs, positions before the first offset and
    after the last (sentinel rows), a bad id read as row 0 under CHECK. 3 features of B=8
    bags, programs of 8 positions."""
    from tbe_plugin.ops import embedding_backward as backward
    from tbe_plugin.ops.indexing import META_COLS, META_ROW_BASE, META_ROWS

    B, rows, row_base = 8, [10, 7, 5], [0, 10, 17]
    # bag 4 spans programs 0 and 1; bags 8-14 and 17-21 are empty (programs spanning 8-9 bags)
    lengths = [0, 3, 1, 0, 9, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 4, 2, 0, 0, 0, 0, 0, 1, 1]
    first = 2  # positions 0, 1 lie before the first bag's start; the last 3 after the end
    offsets = torch.tensor([first] + lengths, dtype=torch.int64).cumsum(0)
    N = int(offsets[-1]) + 3
    indices = torch.randint(0, 5, (N,), generator=torch.Generator().manual_seed(0))
    indices[first + 3] = 99  # outside feature 0's 10 rows: read as row 0
    psw = torch.rand(N, generator=torch.Generator().manual_seed(1))
    meta = torch.zeros(3, META_COLS, dtype=torch.int64)
    meta[:, META_ROWS], meta[:, META_ROW_BASE] = torch.tensor(rows), torch.tensor(row_base)
    sentinel = torch.iinfo(torch.int32).max
    rows_out, bag_out = torch.full((N,), -7, dtype=torch.int32), torch.full((N,), -7, dtype=torch.int32)
    scale_out = torch.full((N,), -7.0)
    window = backward.positions_window(offsets, N, 8)
    assert window.numel() == triton_cdiv(N, 8) + 1
    backward._positions_kernel[(triton_cdiv(N, 8),)](
        meta, indices, offsets, window, psw, rows_out, bag_out, scale_out, B, len(lengths), N, sentinel,
        rows_out, rows_out, MEAN=mean, WEIGHTED=weighted, CHECK=True, BLOCK=8,  # (no hot rows: never read)
    )  # fmt: skip
    expected_rows = torch.full((N,), sentinel, dtype=torch.int32)
    for bag, length in enumerate(lengths):
        f, start = bag // B, int(offsets[bag])
        for p in range(start, start + length):
            i = int(indices[p]) if 0 <= int(indices[p]) < rows[f] else 0
            expected_rows[p] = row_base[f] + i
            assert bag_out[p] == bag
            factor = (float(psw[p]) if weighted else 1.0) / (length if mean else 1)
            if mean or weighted:
                assert scale_out[p].item() == pytest.approx(factor, rel=1e-6)
    assert torch.equal(rows_out, expected_rows)
    assert expected_rows[first + 3] == 0 and (expected_rows[:first] == sentinel).all()
    assert (expected_rows[-3:] == sentinel).all()


def triton_cdiv(a, b):
    """ceil(a / b) for ints (triton.cdiv without importing Triton here)."""
    return -(-a // b)


def test_profiler_ranges_only_while_a_profiler_records(monkeypatch):
    """The lookup's and the update's ranges (the phase tables' names) are in a profile; with
    no profiler running no range is opened (each costs host time on every step)."""
    opened = []
    original = torch.profiler.record_function

    def counted(name, *args):
        opened.append(name)
        return original(name, *args)

    monkeypatch.setattr(torch.profiler, "record_function", counted)
    emb = build("EXACT_SGD")
    rows = [emb.table_rows[t] for t in emb.feature_table_map]
    indices, offsets = make_bags(rows, B=3, max_len=4, seed=0)
    emb(indices, offsets).sum().backward()
    assert opened == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        emb(indices, offsets).sum().backward()
    assert opened == ["tbe_plugin::lookup", "tbe_plugin::fused_update"]
    names = {event.name for event in profile.events()}
    assert {"tbe_plugin::lookup", "tbe_plugin::fused_update"} <= names
