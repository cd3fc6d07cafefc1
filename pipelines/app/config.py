"""The training app's configuration: Hydra structured configs, one dataclass per group.

Every field has a docstring; ``__post_init__`` checks values and raises naming the key
(``validate`` runs them all on a composed config, before any process group starts).
OmegaConf itself rejects unknown keys and values of the wrong type, naming them. The YAML
groups in ``conf/`` select these schemas; ``register()`` puts them in Hydra's ConfigStore.
"""

import dataclasses
from typing import Any, Dict, List, Optional

from pipelines.errors import ConfigError  # re-exported: the schemas raise it, callers catch it from here
from pipelines.inputs.scaling import ScalingPolicy

BACKENDS = ("triton", "fbgemm")
MODELS = ("dlrm", "dcn")
SPARSE_OPTIMIZERS = ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM", "LAMB")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
LR_SCHEDULES = ("constant", "linear_warmup")
SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard")
SHARDING_PRESETS = ("table_wise", "row_wise", "column_wise", "table_row_wise", "grid", "hybrid", "balanced")
"""``tbe_plugin.torchrec.partition.PRESETS``' names (tests/pipelines/test_repartition.py checks they agree)."""
DATA_SOURCES = ("synthetic", "criteo", "sig")
SIG_RAW_LOGS = ("synthetic", "tsv")
# Per-table workloads the tables can be drawn from (``tbe_plugin.workloads`` builds them).
TABLE_WORKLOADS = ("ctr_dlrm",)
BAG_LENGTHS = ("poisson", "fixed")


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _require_choice(value: str, choices: tuple, key: str) -> None:
    _require(value in choices, key, f"{value!r} is not one of {', '.join(choices)}")


@dataclasses.dataclass
class ModelConfig:
    name: str = "dlrm"
    """``dlrm`` (TorchRec's DLRM) or ``dcn`` (DLRM with a DCN-v2 interaction)."""
    dense_in_features: int = 13
    """Dense (continuous) features per example: 13 in the Criteo format."""
    dense_arch_layer_sizes: List[int] = dataclasses.field(default_factory=lambda: [64, 16])
    """The bottom MLP; its last size must equal the embedding dimension."""
    over_arch_layer_sizes: List[int] = dataclasses.field(default_factory=lambda: [64, 1])
    """The top MLP; it ends in one logit."""
    dcn_num_layers: int = 2
    """DCN-v2 cross layers (``dcn`` only)."""
    dcn_low_rank_dim: int = 8
    """DCN-v2 low-rank dimension (``dcn`` only)."""

    def __post_init__(self) -> None:
        _require_choice(self.name, MODELS, "model.name")
        _require(self.dense_in_features >= 1, "model.dense_in_features", "must be >= 1")
        _require(all(s >= 1 for s in self.dense_arch_layer_sizes) and len(self.dense_arch_layer_sizes) >= 1,
                 "model.dense_arch_layer_sizes", "needs one or more sizes >= 1")  # fmt: skip
        _require(len(self.over_arch_layer_sizes) >= 1 and self.over_arch_layer_sizes[-1] == 1,
                 "model.over_arch_layer_sizes", "must end in 1 (one logit)")  # fmt: skip
        _require(self.dcn_num_layers >= 1 and self.dcn_low_rank_dim >= 1, "model.dcn_num_layers",
                 "dcn_num_layers and dcn_low_rank_dim must be >= 1")  # fmt: skip


@dataclasses.dataclass
class TableSpec:
    """One table of ``tables.per_table``; ``TablesConfig`` validates it, naming its index."""

    rows: int
    """Rows of this table."""
    pooling_factor: float
    """Mean ids per bag."""
    zipf_alpha: float
    """Zipf exponent of its ids, ``tbe_plugin.workloads``' law (0: uniform; any value >= 0)."""
    bag_lengths: str = "poisson"
    """``poisson`` (lengths ~ Poisson(pooling_factor), empty bags included) or ``fixed``
    (every bag ``round(pooling_factor)`` ids)."""

    def validate(self, key: str) -> None:
        _require(self.rows >= 1, f"{key}.rows", "must be >= 1")
        _require(self.pooling_factor > 0, f"{key}.pooling_factor", "must be > 0")
        _require(self.zipf_alpha >= 0, f"{key}.zipf_alpha", "must be >= 0")
        _require_choice(self.bag_lengths, BAG_LENGTHS, f"{key}.bag_lengths")


