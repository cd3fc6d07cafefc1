"""Sharders that put ``EmbeddingBagCollection`` tables on our Triton kernel, or on
FBGEMM's, and ``get_sharders(backend)`` to pick one by name.

Switching a TorchRec model from FBGEMM to Triton is the sharder list given to the planner
and to ``DistributedModelParallel``: the Triton sharder offers only the FUSED_TRITON
kernel, for every sharding type TorchRec has for EBC tables (on CPU too), so the planner
can only choose it; a table our kernel cannot serve fails at planning time, named.
"""

from typing import Any, Dict, List, Optional

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

from tbe_plugin.torchrec._compat import install_lookup_dispatch, triton_kernel
from tbe_plugin.torchrec.fused_params import check_table, table_fused_params

BACKENDS = ("triton", "fbgemm")
# Every sharding type of EC tables but data parallel.
UNPOOLED_SHARDING_TYPES = [ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value, ShardingType.ROW_WISE.value]
# Every sharding type of EBC tables but data parallel (a dense, unfused replica).
SHARDING_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
]


class _TritonSharder:
    """What both Triton sharders add to TorchRec's: our kernel only, tables checked at
    planning time, the lookup dispatch installed before sharding."""

    _sharding_types: List[str]

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(self._sharding_types)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return [triton_kernel()]

    def shardable_parameters(self, module: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
        """The tables, each checked against our module with the fused params it will get
        (the planner calls this first, so an unsupported table fails before sharding)."""
        params = super().shardable_parameters(module)
        configs = {config.name: config for config in self._table_configs(module)}
        for name, param in params.items():
            config = configs[name]
            check_table(
                name, config.embedding_dim, self._pooling_mode(config), config.data_type,
                table_fused_params(self.fused_params, param),
            )  # fmt: skip
        return params

    def shard(
        self, module: Any, params: Any, env: Any, device: Optional[torch.device] = None, *args: Any, **kwargs: Any
    ) -> Any:
        install_lookup_dispatch()
        return super().shard(module, params, env, device, *args, **kwargs)


class TritonEmbeddingBagCollectionSharder(_TritonSharder, EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollection`` tables on ``TritonTableBatchedEmbeddingBags``, with the
    optimizer fused into the backward; ``fused_params`` as for FBGEMM's FUSED kernel."""

    _sharding_types = SHARDING_TYPES

    @staticmethod
    def _table_configs(module: torch.nn.Module) -> list:
        return module.embedding_bag_configs()

    @staticmethod
    def _pooling_mode(config: Any) -> Any:
        from torchrec.modules.embedding_configs import pooling_type_to_pooling_mode

        return pooling_type_to_pooling_mode(config.pooling)


class TritonEmbeddingCollectionSharder(_TritonSharder, EmbeddingCollectionSharder):
    """``EmbeddingCollection`` tables (one embedding per id, no pooling) on our kernels."""

    _sharding_types = UNPOOLED_SHARDING_TYPES

    @staticmethod
    def _table_configs(module: torch.nn.Module) -> list:
        return module.embedding_configs()

    @staticmethod
    def _pooling_mode(config: Any) -> str:
        return "NONE"


class FbgemmEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's sharder with FBGEMM's FUSED kernel, offering every sharding type on the
    CPU as well (FBGEMM's CPU TBE runs them all; the stock sharder lists fewer there), so
    that both backends can be given the same plans."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel

        return [EmbeddingComputeKernel.FUSED.value]


class FbgemmEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """TorchRec's EC sharder restricted to FBGEMM's FUSED kernel (the same plans as ours)."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(UNPOOLED_SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel

        return [EmbeddingComputeKernel.FUSED.value]


def get_sharders(backend: str, fused_params: Optional[Dict[str, Any]] = None) -> List[ModuleSharder]:
    """The sharders for ``backend`` ("triton" or "fbgemm"), for ``EmbeddingBagCollection``
    and ``EmbeddingCollection``, given ``fused_params`` (optimizer, learning_rate, eps,
    ...: FBGEMM's names, as for TorchRec's sharders)."""
    if backend == "triton":
        return [
            TritonEmbeddingBagCollectionSharder(fused_params=fused_params),
            TritonEmbeddingCollectionSharder(fused_params=fused_params),
        ]
    if backend == "fbgemm":
        return [
            FbgemmEmbeddingBagCollectionSharder(fused_params=fused_params),
            FbgemmEmbeddingCollectionSharder(fused_params=fused_params),
        ]
    raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
