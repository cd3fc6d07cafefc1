"""From a TorchRec table group (or one table) to our module's constructor arguments.

TorchRec hands FBGEMM ``GroupedEmbeddingConfig.fused_params`` verbatim (optimizer,
learning rate, eps, weight decay, betas, dtypes, bounds checking...): we do the same, so
every argument our module does not implement raises there, naming itself. The keys that
are TorchRec's own (``__register_*``) or that configure what our module has no notion of
(the software cache, which FBGEMM reads only for caching tables) are dropped first.
"""

import copy
from typing import Any, Dict, List, Optional, Sequence

import torch

# FBGEMM arguments TorchRec's raw-embedding-streaming path adds; we stream nothing.
_STREAMING_KEYS = ("res_store_shards", "res_enabled_tables")


def tbe_fused_params(fused_params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The FBGEMM arguments in a TorchRec ``fused_params`` dict (a copy)."""
    from torchrec.distributed.fused_params import tbe_fused_params as torchrec_tbe_fused_params

    params = dict(torchrec_tbe_fused_params(copy.copy(fused_params or {})) or {})
    for key in [k for k in params if k.startswith("__")]:
        del params[key]
    for key in _STREAMING_KEYS:
        if params.pop(key, None) is not None:
            raise NotImplementedError(f"fused_params[{key!r}]: raw embedding streaming is not supported")
    return params


def module_kwargs(
    rows: Sequence[int],
    dims: Sequence[int],
    feature_table_map: Sequence[int],
    pooling_mode: Any,
    data_type: Any,
    table_names: Sequence[str],
    fused_params: Optional[Dict[str, Any]],
    device: Optional[torch.device],
) -> Dict[str, Any]:
    """Keyword arguments of ``TritonTableBatchedEmbeddingBags`` for these tables, as
    ``BatchedFusedEmbeddingBag`` builds FBGEMM's module."""
    from torchrec.modules.embedding_configs import data_type_to_sparse_type

    return dict(
        embedding_specs=list(zip(rows, dims)),
        feature_table_map=list(feature_table_map),
        pooling_mode=pooling_mode,
        weights_precision=data_type_to_sparse_type(data_type),
        table_names=list(table_names),
        device=device,
        **tbe_fused_params(fused_params),
    )


def check_table(name: str, dim: int, pooling_mode: Any, data_type: Any, fused_params: Dict[str, Any]) -> None:
    """Raises ``ValueError`` naming table ``name`` when our module cannot serve it with
    these fused params: a one-row module with the table's arguments is built on the CPU,
    so every check of the module applies, at planning time."""
    from tbe_plugin import TritonTableBatchedEmbeddingBags

    try:
        kwargs = module_kwargs([1], [dim], [0], pooling_mode, data_type, [name], fused_params, torch.device("cpu"))
        TritonTableBatchedEmbeddingBags(**kwargs)
    except (ValueError, NotImplementedError, TypeError, KeyError) as error:
        raise ValueError(f"table {name!r} cannot use backend=triton: {error}") from error


def table_fused_params(sharder_fused_params: Optional[Dict[str, Any]], param: torch.nn.Parameter) -> Dict[str, Any]:
    """The fused params TorchRec derives for one table at sharding time: the sharder's,
    overridden by the optimizer attached with ``_apply_optimizer_in_backward``."""
    from torchrec.distributed.utils import (
        convert_to_fbgemm_types,
        merge_fused_params,
        optimizer_type_to_emb_opt_type,
    )

    optimizer_classes: List[Any] = getattr(param, "_optimizer_classes", [None])
    optimizer_params = dict(getattr(param, "_optimizer_kwargs", [{}])[0])
    if optimizer_classes[0] is not None and "optimizer" not in optimizer_params:
        optimizer_params["optimizer"] = optimizer_type_to_emb_opt_type(optimizer_classes[0])
    return convert_to_fbgemm_types(merge_fused_params(sharder_fused_params, optimizer_params))