@dataclasses.dataclass
class TablesConfig:
    num_tables: int = 8
    """Sparse features, one table each (``t0`` .. ``t{n-1}``, features ``f0`` ..)."""
    rows: int = 10_000
    """Rows of every table (tables alike: neither ``workload`` nor ``per_table``)."""
    dim: int = 16
    """Embedding dimension of every table (DLRM's interaction needs one)."""
    pooling_factor: int = 8
    """Mean ids per bag; lengths are Poisson with this mean (tables alike)."""
    zipf_alpha: float = 1.15
    """Exponent of the Zipf distribution of ids, ``tbe_plugin.workloads``' truncated law
    (0: uniform; any value >= 0; tables alike)."""
    workload: Optional[str] = None
    """Per-table rows, pooling and Zipf exponents from a named workload of
    ``tbe_plugin.workloads``: ``ctr_dlrm`` (its DLRM-shaped click-through tables,
    ``ctr_tables_dlrm(num_tables, dim, workload_seed)``). Null: see ``per_table``."""
    workload_seed: int = 0
    """The seed the workload's tables are drawn with."""
    per_table: List[TableSpec] = dataclasses.field(default_factory=list)
    """Each table's rows, pooling and Zipf exponent, ``num_tables`` entries (empty: every table
    alike, from ``rows``, ``pooling_factor`` and ``zipf_alpha``)."""
    overrides: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Per-table fused-optimizer overrides, FBGEMM's names: ``{t0: {learning_rate: 0.1}}``."""

    def __post_init__(self) -> None:
        _require(self.num_tables >= 1, "tables.num_tables", "must be >= 1")
        _require(self.rows >= 1, "tables.rows", "must be >= 1")
        _require(self.dim >= 1, "tables.dim", "must be >= 1")
        _require(self.pooling_factor >= 1, "tables.pooling_factor", "must be >= 1")
        _require(self.zipf_alpha >= 0, "tables.zipf_alpha", "must be >= 0 (0: uniform)")
        _require(self.workload is None or self.workload in TABLE_WORKLOADS, "tables.workload",
                 f"{self.workload!r} is not one of {', '.join(TABLE_WORKLOADS)} (or null)")  # fmt: skip
        _require(self.workload is None or not self.per_table, "tables.per_table",
                 "give either tables.workload or tables.per_table, not both")  # fmt: skip
        _require(not self.per_table or len(self.per_table) == self.num_tables, "tables.per_table",
                 f"has {len(self.per_table)} entries for tables.num_tables={self.num_tables}")  # fmt: skip
        for i, spec in enumerate(self.per_table):
            spec.validate(f"tables.per_table[{i}]")
        names = {f"t{i}" for i in range(self.num_tables)}
        for table, values in self.overrides.items():
            _require(table in names, f"tables.overrides.{table}", f"no such table (t0..t{self.num_tables - 1})")
            for key in values:
                _require(key in ("learning_rate", "eps", "weight_decay", "beta1", "beta2"),
                         f"tables.overrides.{table}.{key}", "not a per-table optimizer setting")  # fmt: skip

    @property
    def alike(self) -> bool:
        """Every table from ``rows``, ``pooling_factor`` and ``zipf_alpha`` (the synthetic
        click log's tables); otherwise ``pipelines.app.data.table_workloads`` gives each table's."""
        return self.workload is None and not self.per_table


@dataclasses.dataclass
class SigReadersConfig(ScalingPolicy):
    """``data.sig.readers``: the reader pool's scaling policy (fields: ``ScalingPolicy``)."""

    min_readers: int = 1
    max_readers: int = 2
    queue_capacity: int = 4

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as error:
            raise ConfigError(f"data.sig.readers.{error}") from error


