"""``ops.radix_sort.sort_pairs`` against ``torch.sort(stable=True)`` on the CPU interpreter,
and the backward with ``RunsLaunch.radix_sort`` bit for bit the default's."""

import dataclasses

import pytest
import torch

from tbe_plugin.ops.backward_launch import RadixSizes
from tbe_plugin.ops.radix_sort import pass_bits, sort_pairs
from tests.helpers import assert_bitwise_equal, make_bags
from tests.ops.backward_helpers import build, train_and_compare
from tests.ops.test_backward_pieces import PIECES


SMALL = RadixSizes(tile=64, sub_tile=64)  # the interpreter's tl.sort takes ~1 s a tile of 256
SMALL_MATCH = RadixSizes(tile=64, sub_tile=16, ranking="match")


def test_pass_bits_spread_the_key_bits():
    assert pass_bits(22) == (8, 7, 7)
    assert pass_bits(8) == (8,)
    assert pass_bits(31) == (8, 8, 8, 7)
    assert pass_bits(9) == (5, 4)
    assert pass_bits(25, digit_bits=9) == (9, 8, 8)
    assert pass_bits(0) == ()


@pytest.mark.parametrize("ranking", ["sort", "match"])
@pytest.mark.parametrize(
    "n, bits, tile, sub, values_dtype",
    [(300, 9, 64, 16, torch.int64), (257, 16, 32, 32, torch.int32), (64, 3, 64, 8, torch.int32),
     (5, 20, 8, 256, torch.int64)],
    ids=["two-passes-sub-blocks-int64", "tail-tile-int32", "one-tile-many-ties", "fewer-keys-than-a-tile"],
)  # fmt: skip
def test_sort_pairs_is_torch_stable_sort(n, bits, tile, sub, values_dtype, ranking):
    """Keys and values in torch's stable order, bit for bit, under both rankings: many equal
    keys (their values keep the input order), tiles ranked in sub-blocks, a last tile part
    full; the inputs left as they were."""
    g = torch.Generator().manual_seed(n)
    keys = torch.randint(0, min(1 << bits, n // 3 + 2), (n,), generator=g, dtype=torch.int32)
    keys[::7] = (1 << bits) - 1  # the largest key (the backward's sentinel)
    values = torch.randperm(n, generator=g).to(values_dtype) * 5 - 2
    keys_before, values_before = keys.clone(), values.clone()
    out_keys, out_values = sort_pairs(keys, values, bits, RadixSizes(tile=tile, sub_tile=min(sub, tile),
                                                                     ranking=ranking))  # fmt: skip
    ref_keys, perm = torch.sort(keys, stable=True)
    assert torch.equal(out_keys, ref_keys)
    assert torch.equal(out_values, values[perm])
    assert out_values.dtype == values_dtype
    assert torch.equal(keys, keys_before) and torch.equal(values, values_before)


def test_sort_pairs_refuses_what_it_cannot_sort():
    keys = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="keys must be a 1-D int32"):
        sort_pairs(keys.long(), keys, 3)
    with pytest.raises(ValueError, match="values must be int32 or int64"):
        sort_pairs(keys, keys.float(), 3)
    with pytest.raises(ValueError, match="key_bits"):
        sort_pairs(keys, keys, 32)
    with pytest.raises(ValueError, match="RadixSizes.tile must be a power of two"):
        RadixSizes(tile=48)
    with pytest.raises(ValueError, match="sub_tile .* must not exceed tile"):
        RadixSizes(tile=64, sub_tile=128)
    with pytest.raises(ValueError, match="RadixSizes.warps"):
        RadixSizes(warps=3)
    with pytest.raises(ValueError, match="RadixSizes.ranking"):
        RadixSizes(ranking="bitonic")
    huge = torch.zeros(1, dtype=torch.int32).expand(2**31)  # a view: nothing allocated
    with pytest.raises(ValueError, match="at most 2\\*\\*31 - 1 keys"):
        sort_pairs(huge, huge, 3)


@pytest.mark.parametrize(
    "optimizer, pooling, weighted, sizes",
    [("EXACT_ROWWISE_ADAGRAD", "SUM", False, SMALL), ("ADAM", "MEAN", True, SMALL), ("EXACT_SGD", "NONE", False, SMALL),
     ("LAMB", "SUM", False, SMALL_MATCH)],
    ids=["sum-bags-carried", "mean-weighted-positions", "unpooled-positions", "sum-matched-ranks"],
)  # fmt: skip
def test_backward_with_the_radix_sort_is_the_default_bitwise(optimizer, pooling, weighted, sizes):
    """One step with ``radix_sort`` (bags carried for SUM, ranked by sort or by comparison;
    positions for MEAN with per-sample weights and for unpooled lookups) and one with
    ``torch.sort`` from the same weights on the same batch: the same tables and states bit
    for bit (the same sorted order, hence every sum in the same order); and both the
    reference's."""
    modules = []
    for radix in (False, True):
        emb = build(optimizer, pooling, learning_rate=0.05)
        emb.backward_launch = dataclasses.replace(PIECES, radix_sort=radix, radix_sizes=sizes)
        rows = [emb.table_rows[t] for t in emb.feature_table_map]
        indices, offsets = make_bags(rows, B=6, max_len=9, seed=4, hot_fraction=0.7)
        psw = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(5)) if weighted else None
        out = emb(indices, offsets, psw)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(6)))
        modules.append(emb)
    assert_bitwise_equal(*modules)
    emb = build(optimizer, pooling, learning_rate=0.05)
    emb.backward_launch = dataclasses.replace(PIECES, radix_sort=True, radix_sizes=sizes)
    train_and_compare(emb, optimizer, steps=1, B=5, max_len=6, hot=0.6, weighted=weighted, lr=0.05)
