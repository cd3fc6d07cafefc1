"""The training app's model: TorchRec's DLRM (or DLRM-DCN) over an ``EmbeddingBagCollection``,
sharded with the chosen backend's sharders and our planner (``build_model``), its tables
seeded the same whatever the backend and the sharding (``init_tables``), and per-table
optimizer overrides."""

import os
from typing import Any, Dict, List, Optional

import torch

from pipelines.app.config import TrainConfig


def build_model(cfg: TrainConfig, device: torch.device, world_size: int, init: Optional[Any] = None,
                plan: Optional[Any] = None):
    """DLRM over the configured tables, sharded for ``cfg.backend`` by ``plan`` (default:
    the app's planner's); and the dense optimizer. ``init(dmp, seed, bounds)`` sets the
    tables, table ``t`` to U(-bounds[t], bounds[t]) with bound 1/sqrt(rows), TorchRec's
    default (default ``init_tables``)."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain

    from pipelines.app.data import rows_per_table
    from tbe_plugin.torchrec import make_planner

    rows = rows_per_table(cfg.tables)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.tables.dim, num_embeddings=rows[i], feature_names=[f"f{i}"])
        for i in range(cfg.tables.num_tables)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    for table, settings in cfg.tables.overrides.items():
        _override_table_optimizer(ebc.embedding_bags[table].weight, settings)
    arch = dict(
        embedding_bag_collection=ebc, dense_in_features=cfg.model.dense_in_features,
        dense_arch_layer_sizes=list(cfg.model.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.model.over_arch_layer_sizes), dense_device=device,
    )  # fmt: skip
    if cfg.model.name == "dcn":
        dlrm = DLRM_DCN(**arch, dcn_num_layers=cfg.model.dcn_num_layers, dcn_low_rank_dim=cfg.model.dcn_low_rank_dim)
    else:
        dlrm = DLRM(**arch)
    sharders = make_sharders(cfg)
    allowed = {f"t{i}": list(cfg.sharding.sharding_types) for i in range(cfg.tables.num_tables)}
    allowed.update({t: list(v) for t, v in cfg.sharding.per_table.items()})
    constraints = {t: ParameterConstraints(sharding_types=v) for t, v in allowed.items() if v}
    if cfg.sharding.preset:
        from pipelines.app.repartition import preset_constraints

        constraints = preset_constraints(cfg.sharding.preset, [t.name for t in tables], cfg.sharding.statistics_file)
    topology = Topology(world_size=world_size, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
                        compute_device=device.type)  # fmt: skip
    model = DLRMTrain(dlrm)
    if plan is None:
        planner = make_planner(topology, batch_size=cfg.data.batch_size, constraints=constraints or None)
        plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=plan, device=device, sharders=sharders
    )
    (init or init_tables)(dmp, cfg.data.seed, bounds=[1.0 / n**0.5 for n in rows])
    dense = [p for name, p in dmp.named_parameters() if "embedding_bags" not in name]
    optimizer_class = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}
    return dmp, optimizer_class[cfg.optimizer.dense](dense, lr=cfg.optimizer.dense_lr)


def make_sharders(cfg: TrainConfig) -> List[Any]:
    """The backend's sharders with the configured fused optimizer."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from tbe_plugin.torchrec import get_sharders

    fused_params = {
        "optimizer": EmbOptimType[cfg.optimizer.sparse],
        "learning_rate": cfg.optimizer.sparse_lr,
        "eps": cfg.optimizer.sparse_eps,
    }
    return get_sharders(cfg.backend.name, fused_params=fused_params)


def _override_table_optimizer(weight: torch.nn.Parameter, settings: Dict[str, Any]) -> None:
    """Per-table fused-optimizer settings (FBGEMM's names), through the attributes TorchRec's
    sharders read per parameter (those ``_apply_optimizer_in_backward`` sets): they override
    the sharder's fused params for this table, which then gets a TBE group of its own."""
    weight._optimizer_classes = [None]  # the optimizer stays the sharder's
    weight._optimizer_kwargs = [dict(settings)]


def init_tables(dmp, seed: int, bounds: List[float], block_rows: int = 4096) -> None:
    """Table t U(-bounds[t], bounds[t]) from generators seeded by (seed, t, row block) on
    the shard's device: the same values whatever the backend and the sharding on one device
    type (CPU and CUDA generators differ), built one local shard at a time. On a GPU the
    values never cross the host (at a79d7ca they were drawn on the CPU and copied block by
    block, and the A/B's build of 26 tables of 1e6 x 128 took ~30 s)."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            if "embedding_bags" not in key or not hasattr(value, "local_shards"):
                continue
            table = int(key.split(".")[-2][1:])
            width = value.size(1)
            for shard in value.local_shards():
                (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                device = shard.tensor.device
                for first in range(r0 // block_rows * block_rows, r0 + n, block_rows):
                    g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + table * 10_007 + first // block_rows)
                    block = (torch.rand(block_rows, width, generator=g, device=device) * 2 - 1) * bounds[table]
                    lo, hi = max(first, r0), min(first + block_rows, r0 + n)
                    shard.tensor[lo - r0 : hi - r0].copy_(block[lo - first : hi - first, c0 : c0 + m])