@dataclasses.dataclass
class SigDataConfig:
    """``data.sig``: batches from shared input generation (``pipelines.inputs``)."""

    store: str = "sig-store"
    """URL of the SIG store (a local directory; ``s3://``, ``gs://`` where fsspec has them)."""
    service: Optional[str] = None
    """URL of a SIG service (``python -m pipelines.inputs.service``) to ask instead of the
    store itself; null: readers use the store directly."""
    raw: str = "synthetic"
    """The raw click log: ``synthetic`` (written into ``raw_dir`` on first use) or ``tsv``
    (``raw_paths``, Criteo-format files, one partition each)."""
    raw_dir: str = "sig-raw"
    """``synthetic``: where its partitions' TSV files go."""
    raw_seed: int = 0
    """``synthetic``: the seed of the log."""
    raw_paths: List[str] = dataclasses.field(default_factory=list)
    """``tsv``: the files, training partitions first, then the evaluation ones."""
    rows_per_partition: int = 4096
    """``synthetic``: events per partition (a ``tsv`` file's lines must hold as many)."""
    train_partitions: int = 8
    """Partitions 0..n-1 are training data (each rank cycles over its share)."""
    eval_partitions: int = 1
    """The partitions after those are evaluation data."""
    window: int = 64
    """Events over which the user's activity feature counts the user's earlier events."""
    publish: bool = True
    """Readers store the parts SIG lacked (so later jobs, epochs and ranks find them)."""
    readers: SigReadersConfig = dataclasses.field(default_factory=SigReadersConfig)
    """The training readers' pool (evaluation reads in the trainer's process)."""
    decisions_file: Optional[str] = None
    """JSON lines of every scaling decision of the training readers' pool; ``{rank}`` in it
    becomes the rank (null: none written)."""

    def __post_init__(self) -> None:
        _require(bool(self.store), "data.sig.store", "must not be empty")
        _require_choice(self.raw, SIG_RAW_LOGS, "data.sig.raw")
        _require(self.rows_per_partition >= 1, "data.sig.rows_per_partition", "must be >= 1")
        _require(self.train_partitions >= 1, "data.sig.train_partitions", "must be >= 1")
        _require(self.eval_partitions >= 1, "data.sig.eval_partitions", "must be >= 1")
        _require(self.window >= 1, "data.sig.window", "must be >= 1")
        _require(self.raw != "tsv" or len(self.raw_paths) >= self.train_partitions + self.eval_partitions,
                 "data.sig.raw_paths", "needs train_partitions + eval_partitions files with raw=tsv")  # fmt: skip


@dataclasses.dataclass
class DataConfig:
    source: str = "synthetic"
    """``synthetic`` (the planted click log, ``pipelines.app.data.PlantedClickLog``: fresh batches
    per seed, rank and stream, a known optimum), ``criteo`` (TSV files, Criteo's format)
    or ``sig`` (features read through shared input generation: ``data.sig``)."""
    sig: SigDataConfig = dataclasses.field(default_factory=SigDataConfig)
    """``sig``: the store, the raw log and the readers."""
    batch_size: int = 256
    """Examples per batch on each rank."""
    seed: int = 0
    """Seed of the planted model and of its batches (each rank and stream draws its own)."""
    criteo_paths: List[str] = dataclasses.field(default_factory=list)
    """TSV files for ``criteo``: label, 13 integer and 26 hexadecimal categorical columns."""
    distinct_batches: int = 0
    """``synthetic``: generate this many training batches and cycle through them (0: every
    batch new). Large batches take the generator longer than a GPU step; cycling keeps
    the measured step the model's."""
    criteo_ready_suffix: Optional[str] = None
    """``criteo``: a file counts as ready once ``<file><suffix>`` exists too (e.g.
    ``._SUCCESS``, written when the file is whole); null: once the file exists. A job
    that reaches a file not ready holds (``HOLD.json`` kind ``data``, exit code 4)."""
    criteo_eval_paths: List[str] = dataclasses.field(default_factory=list)
    """``criteo``: held-out TSV files the evaluations read (never ``criteo_paths``, the
    training files); needed when ``eval_batches`` > 0."""
    planted_bias: float = -1.0
    """``synthetic``: the planted model's logit bias (-1: about 30% clicks)."""
    planted_dense_scale: float = 1.0
    """``synthetic``: weight of the dense features' effect (its part of the logit has this
    standard deviation)."""
    planted_id_scale: float = 1.5
    """``synthetic``: weight of the per-id effects (their part of the logit has about this
    standard deviation with distinct ids; hot rows repeated in a bag add more)."""
    planted_label_flip: float = 0.0
    """``synthetic``: probability that a label is flipped after its Bernoulli draw (label
    noise beyond the logistic model's; the optimum accounts for it)."""

    def __post_init__(self) -> None:
        _require_choice(self.source, DATA_SOURCES, "data.source")
        _require(self.criteo_ready_suffix is None or bool(self.criteo_ready_suffix), "data.criteo_ready_suffix",
                 "must be null or a non-empty suffix")  # fmt: skip
        _require(self.batch_size >= 1, "data.batch_size", "must be >= 1")
        _require(self.source != "sig" or self.sig.rows_per_partition >= self.batch_size, "data.sig.rows_per_partition",
                 f"must be >= data.batch_size ({self.batch_size}): batches do not span partitions")  # fmt: skip
        _require(self.distinct_batches >= 0, "data.distinct_batches", "must be >= 0")
        _require(self.source != "criteo" or bool(self.criteo_paths), "data.criteo_paths", "needed with source=criteo")
        overlap = sorted(set(self.criteo_eval_paths) & set(self.criteo_paths))
        _require(not overlap, "data.criteo_eval_paths", f"{overlap} are training files too (data.criteo_paths)")
        _require(0.0 <= self.planted_label_flip < 0.5, "data.planted_label_flip", "must be in [0, 0.5)")
        _require(self.planted_dense_scale >= 0 and self.planted_id_scale >= 0, "data.planted_dense_scale",
                 "planted_dense_scale and planted_id_scale must be >= 0")  # fmt: skip


