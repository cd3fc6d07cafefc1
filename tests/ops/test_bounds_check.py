"""Bounds checking: every BoundsCheckMode with bad ids and bad offsets, and bad inputs."""

import warnings

import pytest
import torch

from tbe_plugin import BoundsCheckError
from tests.helpers import assert_tbe_close, make_bags
from tests.ops.test_embedding_forward import MAX_LEN, build, reference, rows_of


def bad_id_inputs(emb):
    """Three ids per bag, B=3; id 9 planted in feature 2 (9 rows) bag 1, id -3 in feature 0."""
    B, L = 3, 3
    rows = rows_of(emb)
    g = torch.Generator().manual_seed(11)
    indices = torch.cat([torch.randint(0, rows[f], (B * L,), generator=g) for f in range(len(rows))])
    offsets = torch.arange(0, len(rows) * B * L + 1, L)
    bad = indices.clone()
    pos = (2 * B + 1) * L
    bad[pos] = 9
    bad[1] = -3
    fixed = bad.clone()
    fixed[pos] = 0
    fixed[1] = 0
    return bad, fixed, offsets, pos


def test_fatal_names_feature_bag_and_id():
    emb = build(bounds_check_mode="FATAL")
    bad, _, offsets, pos = bad_id_inputs(emb)
    with pytest.raises(BoundsCheckError, match=r"id -3 at indices\[1\], bag 0 of feature 0"):
        emb(bad, offsets)
    only_high = bad.clone()
    only_high[only_high < 0] = 0
    with pytest.raises(BoundsCheckError, match=rf"id 9 at indices\[{pos}\], bag 1 of feature 2, whose table has 9 rows"):
        emb(only_high, offsets)
    # The status is reset after raising: good input runs cleanly afterwards.
    good, offsets = make_bags(rows_of(emb), B=3, max_len=MAX_LEN, seed=12)
    assert_tbe_close(emb(good, offsets), reference(emb, good, offsets), MAX_LEN)


@pytest.mark.parametrize("mode", ["WARNING", "IGNORE"])
def test_warning_and_ignore_read_bad_ids_as_row_zero(mode):
    emb = build(bounds_check_mode=mode)
    bad, fixed, offsets, _ = bad_id_inputs(emb)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = emb(bad, offsets)
        out_again = emb(bad, offsets)
    assert_tbe_close(out, reference(emb, fixed, offsets), MAX_LEN)
    torch.testing.assert_close(out, out_again)
    ours = [w for w in caught if "bounds check" in str(w.message)]
    if mode == "WARNING":
        assert len(ours) == 1, "WARNING warns once"
        assert "2 id(s) out of range" in str(ours[0].message)
    else:
        assert not ours


def test_none_mode_trusts_valid_input():
    emb = build(bounds_check_mode="NONE")
    indices, offsets = make_bags(rows_of(emb), B=3, max_len=MAX_LEN, seed=13)
    assert_tbe_close(emb(indices, offsets), reference(emb, indices, offsets), MAX_LEN)


@pytest.mark.parametrize(
    "bad_offsets, what",
    [
        ([0, 2, 1, 4, 6, 8], "decreasing"),
        ([0, 2, 4, 6, 8, 7], "last below len(indices)"),
        ([0, 2, 4, 6, 8, 9], "last past len(indices)"),
        ([-1, 2, 4, 6, 8, 8], "negative"),
    ],
)
def test_fatal_rejects_bad_offsets(bad_offsets, what):
    emb = build(specs=[(10, 4)], feature_table_map=[0], bounds_check_mode="FATAL")
    indices = torch.arange(8) % 10
    with pytest.raises(BoundsCheckError, match="invalid offsets"):
        emb(indices, torch.tensor(bad_offsets))


@pytest.mark.parametrize("pooling", ["SUM", "NONE"])
def test_warning_repairs_offsets_like_fbgemm(pooling):
    """Last offset != len(indices) is set to len(indices); out-of-range ends are clamped."""
    emb = build(specs=[(10, 4)], feature_table_map=[0], bounds_check_mode="WARNING", pooling=pooling)
    indices = torch.arange(8) % 10
    with pytest.warns(RuntimeWarning, match="invalid offsets"):
        out = emb(indices, torch.tensor([0, 2, 4, 9, 8, 7]))
    expected = reference(emb, indices, torch.tensor([0, 2, 4, 8, 8, 8]))
    assert_tbe_close(out, expected, 4)


@pytest.mark.parametrize("mode", ["FATAL", "WARNING", "IGNORE", "NONE"])
def test_malformed_inputs_raise_in_every_mode(mode):
    emb = build(bounds_check_mode=mode)
    indices, offsets = make_bags(rows_of(emb), B=2, max_len=MAX_LEN, seed=14)
    with pytest.raises(ValueError, match="expected T\\*B\\+1"):
        emb(indices, offsets[:-1])
    with pytest.raises(TypeError, match="indices must be int32 or int64"):
        emb(indices.float(), offsets)
    with pytest.raises(TypeError, match="offsets must be int32 or int64"):
        emb(indices, offsets.double())
    with pytest.raises(ValueError, match="indices must be 1-D"):
        emb(indices.view(1, -1), offsets)
    with pytest.raises(ValueError, match="per_sample_weights has shape"):
        emb(indices, offsets, torch.ones(indices.numel() + 1))
    with pytest.raises(TypeError, match="per_sample_weights must be a floating-point"):
        emb(indices, offsets, torch.ones(indices.numel(), dtype=torch.int64))
