"""The adapter in one process: backend selection, planning, errors at planning time."""

import pytest
import torch

from tests.torchrec.workers import TABLES, make_ebc


def _plan(backend, device_type, ebc=None, fused_params=None):
    from torchrec.distributed.planner import Topology

    from tbe_plugin.torchrec import get_sharders, make_planner

    topology = Topology(world_size=2, local_world_size=2, compute_device=device_type)
    sharders = get_sharders(backend, fused_params=fused_params)
    return make_planner(topology).plan(ebc if ebc is not None else make_ebc(), sharders).plan[""]


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_planner_puts_every_table_on_the_chosen_backend(device_type):
    for backend, kernel in (("triton", "fused_triton"), ("fbgemm", "fused")):
        plan = _plan(backend, device_type)
        assert sorted(plan) == sorted(n for n, *_ in TABLES)
        assert {p.compute_kernel for p in plan.values()} == {kernel}, (backend, plan)


def test_unknown_backend_is_named():
    from tbe_plugin.torchrec import get_sharders

    with pytest.raises(ValueError, match="backend='cuda'.*triton, fbgemm"):
        get_sharders("cuda")


def test_unsupported_table_fails_at_planning_naming_it():
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.modules.embedding_configs import DataType

    tables = [
        EmbeddingBagConfig(name="ok", num_embeddings=10, embedding_dim=8, feature_names=["a"]),
        EmbeddingBagConfig(name="int8_table", num_embeddings=10, embedding_dim=8, feature_names=["b"],
                           data_type=DataType.INT8),  # fmt: skip
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    with pytest.raises(ValueError, match="table 'int8_table' cannot use backend=triton.*INT8"):
        _plan("triton", "cpu", ebc)


def test_unsupported_optimizer_fails_at_planning_naming_it():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    with pytest.raises(ValueError, match="table 't0' cannot use backend=triton.*optimizer"):
        _plan("triton", "cpu", _plain_ebc(), {"optimizer": EmbOptimType.LARS_SGD})


def _plain_ebc():
    """The test tables with no optimizer attached (the sharder's fused params decide)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f{n[1:]}"])
        for n, r, d, _ in TABLES
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("meta"))


def test_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    from tbe_plugin.torchrec.lookup import _check_environment

    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _check_environment(None, torch.device("cpu"))
    _check_environment(None, torch.device("cuda"))  # a GPU needs nothing


def test_lookup_dispatch_is_installed_once():
    from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup

    from tbe_plugin.torchrec._compat import install_lookup_dispatch

    install_lookup_dispatch()
    first = GroupedPooledEmbeddingsLookup._create_embedding_kernel
    install_lookup_dispatch()
    assert GroupedPooledEmbeddingsLookup._create_embedding_kernel is first
    assert first.__wrapped__.__name__ == "_create_embedding_kernel"
