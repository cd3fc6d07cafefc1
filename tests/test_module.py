"""TritonTableBatchedEmbeddingBags: construction, storage, state and argument errors."""

import pytest
import torch

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tests.helpers import make_bags


def test_split_embedding_weights_are_views_of_one_flat_buffer():
    emb = TritonTableBatchedEmbeddingBags([(5, 4), (3, 12)], device="cpu")
    views = emb.split_embedding_weights()
    assert [tuple(v.shape) for v in views] == [(5, 4), (3, 12)]
    assert emb.weights.numel() == 5 * 4 + 3 * 12, "each table pays only for its own D"
    with torch.no_grad():
        views[1][2].fill_(7.0)
    assert torch.all(emb.weights[20 + 24 : 20 + 36] == 7.0)
    assert emb.weights_offsets.tolist() == [0, 20]


@pytest.mark.parametrize(
    "optimizer, shapes",
    [
        ("EXACT_SGD", {}),
        ("EXACT_ROWWISE_ADAGRAD", {"momentum1": 8}),
        ("EXACT_ADAGRAD", {"momentum1": 56}),
        ("ADAM", {"momentum1": 56, "momentum2": 56, "iter": 1}),
        ("PARTIAL_ROWWISE_ADAM", {"momentum1": 56, "momentum2": 8, "iter": 1}),
        ("LAMB", {"momentum1": 56, "momentum2": 56, "iter": 1}),
    ],
)
def test_optimizer_state_layout(optimizer, shapes):
    emb = TritonTableBatchedEmbeddingBags([(5, 4), (3, 12)], optimizer=optimizer, device="cpu")
    state = emb.state_dict()
    for name in ("momentum1", "momentum2", "iter"):
        if name in shapes:
            assert state[name].numel() == shapes[name]
            assert state[name].dtype == (torch.int64 if name == "iter" else torch.float32)
        else:
            assert name not in state


def test_state_dict_round_trip():
    a = TritonTableBatchedEmbeddingBags([(6, 4), (9, 8)], optimizer="ADAM", device="cpu")
    a.init_embedding_weights_uniform(-1, 1)
    with torch.no_grad():
        a.momentum1.uniform_()
        a.iter.fill_(3)
    b = TritonTableBatchedEmbeddingBags([(6, 4), (9, 8)], optimizer="ADAM", device="cpu")
    b.load_state_dict(a.state_dict())
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, atol=0, rtol=0)
    indices, offsets = make_bags([6, 9], B=2, max_len=3, seed=1)
    torch.testing.assert_close(a(indices, offsets), b(indices, offsets), atol=0, rtol=0)


def test_learning_rate_reads_back_as_fp32():
    emb = TritonTableBatchedEmbeddingBags([(4, 4)], learning_rate=0.1, device="cpu")
    assert emb.get_learning_rate() == torch.tensor(0.1, dtype=torch.float32).item()
    emb.set_learning_rate(0.5)
    assert emb.get_learning_rate() == 0.5


def test_device_derived_from_compute_device_and_fbgemm_enums_accepted():
    enums = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_common")
    training = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
    configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")
    emb = TritonTableBatchedEmbeddingBags(
        [(4, 8, enums.EmbeddingLocation.HOST, training.ComputeDevice.CPU)],
        optimizer=configs.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        weights_precision=configs.SparseType.FP16,
        pooling_mode=enums.PoolingMode.MEAN,
        bounds_check_mode=enums.BoundsCheckMode.FATAL,
    )
    assert emb.device == torch.device("cpu")
    assert emb.weights.dtype == torch.float16
    with pytest.raises(NotImplementedError, match="EmbeddingLocation.MANAGED_CACHING"):
        TritonTableBatchedEmbeddingBags(
            [(4, 8, enums.EmbeddingLocation.MANAGED_CACHING, training.ComputeDevice.CPU)]
        )
    with pytest.raises(NotImplementedError, match="optimizer=LARS_SGD"):
        TritonTableBatchedEmbeddingBags([(4, 8)], optimizer=configs.EmbOptimType.LARS_SGD, device="cpu")
    with pytest.raises(NotImplementedError, match="weights_precision=INT8"):
        TritonTableBatchedEmbeddingBags([(4, 8)], weights_precision=configs.SparseType.INT8, device="cpu")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"gradient_clipping": True}, NotImplementedError, "gradient_clipping=True"),
        ({"max_norm": 1.0}, NotImplementedError, "max_norm=1.0"),
        ({"prefetch_pipeline": True}, NotImplementedError, "prefetch_pipeline=True"),
        ({"no_such_argument": 1}, TypeError, "no_such_argument"),
        ({"output_dtype": "INT8"}, NotImplementedError, "output_dtype=INT8"),
        ({"pooling_mode": "MAX"}, NotImplementedError, "pooling_mode=MAX"),
        ({"bounds_check_mode": "V2_FATAL"}, NotImplementedError, "bounds_check_mode=V2_FATAL"),
        ({"weight_decay_mode": "COUNTER"}, NotImplementedError, "weight_decay_mode=COUNTER"),
        ({"feature_table_map": [0, 2]}, ValueError, "feature_table_map"),
        ({"table_names": ["a", "b"]}, ValueError, "table_names"),
        ({"device": "meta"}, NotImplementedError, "device=meta"),
        ({"embedding_table_index_type": torch.int16}, ValueError, "embedding_table_index_type"),
    ],
)
def test_unsupported_arguments_raise_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        TritonTableBatchedEmbeddingBags([(4, 8)], **{"device": "cpu", **kwargs})


def test_inert_fbgemm_arguments_at_their_defaults_are_accepted():
    emb = TritonTableBatchedEmbeddingBags(
        [(4, 8)], device="cpu", gradient_clipping=False, max_norm=0.0, cache_load_factor=0.5,
        stochastic_rounding=False, record_cache_metrics=None,
    )  # fmt: skip
    assert emb.stochastic_rounding is False


@pytest.mark.parametrize("spec", [(0, 4), (4, 0), (4,), (4, 4, 0)])
def test_bad_specs_raise(spec):
    with pytest.raises(ValueError, match="embedding_specs"):
        TritonTableBatchedEmbeddingBags([spec], device="cpu")
