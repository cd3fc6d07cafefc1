"""The members TorchRec's fused optimizer calls on FBGEMM's TBE: optimizer state by name,
step, hyper-parameters, flush and cache reset; compared with FBGEMM's CPU TBE where it
trains the optimizer (SGD, Adagrad), else with FBGEMM's code and the reference step."""

import pytest
import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.ops.reference import optimizer_step_reference
from tests.helpers import make_bags
from tests.test_fbgemm_parity import EmbOptimType, make_training_pair

# What FBGEMM 1.8.0's get_optimizer_state() returns for the Adam family (names in order,
# and whether the state is rowwise): its CPU TBE cannot be built with these optimizers.
_FBGEMM_ADAM_STATE = {
    "ADAM": {"exp_avg": False, "exp_avg_sq": False},
    "PARTIAL_ROWWISE_ADAM": {"exp_avg": False, "exp_avg_sq": True},
    "LAMB": {"exp_avg": False, "exp_avg_sq": False},
}
ADAM_FAMILY = list(_FBGEMM_ADAM_STATE)


def train_one_bag(emb, ids, grad):
    """One step on a single bag of distinct rows of table 0: each row's gradient is ``grad[0]``."""
    out = emb(torch.tensor(ids), torch.tensor([0, len(ids)]))
    out.backward(grad)


def reference_after_step(emb, ids, grad, step, lr, **hyper):
    """Table 0's rows ``ids`` and their optimizer state after the reference step."""
    weight = emb.split_embedding_weights()[0][ids].float().clone()
    states = [s[ids].clone() for s in emb.split_optimizer_states()[0]]
    momentum1, momentum2 = (states + [None, None])[:2]
    row_grads = grad.float().repeat(len(ids), 1)
    optimizer_step_reference(emb.optimizer, weight, row_grads, momentum1, momentum2, step, lr, **hyper)
    return [weight] + states


def rows_and_state(emb, ids):
    states = emb.split_optimizer_states()[0] if emb.split_optimizer_states() else []
    return [emb.split_embedding_weights()[0][ids].float()] + [s[ids] for s in states]


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-5)


def make_module(optimizer, rows=8, dim=4, **kwargs):
    torch.manual_seed(0)
    emb = TritonTableBatchedEmbeddingBags([(rows, dim)], optimizer=optimizer, device="cpu",
                                          stochastic_rounding=False, **kwargs)  # fmt: skip
    emb.init_embedding_weights_uniform(-0.5, 0.5)
    return emb


# ------------------------------------------------------------------ optimizer state