@dataclasses.dataclass
class BackendConfig:
    name: str = "triton"
    """Embedding kernels: ``triton`` (ours) or ``fbgemm`` (FBGEMM's FUSED)."""

    def __post_init__(self) -> None:
        _require_choice(self.name, BACKENDS, "backend.name")


@dataclasses.dataclass
class ShardingConfig:
    sharding_types: List[str] = dataclasses.field(default_factory=list)
    """Sharding types the planner may use for every table (empty: any)."""
    per_table: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    """Sharding types allowed per table, overriding ``sharding_types``."""
    preset: str = ""
    """A partitioning preset (``SHARDING_PRESETS``; empty: ``sharding_types``): one sharding
    type, ``hybrid`` (all) or ``balanced`` (planned from ``statistics_file``)."""
    statistics_file: str = ""
    """Feature statistics JSON ``balanced`` plans from (``statistics_out`` of an earlier run)."""
    statistics_every: int = 0
    """Sample one step in this many for feature statistics and log the plan's imbalance at
    the end (0: off)."""
    statistics_out: str = ""
    """Where the statistics JSON goes at the end ({rank} is not needed: rank 0 writes it)."""
    repartition_every: int = 0
    """Re-plan from the statistics so far every this many steps and re-shard in mid-run
    when it pays (0: off; needs ``statistics_every`` and ``checkpoint.dir``)."""
    repartition_imbalance: float = 1.1
    """Re-plan only when the running plan's predicted max/mean rank cost reaches this (1: always)."""
    repartition_min_gain: float = 0.05
    """Re-shard when the new plan's predicted embedding step is this fraction faster (a
    negative value re-shards onto any different plan, even a slower one: for tests)."""

    def __post_init__(self) -> None:
        for key, types in [("sharding.sharding_types", self.sharding_types)] + [
            (f"sharding.per_table.{t}", v) for t, v in self.per_table.items()
        ]:
            bad = [t for t in types if t not in SHARDING_TYPES]
            _require(not bad, key, f"{bad} not among {', '.join(SHARDING_TYPES)}")
        if self.preset:
            _require_choice(self.preset, SHARDING_PRESETS, "sharding.preset")
            _require(not self.sharding_types and not self.per_table, "sharding.preset",
                     "set either a preset or sharding_types/per_table, not both")  # fmt: skip
        _require(self.preset != "balanced" or bool(self.statistics_file), "sharding.statistics_file",
                 "sharding.preset=balanced plans from measured statistics: give their JSON")  # fmt: skip
        _require(self.statistics_every >= 0, "sharding.statistics_every", "must be >= 0")
        _require(not self.statistics_out or self.statistics_every > 0, "sharding.statistics_out",
                 "needs sharding.statistics_every > 0")  # fmt: skip
        _require(self.repartition_every >= 0, "sharding.repartition_every", "must be >= 0 (0: off)")
        _require(not self.repartition_every or self.statistics_every > 0, "sharding.repartition_every",
                 "re-plans from the statistics: needs sharding.statistics_every > 0")  # fmt: skip
        _require(self.repartition_imbalance >= 1.0, "sharding.repartition_imbalance", "must be >= 1 (a max/mean)")
        _require(-1.0 <= self.repartition_min_gain < 1.0, "sharding.repartition_min_gain",
                 "must be in [-1, 1) (a fraction of the predicted step)")  # fmt: skip


