"""Sharders that put ``EmbeddingBagCollection`` tables on our Triton kernel, or on
FBGEMM's, and ``get_sharders(backend)`` to pick one by name.

Switching a TorchRec model from FBGEMM to Triton is the sharder list given to the planner
and to ``DistributedModelParallel``: the Triton sharder offers only the FUSED_TRITON
kernel, for every sharding type TorchRec has for EBC tables (on CPU too), so the planner
can only choose it; a table our kernel cannot serve fails at planning time, named.
"""

from typing import Any, Dict, List, Optional

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

from tbe_plugin.torchrec._compat import install_lookup_dispatch, triton_kernel
from tbe_plugin.torchrec.fused_params import check_table, table_fused_params

BACKENDS = ("triton", "fbgemm")
# Every sharding type of EBC tables but data parallel (a dense, unfused replica).
SHARDING_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
]


class TritonEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollection`` tables on ``TritonTableBatchedEmbeddingBags``, with the
    optimizer fused into the backward; ``fused_params`` as for FBGEMM's FUSED kernel."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return [triton_kernel()]

    def shardable_parameters(self, module: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
        """The tables, each checked against our module with the fused params it will get
        (the planner calls this first, so an unsupported table fails before sharding)."""
        params = super().shardable_parameters(module)
        configs = {config.name: config for config in module.embedding_bag_configs()}
        for name, param in params.items():
            config = configs[name]
            check_table(
                name, config.embedding_dim, _pooling_mode(config.pooling), config.data_type,
                table_fused_params(self.fused_params, param),
            )  # fmt: skip
        return params

    def shard(self, module: Any, params: Any, env: Any, device: Optional[torch.device] = None, *args: Any, **kwargs: Any) -> Any:
        install_lookup_dispatch()
        return super().shard(module, params, env, device, *args, **kwargs)


class FbgemmEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's sharder with FBGEMM's FUSED kernel, offering every sharding type on the
    CPU as well (FBGEMM's CPU TBE runs them all; the stock sharder lists fewer there), so
    that both backends can be given the same plans."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel

        return [EmbeddingComputeKernel.FUSED.value]


def get_sharders(backend: str, fused_params: Optional[Dict[str, Any]] = None) -> List[ModuleSharder]:
    """The sharders for ``backend`` ("triton" or "fbgemm"), given ``fused_params``
    (optimizer, learning_rate, eps, ...: FBGEMM's names, as for TorchRec's sharders)."""
    if backend == "triton":
        return [TritonEmbeddingBagCollectionSharder(fused_params=fused_params)]
    if backend == "fbgemm":
        return [FbgemmEmbeddingBagCollectionSharder(fused_params=fused_params)]
    raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")


def _pooling_mode(pooling: Any) -> Any:
    from torchrec.modules.embedding_configs import pooling_type_to_pooling_mode

    return pooling_type_to_pooling_mode(pooling)