@pytest.mark.parametrize("optimizer", ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD"])
def test_optimizer_state_matches_fbgemm_cpu_after_training(optimizer):
    dims, rows = [4, 12], [7, 5]
    fbgemm, ours = make_training_pair(dims, rows, "cpu", EmbOptimType[optimizer],
                                      learning_rate=0.05, eps=1e-4)  # fmt: skip
    before = ours.get_optimizer_state()  # taken before training: must see every update
    for step in range(2):
        indices, offsets = make_bags(rows, B=3, max_len=4, seed=step, hot_fraction=0.3)
        grad = torch.randn(3, sum(dims), generator=torch.Generator().manual_seed(step))
        for module in (fbgemm, ours):
            module(indices.clone(), offsets.clone()).backward(grad)
    expected, actual = fbgemm.get_optimizer_state(), ours.get_optimizer_state()
    assert type(actual) is list and len(actual) == len(expected)
    if optimizer == "EXACT_SGD":
        assert actual == expected == [], "FBGEMM returns an empty list, not per-table dicts"
        return
    assert len(actual) == len(dims)
    for mine, theirs, early in zip(actual, expected, before):
        assert list(mine) == list(theirs) == ["sum"]
        for key, value in theirs.items():
            assert mine[key].shape == value.shape and mine[key].dtype == value.dtype
            assert value.abs().sum() > 0, "the batches must touch every table"
            torch.testing.assert_close(mine[key], value, atol=1e-5, rtol=1e-4)
            assert early[key].data_ptr() == mine[key].data_ptr()
            torch.testing.assert_close(early[key], mine[key], atol=0, rtol=0)


@pytest.mark.parametrize("optimizer", ADAM_FAMILY)
def test_adam_family_state_names_shapes_and_aliasing(optimizer):
    rows, dims = [5, 3], [4, 12]
    emb = TritonTableBatchedEmbeddingBags(list(zip(rows, dims)), optimizer=optimizer, device="cpu")
    state = emb.get_optimizer_state()
    assert len(state) == len(rows)
    for t, table in enumerate(state):
        assert list(table) == list(_FBGEMM_ADAM_STATE[optimizer])
        for key, rowwise in _FBGEMM_ADAM_STATE[optimizer].items():
            assert table[key].shape == ((rows[t],) if rowwise else (rows[t], dims[t]))
            assert table[key].dtype == torch.float32
    with torch.no_grad():
        for t, table in enumerate(state):
            for k, value in enumerate(table.values()):
                value.fill_(10 * t + k + 1)
    for t, states in enumerate(emb.split_optimizer_states()):
        assert [float(s.unique()) for s in states] == [10 * t + 1, 10 * t + 2]

    # TorchRec's checkpoint load copies into these views: a loaded state must show in them.
    other = TritonTableBatchedEmbeddingBags(list(zip(rows, dims)), optimizer=optimizer, device="cpu")
    with torch.no_grad():
        other.momentum1.uniform_()
        other.momentum2.uniform_()
    emb.load_state_dict(other.state_dict())
    for mine, theirs in zip(state, other.get_optimizer_state()):
        for key in mine:
            torch.testing.assert_close(mine[key], theirs[key], atol=0, rtol=0)


# ------------------------------------------------------------------ step


@pytest.mark.parametrize("optimizer", ADAM_FAMILY)
def test_set_optimizer_step_sets_the_next_bias_correction(optimizer):
    """Also after steps have run (FBGEMM's host copy of the count would ignore it then).
    Weight decay keeps LAMB's trust ratio from cancelling the bias correction."""
    emb = make_module(optimizer, learning_rate=0.05, weight_decay=0.1)
    ids, grad = [1, 4, 6], torch.randn(1, 4, generator=torch.Generator().manual_seed(1))
    train_one_bag(emb, ids, grad)
    train_one_bag(emb, ids, grad)
    emb.set_optimizer_step(7)
    expected = reference_after_step(emb, ids, grad, step=8, lr=0.05, weight_decay=0.1)
    at_step_3 = reference_after_step(emb, ids, grad, step=3, lr=0.05, weight_decay=0.1)
    assert not torch.allclose(expected[0], at_step_3[0], atol=1e-6), "steps 3 and 8 must differ"
    train_one_bag(emb, ids, grad)
    assert int(emb.iter) == 8
    assert_all_close(rows_and_state(emb, ids), expected)


@pytest.mark.parametrize("optimizer", ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD"])
def test_set_optimizer_step_is_accepted_without_effect_where_there_is_no_step(optimizer):
    a, b = make_module(optimizer), make_module(optimizer)
    a.set_optimizer_step(5)
    grad = torch.randn(1, 4, generator=torch.Generator().manual_seed(2))
    for emb in (a, b):
        train_one_bag(emb, [0, 3], grad)
    assert "iter" not in a.state_dict()
    assert_all_close(rows_and_state(a, [0, 3]), rows_and_state(b, [0, 3]))
    with pytest.raises(ValueError, match="step must be >= 0"):
        a.set_optimizer_step(-1)


# ------------------------------------------------------------------ hyper-parameters


@pytest.mark.parametrize(
    "optimizer, params",
    [
        ("EXACT_ROWWISE_ADAGRAD", {"lr": 0.3, "eps": 0.5}),
        ("EXACT_ADAGRAD", {"eps": 0.25}),
        ("ADAM", {"lr": 0.2, "eps": 1e-3, "beta1": 0.5, "beta2": 0.75, "weight_decay": 0.1}),
        ("LAMB", {"beta1": 0.6, "weight_decay": 0.05}),
    ],
)
def test_update_hyper_parameters_changes_the_next_step(optimizer, params):
    emb = make_module(optimizer, learning_rate=0.05, eps=1e-4)
    ids, grad = [2, 5], torch.randn(1, 4, generator=torch.Generator().manual_seed(3))
    train_one_bag(emb, ids, grad)
    hyper = {"eps": 1e-4, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0}
    before = reference_after_step(emb, ids, grad, step=2, lr=0.05, **hyper)
    hyper.update({k: v for k, v in params.items() if k != "lr"})
    lr = params.get("lr", 0.05)
    expected = reference_after_step(emb, ids, grad, step=2, lr=lr, **hyper)
    assert not torch.allclose(before[0], expected[0], atol=1e-6), "the update must matter"
    emb.update_hyper_parameters(params)
    assert emb.get_learning_rate() == pytest.approx(lr)
    train_one_bag(emb, ids, grad)
    assert_all_close(rows_and_state(emb, ids), expected)


def test_update_hyper_parameters_refuses_unknown_names_before_setting_any():
    emb = make_module("EXACT_ROWWISE_ADAGRAD", learning_rate=0.05, eps=1e-4)
    with pytest.raises(NotImplementedError, match="Setting hyper-parameter momentum is not supported"):
        emb.update_hyper_parameters({"lr": 0.5, "eps": 0.1, "momentum": 0.9})
    assert emb.get_learning_rate() == pytest.approx(0.05)
    assert emb.optimizer_args["eps"] == 1e-4
    emb.update_hyper_parameters({"lower_bound": 0.1})  # FBGEMM's name; inert without global decay
    with pytest.raises(NotImplementedError, match="weight_decay=0.1 with optimizer=EXACT_SGD"):
        make_module("EXACT_SGD").update_hyper_parameters({"weight_decay": 0.1})


# ------------------------------------------------------------------ cache


def test_flush_and_reset_cache_states_change_nothing():
    emb = make_module("ADAM")
    train_one_bag(emb, [1, 2], torch.ones(1, 4))
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    assert emb.flush() is None and emb.reset_cache_states() is None
    for key, value in emb.state_dict().items():
        torch.testing.assert_close(value, before[key], atol=0, rtol=0)