@dataclasses.dataclass
class PipelineSettings:
    staleness: int = 0
    """Batches whose embedding lookups run ahead of training (0: a synchronous loop)."""
    dense_grad_lag: bool = False
    """Step the dense optimizer one batch behind (TorchRec's ``stash_gradients``)."""
    tbe_max_sms: Optional[int] = None
    """Cap on the SMs the embedding lookups and updates occupy (CUDA green context; null: all)."""

    def __post_init__(self) -> None:
        _require(self.staleness >= 0, "pipeline.staleness", "must be >= 0")
        _require(self.tbe_max_sms is None or self.tbe_max_sms >= 1, "pipeline.tbe_max_sms",
                 "must be >= 1 or null")  # fmt: skip


@dataclasses.dataclass
class OptimizerConfig:
    sparse: str = "EXACT_ROWWISE_ADAGRAD"
    """The fused embedding optimizer (FBGEMM's ``EmbOptimType`` name)."""
    sparse_lr: float = 0.01
    """Its learning rate."""
    sparse_eps: float = 1.0e-8
    """Its epsilon."""
    dense: str = "adagrad"
    """The dense parameters' optimizer: sgd, adagrad or adam."""
    dense_lr: float = 0.01
    """Its learning rate."""
    lr_schedule: str = "constant"
    """``constant`` or ``linear_warmup`` (over ``warmup_steps``), for both optimizers."""
    warmup_steps: int = 0
    """Steps of linear warm-up."""

    def __post_init__(self) -> None:
        _require_choice(self.sparse, SPARSE_OPTIMIZERS, "optimizer.sparse")
        _require_choice(self.dense, DENSE_OPTIMIZERS, "optimizer.dense")
        _require(self.sparse_lr > 0, "optimizer.sparse_lr", "must be > 0")
        _require(self.dense_lr > 0, "optimizer.dense_lr", "must be > 0")
        _require_choice(self.lr_schedule, LR_SCHEDULES, "optimizer.lr_schedule")
        _require(self.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")


@dataclasses.dataclass
class CheckpointConfig:
    dir: Optional[str] = None
    """Where checkpoints go (null: none are written)."""
    every_steps: int = 0
    """Save every this many steps (0: only at the end and on a pre-emption signal)."""
    resume: bool = True
    """Resume from the newest complete checkpoint in ``dir`` when there is one (incomplete
    ones, left by a process killed inside a save, are skipped with a warning)."""
    keep_last: int = 0
    """Keep the newest this many complete checkpoints, deleting older ones and incomplete
    leftovers after each save (0: keep every one)."""

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "checkpoint.every_steps", "must be >= 0")
        _require(self.keep_last >= 0, "checkpoint.keep_last", "must be >= 0 (0 keeps every checkpoint)")


@dataclasses.dataclass
class LoggingConfig:
    every_steps: int = 10
    """Log metrics every this many steps."""
    tensorboard: bool = False
    """Write TensorBoard events (rank 0) into ``tensorboard_dir``."""
    tensorboard_dir: str = "tensorboard"
    """Where TensorBoard events go (``tensorboard --logdir`` it)."""
    progress_bar: bool = True
    """Show a progress bar (rank 0)."""
    metrics_file: Optional[str] = None
    """JSON lines written by rank 0: every step's loss and time, each evaluation, the phase
    times of the profiled steps, the final metrics (what the A/B report reads)."""
    profile_steps: int = 0
    """Profile this many steps (after ``profile_after`` steps) and report the time per phase:
    TBE forward, TBE backward, all-to-all, dense and the rest."""
    profile_after: int = 5
    """Steps before the profiled ones (kernel compiles and warm-up stay out of them)."""

    def __post_init__(self) -> None:
        _require(self.every_steps >= 1, "logging.every_steps", "must be >= 1")
        _require(self.profile_steps >= 0, "logging.profile_steps", "must be >= 0")
        _require(self.profile_after >= 0, "logging.profile_after", "must be >= 0")
        _require(bool(self.tensorboard_dir), "logging.tensorboard_dir", "must not be empty")


