"""TorchRec's lookup kernels for FUSED_TRITON tables: ``TritonTableBatchedEmbeddingBags``
behind TorchRec's ``BaseBatchedEmbeddingBag`` (pooled) and ``BaseBatchedEmbedding``
(unpooled) with ``FusedOptimizerModule``.

They mirror ``BatchedFusedEmbeddingBag``/``BatchedFusedEmbedding`` (FBGEMM's FUSED
kernels) member for member, and
reuses TorchRec's ``EmbeddingFusedOptimizer`` over our module, so the fused optimizer,
its ``state_dict`` keys and sharded layouts, learning-rate schedulers and checkpoints
are TorchRec's own: a checkpoint written with FBGEMM loads here and the reverse.
"""

import os
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.batched_embedding_kernel import (
    BaseBatchedEmbedding,
    BaseBatchedEmbeddingBag,
    BatchedFusedEmbeddingBag,
    EmbeddingFusedOptimizer,
)
from torchrec.distributed.composable.table_batched_embedding_slice import TableBatchedEmbeddingSlice
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.optim.fused import FusedOptimizer, FusedOptimizerModule

from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.torchrec.fused_params import module_kwargs


class _TritonFusedKernel(FusedOptimizerModule):
    """What both lookup kernels share: our module over the group's tables, TorchRec's
    fused optimizer over it, and each table's weights as a slice of its flat buffer."""

    def _build(self, config: GroupedEmbeddingConfig, pg: Optional[dist.ProcessGroup], device, pooling_mode) -> None:
        names = [t.name for t in config.embedding_tables]
        try:
            self._emb_module = TritonTableBatchedEmbeddingBags(
                **module_kwargs(
                    self._local_rows, self._local_cols, self._feature_table_map, pooling_mode,
                    config.data_type, names, config.fused_params, device,
                )  # fmt: skip
            )
        except (ValueError, NotImplementedError, TypeError, KeyError) as error:
            raise ValueError(f"tables {names} cannot use backend=triton: {error}") from error
        self._optim = EmbeddingFusedOptimizer(config, self._emb_module, pg)
        self.init_parameters()

    @property
    def _param_per_table(self) -> Dict[str, TableBatchedEmbeddingSlice]:
        """Each table's weights as a slice of the module's flat buffer (TorchRec loads
        checkpoints by copying into these), tagged with its per-table fused optimizer."""
        module = self._emb_module
        counts = self.table_name_to_count.copy()
        weights_by_table = module.split_embedding_weights()
        states = module.get_optimizer_state()
        slices = {}
        for t, table in enumerate(self._config.embedding_tables):
            if table.name not in counts:
                continue
            start = module._table_offsets[t]
            rows, dim = module.table_rows[t], module.table_dims[t]
            weight = TableBatchedEmbeddingSlice(
                data=module.weights,
                start_offset=start,
                end_offset=start + counts.pop(table.name) * rows * dim,
                num_embeddings=-1,
                embedding_dim=dim,
            )
            weight._in_backward_optimizers = [
                EmbeddingFusedOptimizer(
                    config=self._config,
                    emb_module=module,
                    pg=self._pg,
                    create_for_table=table.name,
                    param_weight_for_table=weight,
                    embedding_weights_by_table=weights_by_table,
                    all_optimizer_states=states,
                )
            ]
            slices[table.name] = weight
        return slices

    @_param_per_table.setter
    def _param_per_table(self, value: Dict[str, TableBatchedEmbeddingSlice]) -> None:
        self.__dict__["_param_per_table"] = value  # the base class assigns it; we derive it

    @property
    def emb_module(self) -> TritonTableBatchedEmbeddingBags:
        return self._emb_module

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    def forward(self, features: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or any(v is not None for v in kwargs.values()):
            raise NotImplementedError(
                "backend=triton does not support variable batch size per feature (VBE) yet"
            )
        return super().forward(features)

    # The same as FBGEMM's FUSED kernels: weights are no buffers, parameters carry no
    # optimizer of their own (the fused one updates them), flush/purge reach the module.
    named_buffers = BatchedFusedEmbeddingBag.named_buffers
    named_parameters = BatchedFusedEmbeddingBag.named_parameters
    flush = BatchedFusedEmbeddingBag.flush
    purge = BatchedFusedEmbeddingBag.purge


class TritonFusedEmbeddingBag(_TritonFusedKernel, BaseBatchedEmbeddingBag[torch.Tensor]):
    """Pooled tables (``EmbeddingBagCollection``), FBGEMM's ``BatchedFusedEmbeddingBag``
    on our kernels; MEAN becomes SUM under row-wise shardings, as TorchRec arranges."""

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        sharding_type: Optional[Any] = None,
        env: Optional[Any] = None,
    ) -> None:
        _check_environment(env, device)
        BaseBatchedEmbeddingBag.__init__(self, config, pg, device, sharding_type)
        self._build(config, pg, device, self._pooling)


class TritonFusedEmbedding(_TritonFusedKernel, BaseBatchedEmbedding[torch.Tensor]):
    """Unpooled tables (``EmbeddingCollection``), FBGEMM's ``BatchedFusedEmbedding`` on
    our kernels (pooling NONE: one row per id)."""

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        env: Optional[Any] = None,
    ) -> None:
        _check_environment(env, device)
        BaseBatchedEmbedding.__init__(self, config, pg, device)
        self._build(config, pg, device, "NONE")


def _check_environment(env: Optional[Any], device: Optional[torch.device]) -> None:
    from torchrec.distributed.types import ShardingEnv2D

    if isinstance(env, ShardingEnv2D):
        raise NotImplementedError("backend=triton does not support 2D parallel (ShardingEnv2D) yet")
    on_cpu = device is None or torch.device(device).type == "cpu"
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "backend=triton on the CPU runs Triton's interpreter: set TRITON_INTERPRET=1 in the "
            "environment before anything imports triton (torchrec does)"
        )