@dataclasses.dataclass
class HealthConfig:
    check_state_every_steps: int = 100
    """Check a sample of the weights and optimizer state for non-finite values every this
    many steps (0: only the full check before each checkpoint). The check stays on the
    device; its flag is read with the losses, every ``logging.every_steps``."""
    check_state_rows: int = 1024
    """Rows sampled from each local table, optimizer state and dense tensor per check."""

    def __post_init__(self) -> None:
        _require(self.check_state_every_steps >= 0, "health.check_state_every_steps", "must be >= 0")
        _require(self.check_state_rows >= 1, "health.check_state_rows", "must be >= 1")


@dataclasses.dataclass
class TrainConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The network."""
    tables: TablesConfig = dataclasses.field(default_factory=TablesConfig)
    """The embedding tables and their id distributions."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """Where batches come from."""
    backend: BackendConfig = dataclasses.field(default_factory=BackendConfig)
    """The embedding kernels."""
    sharding: ShardingConfig = dataclasses.field(default_factory=ShardingConfig)
    """Planner constraints."""
    pipeline: PipelineSettings = dataclasses.field(default_factory=PipelineSettings)
    """The training pipeline."""
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    """Sparse and dense optimizers."""
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    """Checkpoints."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Metrics and progress."""
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    """Checks that put the job on hold (exit code 3) rather than train on non-finite values."""
    steps: int = 200
    """Training steps (batches per rank)."""
    eval_batches: int = 8
    """Batches per rank in each evaluation (AUC, log loss)."""
    eval_every_steps: int = 0
    """Evaluate every this many steps too (0: only at the end)."""

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "steps", "must be >= 1")
        _require(self.eval_batches >= 0, "eval_batches", "must be >= 0")
        _require(self.eval_every_steps >= 0, "eval_every_steps", "must be >= 0")
        _require(not self.sharding.repartition_every or bool(self.checkpoint.dir), "sharding.repartition_every",
                 "re-shards through a checkpoint: needs checkpoint.dir")  # fmt: skip
        if isinstance(self.data, DataConfig) and self.data.source == "criteo":
            _require(self.tables.num_tables == 26, "tables.num_tables", "must be 26 with data.source=criteo")
            _require(self.tables.alike, "tables.workload", "criteo's ids need tables alike (no workload, no per_table)")
            _require(self.model.dense_in_features == 13, "model.dense_in_features", "must be 13 with source=criteo")
            _require(self.eval_batches == 0 or bool(self.data.criteo_eval_paths), "data.criteo_eval_paths",
                     "needed with source=criteo and eval_batches > 0 (held-out files, not the training files)")  # fmt: skip
        if isinstance(self.data, DataConfig) and self.data.source == "sig":
            _require(3 <= self.tables.num_tables <= 28, "tables.num_tables",
                     "must be 3..28 with data.source=sig (hashed c0.., a cross, the user's activity)")  # fmt: skip
            _require(self.tables.alike, "tables.workload", "sig's ids need tables alike (no workload, no per_table)")
            _require(self.model.dense_in_features <= 13, "model.dense_in_features", "must be <= 13 with source=sig")
        if isinstance(self.model, ModelConfig) and isinstance(self.tables, TablesConfig):
            _require(self.model.dense_arch_layer_sizes[-1] == self.tables.dim, "model.dense_arch_layer_sizes",
                     f"must end in tables.dim ({self.tables.dim}): DLRM's interaction joins them")  # fmt: skip


GROUPS = {
    "model": ModelConfig,
    "tables": TablesConfig,
    "data": DataConfig,
    "backend": BackendConfig,
    "sharding": ShardingConfig,
    "pipeline": PipelineSettings,
    "optimizer": OptimizerConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


def register() -> None:
    """The schemas in Hydra's ConfigStore: ``train_schema`` for the root, ``<group>/schema``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, schema in GROUPS.items():
        store.store(group=group, name="schema", node=schema)


def validate(cfg: Any) -> TrainConfig:
    """The composed config as dataclasses, every ``__post_init__`` run: raises
    ``ConfigError`` naming the first bad key."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(cfg)
