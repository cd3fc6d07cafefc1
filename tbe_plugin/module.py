"""``TritonTableBatchedEmbeddingBags``: an nn.Module with FBGEMM's TBE interface.

It takes the constructor arguments and enums of FBGEMM's
``SplitTableBatchedEmbeddingBagsCodegen`` (the supported subset; anything else raises,
naming the argument), owns the flat weight buffer and the optimizer state, validates
inputs at the host boundary and runs the forward (the ``tbe_plugin::tbe_forward``
custom op under torch.compile) and, through autograd, the fused backward that updates the
tables and optimizer state in place (``tbe_plugin::tbe_lookup_train`` under torch.compile).

May import ``tbe_plugin.ops``; the TorchRec adapter builds on this module.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from tbe_plugin.fbgemm_args import (
    _OPTIMIZER_STATE,
    _WEIGHT_DECAY_MODES,
    _STATE_NAMES,
    _HYPER_PARAMETERS,
    _INERT_FBGEMM_ARGS,
    _CACHE_ARGS,
    _exclusive_cumsum,
    _enum_name,
    _dtype_of,
    _resolve_device,
)
from tbe_plugin.ops.bounds import validate_forward_inputs
from tbe_plugin.ops.optimizers import Optimizer, WeightDecay
from tbe_plugin.ops.training import (
    LookupConfig,
    UpdateConfig,
    forward_positions_for,
    fused_update,
    plan_in_forward,
    merge_bounds_status_op,
    training_lookup,
)
from tbe_plugin.ops.common import BoundsCheck, Pooling, new_status, profiled, vector_alignment
from tbe_plugin.ops.backward_graphs import BackwardGraphs
from tbe_plugin.ops.backward_launch import RunsLaunch, class_first_rows, row_classes, runs_launch
from tbe_plugin.ops.embedding_forward import forward_and_warn, tbe_forward
from tbe_plugin.ops.indexing import (
    META_COLS,
    META_DIM,
    META_MOMENTUM1_OFFSET,
    META_MOMENTUM2_OFFSET,
    META_OUT_OFFSET,
    META_ROW_BASE,
    META_ROWS,
    META_WEIGHT_OFFSET,
)

class TritonTableBatchedEmbeddingBags(nn.Module):
    """Table-batched embedding bags on Triton kernels, FBGEMM's interface and semantics.

    Replacing ``SplitTableBatchedEmbeddingBagsCodegen(...)`` by this class with the same
    arguments gives the same results for the supported subset: weights FP32/FP16/BF16,
    output FP32/FP16/BF16, pooling SUM/MEAN/NONE, every ``BoundsCheckMode``, tables on the
    device (``EmbeddingLocation.DEVICE``, or ``HOST`` with ``ComputeDevice.CPU``).
    """

    def __init__(
        self,
        embedding_specs: Sequence[Union[Tuple[int, int], Tuple[int, int, Any, Any]]],
        feature_table_map: Optional[Sequence[int]] = None,
        weights_precision: Any = "FP32",
        output_dtype: Any = "FP32",
        optimizer: Any = "EXACT_SGD",
        stochastic_rounding: bool = True,
        learning_rate: float = 0.01,
        eps: float = 1.0e-8,
        weight_decay: float = 0.0,
        weight_decay_mode: Any = "NONE",
        beta1: float = 0.9,
        beta2: float = 0.999,
        pooling_mode: Any = "SUM",
        device: Any = None,
        bounds_check_mode: Any = "WARNING",
        table_names: Optional[Sequence[str]] = None,
        embedding_table_index_type: torch.dtype = torch.int64,
        embedding_table_offset_type: torch.dtype = torch.int64,
        **fbgemm_kwargs: Any,
    ) -> None:
        super().__init__()
        self._reject_unsupported(fbgemm_kwargs)
        specs = [tuple(s) for s in embedding_specs]
        if not specs:
            raise ValueError("embedding_specs is empty: at least one table is needed")
        for t, spec in enumerate(specs):
            if len(spec) not in (2, 4):
                raise ValueError(
                    f"embedding_specs[{t}] = {spec!r}: expected (rows, dim) or "
                    "(rows, dim, EmbeddingLocation, ComputeDevice)"
                )
            rows, dim = spec[0], spec[1]
            if int(rows) < 1 or int(dim) < 1:
                raise ValueError(f"embedding_specs[{t}]: rows and dim must be >= 1, got {rows}, {dim}")
        self.device = _resolve_device(specs, device)
        for t, spec in enumerate(specs):
            if len(spec) == 4:
                self._check_location(t, _enum_name(spec[2], "EmbeddingLocation"))

        self.table_rows: List[int] = [int(s[0]) for s in specs]
        self.table_dims: List[int] = [int(s[1]) for s in specs]
        num_tables = len(specs)
        self.feature_table_map: List[int] = (
            list(range(num_tables)) if feature_table_map is None else [int(t) for t in feature_table_map]
        )
        bad = [t for t in self.feature_table_map if not 0 <= t < num_tables]
        if not self.feature_table_map or bad:
            raise ValueError(
                f"feature_table_map must name tables 0..{num_tables - 1}, got {self.feature_table_map}"
            )
        if table_names is not None and len(table_names) != num_tables:
            raise ValueError(f"table_names has {len(table_names)} names for {num_tables} tables")
        self.table_names = list(table_names) if table_names is not None else None
        for name, dtype in (
            ("embedding_table_index_type", embedding_table_index_type),
            ("embedding_table_offset_type", embedding_table_offset_type),
        ):
            if dtype not in (torch.int32, torch.int64):
                raise ValueError(f"{name} must be torch.int32 or torch.int64, got {dtype}")

        self.weights_precision = _dtype_of(weights_precision, "weights_precision")
        self.output_dtype = _dtype_of(output_dtype, "output_dtype")
        self.pooling_mode = Pooling[self._member(pooling_mode, "pooling_mode", Pooling)]
        self.bounds_check_mode = BoundsCheck[
            self._member(bounds_check_mode, "bounds_check_mode", BoundsCheck)
        ]
        self.optimizer = self._member(optimizer, "optimizer", _OPTIMIZER_STATE)
        self.weight_decay_mode = self._member(weight_decay_mode, "weight_decay_mode", _WEIGHT_DECAY_MODES)
        self._check_weight_decay(float(weight_decay))
        self.stochastic_rounding = bool(stochastic_rounding)
        # fp32 on the host, as FBGEMM keeps it: get_learning_rate() reads back the fp32
        # value, and the fused backward passes it to kernels as a runtime scalar.
        self.learning_rate_tensor = torch.tensor(float(learning_rate), dtype=torch.float32)
        self.optimizer_args = {
            "eps": float(eps),
            "weight_decay": float(weight_decay),
            "beta1": float(beta1),
            "beta2": float(beta2),
        }
        # The same values as a host tensor, which the training ops take: a compiled graph
        # then reads them at run time instead of guarding on the floats.
        self.hyper_tensor = torch.tensor(self._hyper_values(), dtype=torch.float64)

        # Flat storage: table t's rows back to back from weights_offsets[t] (FBGEMM's
        # weights_dev / weights_offsets); each table pays for its own D only.
        sizes = [r * d for r, d in zip(self.table_rows, self.table_dims)]
        weights_offsets = _exclusive_cumsum(sizes)
        self.register_buffer(
            "weights",
            torch.zeros(sum(sizes), dtype=self.weights_precision, device=self.device),
        )
        self._table_offsets: List[int] = weights_offsets
        self.register_buffer(
            "weights_offsets", torch.tensor(weights_offsets, dtype=torch.int64, device=self.device)
        )
        # Global rows (the backward's sort keys, and the index of row-wise optimizer state):
        # tables numbered class by class of row tile (``ops.backward_launch``), so that each
        # class's ids sort into one range and its kernels use its own tile.
        row_bases, class_rows = class_first_rows(self.table_rows, self.table_dims)
        self._row_classes: List[int] = [
            value for pair in zip(row_classes(self.table_dims), class_rows[:-1]) for value in pair
        ]
        state_offsets = self._init_optimizer_state(row_bases)

        feature_dims = [self.table_dims[t] for t in self.feature_table_map]
        out_offsets = _exclusive_cumsum(feature_dims)
        meta = torch.zeros(len(feature_dims), META_COLS, dtype=torch.int64)
        for f, t in enumerate(self.feature_table_map):
            meta[f, META_WEIGHT_OFFSET] = weights_offsets[t]
            meta[f, META_ROWS] = self.table_rows[t]
            meta[f, META_DIM] = self.table_dims[t]
            meta[f, META_OUT_OFFSET] = out_offsets[f]
            meta[f, META_ROW_BASE] = row_bases[t]
            meta[f, META_MOMENTUM1_OFFSET] = state_offsets["momentum1"][t]
            meta[f, META_MOMENTUM2_OFFSET] = state_offsets["momentum2"][t]
        self.register_buffer("feature_meta", meta.to(self.device), persistent=False)
        self.feature_dims: List[int] = feature_dims
        self.D_offsets: List[int] = out_offsets + [out_offsets[-1] + feature_dims[-1]]
        self._align = vector_alignment(self.table_dims, self.weights.element_size())
        # Autograd reaches the fused backward through this empty parameter, as in FBGEMM.
        self.placeholder_autograd_tensor = nn.Parameter(torch.zeros(0, device=self.device))
        # Seed of stochastic rounding, advanced every step; a host tensor so that it is a
        # runtime value under torch.compile too (as is learning_rate_tensor).
        self.rounding_seed = torch.zeros((), dtype=torch.int64)
        # Launch sizes of the backward's kernels (``ops.backward_launch.RunsLaunch``); None:
        # their heuristic. Tests and profilers set another.
        self.backward_launch: Optional[RunsLaunch] = None
        # The backwards captured as CUDA graphs, for batches the launch says to graph
        # (``RunsLaunch.graph_max_ids``: up to 2**20 ids by default).
        self.backward_graphs = BackwardGraphs()
        # Bounds-check counters, filled by the kernels (FBGEMM: bounds_check_warning).
        self.register_buffer("bounds_check_status", new_status(self.device), persistent=False)

    # ----------------------------------------------------------------- construction

    @staticmethod
    def _reject_unsupported(kwargs: Dict[str, Any]) -> None:
        for name, value in kwargs.items():
            if name in _CACHE_ARGS:
                continue
            if name not in _INERT_FBGEMM_ARGS:
                raise TypeError(f"TritonTableBatchedEmbeddingBags got an unexpected argument {name!r}")
            default = _INERT_FBGEMM_ARGS[name]
            if value is not default and value != default:
                raise NotImplementedError(
                    f"TritonTableBatchedEmbeddingBags does not support {name}={value!r} "
                    f"(only FBGEMM's default {default!r})"
                )

    @staticmethod
    def _member(value: Any, what: str, allowed) -> str:
        name = _enum_name(value, what)
        names = list(allowed.__members__) if isinstance(allowed, type) else list(allowed)
        if name not in names:
            raise NotImplementedError(f"{what}={name} is not supported; supported: {', '.join(names)}")
        return name

    def _check_weight_decay(self, weight_decay: float) -> None:
        """Weight decay as FBGEMM's kernels apply it; what they would ignore, we refuse."""
        if self.optimizer in ("EXACT_SGD", "EXACT_ADAGRAD") and weight_decay != 0.0:
            raise NotImplementedError(
                f"weight_decay={weight_decay} with optimizer={self.optimizer}: FBGEMM's kernel "
                "for this optimizer applies no weight decay; use EXACT_ROWWISE_ADAGRAD or Adam"
            )
        adam_family = self.optimizer in ("ADAM", "PARTIAL_ROWWISE_ADAM", "LAMB")
        if adam_family and self.weight_decay_mode != "NONE":
            raise NotImplementedError(
                f"weight_decay_mode={self.weight_decay_mode} with optimizer={self.optimizer}: "
                "FBGEMM adds weight_decay * w to this optimizer's update whatever the mode; "
                "leave weight_decay_mode=NONE"
            )

    def _check_location(self, table: int, location: str) -> None:
        ok = {"cuda": ("DEVICE",), "cpu": ("HOST", "DEVICE")}[self.device.type]
        if location not in ok:
            raise NotImplementedError(
                f"embedding_specs[{table}]: EmbeddingLocation.{location} is not supported on "
                f"{self.device.type} (supported: {', '.join(ok)}); UVM and caching are not implemented"
            )

    def _init_optimizer_state(self, row_bases: List[int]) -> Dict[str, List[int]]:
        """Optimizer state in fp32, flat with per-table offsets, as the fused backward
        updates it in place (row-wise state by global row: ``row_bases``, element-wise
        state like the weights); returns those offsets (zeros for a state the optimizer lacks)."""
        m1, m2, has_step = _OPTIMIZER_STATE[self.optimizer]
        offsets = {}
        for name, kind in (("momentum1", m1), ("momentum2", m2)):
            if kind is None:
                offsets[name] = [0] * len(self.table_rows)
                continue
            per_table = [r if kind == "row" else r * d for r, d in zip(self.table_rows, self.table_dims)]
            offsets[name] = list(row_bases) if kind == "row" else _exclusive_cumsum(per_table)
            setattr(self, f"_{name}_offsets", offsets[name])
            self.register_buffer(name, torch.zeros(sum(per_table), dtype=torch.float32, device=self.device))
            self.register_buffer(
                f"{name}_offsets", torch.tensor(offsets[name], dtype=torch.int64, device=self.device)
            )
        if has_step:
            self.register_buffer("iter", torch.zeros(1, dtype=torch.int64, device=self.device))
        return offsets

    # ------------------------------------------------------------------ weights

    def split_embedding_weights(self) -> List[torch.Tensor]:
        """Per-table ``[rows, dim]`` views of the flat weight buffer (writes go through)."""
        return [
            self.weights[start : start + rows * dim].view(rows, dim)
            for start, rows, dim in zip(self._table_offsets, self.table_rows, self.table_dims)
        ]

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        """Per table, views of its optimizer states in FBGEMM's order and shapes:
        momentum1 then momentum2, ``[rows]`` when rowwise, else ``[rows, dim]``;
        ``[]`` for EXACT_SGD, as FBGEMM returns."""
        m1, m2, _ = _OPTIMIZER_STATE[self.optimizer]
        if m1 is None:
            return []
        states = []
        for t, (rows, dim) in enumerate(zip(self.table_rows, self.table_dims)):
            per_table = []
            for name, kind in (("momentum1", m1), ("momentum2", m2)):
                if kind is None:
                    continue
                buffer, start = getattr(self, name), int(getattr(self, f"_{name}_offsets")[t])
                size = rows if kind == "row" else rows * dim
                view = buffer[start : start + size]
                per_table.append(view if kind == "row" else view.view(rows, dim))
            states.append(per_table)
        return states

    def get_optimizer_state(self) -> List[Dict[str, torch.Tensor]]:
        """Per table, ``split_optimizer_states()``'s views under FBGEMM's names: ``sum``
        (Adagrad), ``exp_avg`` and ``exp_avg_sq`` (Adam, LAMB); ``[]`` for EXACT_SGD."""
        names = _STATE_NAMES[self.optimizer]
        return [dict(zip(names, states)) for states in self.split_optimizer_states()]

    @torch.no_grad()
    def init_embedding_weights_uniform(self, min_val: float, max_val: float) -> None:
        """Fills every table with U(min_val, max_val), table by table as FBGEMM does."""
        for view in self.split_embedding_weights():
            view.uniform_(min_val, max_val)

    # ---------------------------------------------------------------- optimizer

    def set_learning_rate(self, lr: float) -> None:
        """Sets the learning rate of the fused optimizer (a runtime value: nothing recompiles)."""
        self.learning_rate_tensor.fill_(float(lr))

    def get_learning_rate(self) -> float:
        return self.learning_rate_tensor.item()

    def set_optimizer_step(self, step: int) -> None:
        """Sets the step count of Adam/LAMB's bias correction: the next step is ``step + 1``.

        Optimizers without one accept it and change nothing, as in FBGEMM (which writes it to
        a counter they never read). FBGEMM's forward reads a host copy of the count that
        follows this only before the process's first step; here there is one count.
        """
        if int(step) < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if _OPTIMIZER_STATE[self.optimizer][2]:
            self.iter.fill_(int(step))

    def update_hyper_parameters(self, params_dict: Dict[str, float]) -> None:
        """Sets hyper-parameters by FBGEMM's names; the next backward reads them. An unknown
        name raises before any is set. They are runtime values, for compiled graphs too
        (held in a host tensor, as the learning rate is): nothing recompiles."""
        for name in params_dict:
            if name not in _HYPER_PARAMETERS:
                raise NotImplementedError(f"Setting hyper-parameter {name} is not supported")
        if "weight_decay" in params_dict:
            self._check_weight_decay(float(params_dict["weight_decay"]))
        for name, value in params_dict.items():
            if name == "lr":
                self.set_learning_rate(value)
            elif name != "lower_bound":  # inert without global weight decay, as in FBGEMM
                self.optimizer_args[name] = float(value)
        self.hyper_tensor.copy_(torch.tensor(self._hyper_values(), dtype=torch.float64))

    def _hyper_values(self) -> List[float]:
        return [self.optimizer_args[k] for k in ("eps", "beta1", "beta2", "weight_decay")]

    def flush(self) -> None:
        """No-op: there is no cache to write back; the tables are the only copy."""

    def reset_cache_states(self) -> None:
        """No-op: there is no cache whose state could be reset."""

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor] = None,
        feature_requires_grad: Optional[torch.Tensor] = None,
        batch_size_per_feature_per_rank: Optional[List[List[int]]] = None,
        total_unique_indices: Optional[int] = None,
    ) -> torch.Tensor:
        """FBGEMM's forward: ``indices`` flat, ``offsets`` of length T*B+1, feature-major.

        Returns ``[B, sum of D]`` pooled, or ``[len(indices), max D]`` for PoolingMode.NONE.
        """
        if batch_size_per_feature_per_rank is not None:
            raise NotImplementedError(
                "batch_size_per_feature_per_rank (variable batch size per feature) is not supported"
            )
        if per_sample_weights is not None and self.pooling_mode == Pooling.NONE:
            # FBGEMM accepts them here and silently ignores them; we refuse instead.
            raise ValueError("per_sample_weights are not supported with PoolingMode.NONE")
        # feature_requires_grad and total_unique_indices only steer FBGEMM's backward and
        # cache prefetch; they do not change the forward's result.
        validate_forward_inputs(
            indices, offsets, per_sample_weights, len(self.feature_table_map), self.device
        )
        if not torch.is_grad_enabled():
            return self._lookup(indices, offsets, per_sample_weights)
        if torch.compiler.is_compiling():
            return self._compiled_training_lookup(indices, offsets, per_sample_weights)
        return _FusedLookup.apply(self.placeholder_autograd_tensor, per_sample_weights, self, indices, offsets)

    def _lookup(self, indices, offsets, per_sample_weights, positions=None):
        with profiled("tbe_plugin::lookup"):  # a profiler range: phase times
            return self._forward_kernels(indices, offsets, per_sample_weights, positions)

    def _forward_kernels(self, indices, offsets, per_sample_weights, positions=None):
        """The forward kernels; ``positions`` (eager training, ``_forward_positions``): the
        backward's positions written beside the output (not through the registered op)."""
        args = (self.weights, self.feature_meta, indices, offsets, per_sample_weights, self.bounds_check_status,
                self.feature_dims, int(self.pooling_mode), int(self.bounds_check_mode), self.output_dtype,
                self._align)  # fmt: skip
        if positions is not None:
            return forward_and_warn(*args, positions=positions)
        return tbe_forward(*args)

    # ----------------------------------------------------------------- backward

    def _training_config(self) -> tuple:
        """(max_dim, total_rows, row alignment, pooling, bounds check on, optimizer, decay
        mode, rounding, hyper)."""
        return (
            max(self.table_dims),
            sum(self.table_rows),
            self._align,
            int(self.pooling_mode),
            self.bounds_check_mode != BoundsCheck.NONE,
            int(Optimizer[self.optimizer]),
            int(WeightDecay[self.weight_decay_mode]),
            self.stochastic_rounding and self.weights_precision != torch.float32,
            self.hyper_tensor,
        )

    def _state_tensors(self) -> tuple:
        """(momentum1, momentum2, step): None where the optimizer has no such state (buffers
        read from the module's buffer table: ``getattr`` of an absent one raises and catches
        an AttributeError inside ``nn.Module.__getattr__``: ~4 us a step for the three, CPU)."""
        buffers = self._buffers
        return buffers.get("momentum1"), buffers.get("momentum2"), buffers.get("iter")

    @torch.no_grad()
    def _fused_backward(self, grad_output, indices, offsets, per_sample_weights, psw_requires_grad, plan=None):
        """Applies the optimizer to the rows the batch touched (FBGEMM's fused backward);
        ``plan``: the batch's plan from its forward (``_plan_backward``)."""
        with profiled("tbe_plugin::fused_update"):
            psw_grad = fused_update(
                grad_output.contiguous(), self.weights, *self._state_tensors(), self.rounding_seed,
                self.learning_rate_tensor, self.feature_meta, indices, offsets, per_sample_weights,
                psw_requires_grad, *self._training_config(), launch=self.backward_launch, classes=self._row_classes,
                graphs=self.backward_graphs, plan=plan,
            )  # fmt: skip
        return psw_grad if psw_requires_grad else None

    def _forward_positions(self, indices, offsets, per_sample_weights, psw_requires_grad):
        """Buffers for the backward's positions, which the forward then writes
        (``RunsLaunch.forward_positions``), or None."""
        return forward_positions_for(self.feature_meta, sum(self.table_rows), indices, offsets, per_sample_weights,
                                     psw_requires_grad, int(self.pooling_mode), self.backward_launch,
                                     self.backward_graphs, self.bounds_check_mode != BoundsCheck.NONE)  # fmt: skip

    @torch.no_grad()
    def _plan_backward(self, indices, offsets, per_sample_weights, psw_requires_grad, output, positions=None):
        """The backward's id-only part, started beside what follows the lookup
        (``RunsLaunch.plan_in_forward``); None where the backward plans by itself.
        ``positions``: those the forward wrote (``_forward_positions``)."""
        if not (self.backward_launch or runs_launch()).plan_in_forward:
            return None  # (first: small batches' steps are host-bound)
        max_dim, total_rows, _, pooling, check, optimizer = self._training_config()[:6]
        return plan_in_forward(
            self.feature_meta, total_rows, max_dim, indices, offsets, per_sample_weights, psw_requires_grad,
            pooling, check, optimizer, output.shape, self.backward_launch, self._row_classes, self.backward_graphs,
            positions,
        )  # fmt: skip

    def _compiled_training_lookup(self, indices, offsets, per_sample_weights):
        """The training forward as registered ops with autograd, for torch.compile: the
        backward updates these very tensors in place (``ops.training.training_lookup``)."""
        if self.backward_launch is not None:  # the update op's schema has no place for it
            raise NotImplementedError(
                "backward_launch is not supported under torch.compile (the compiled backward uses "
                "runs_launch's sizes); set it to None or train eagerly"
            )
        max_dim, total_rows, align, pooling, check, optimizer, decay, rounding, hyper = self._training_config()
        out, status = training_lookup(
            self.placeholder_autograd_tensor, indices, offsets, per_sample_weights, self.feature_meta,
            (self.weights, *self._state_tensors(), self.rounding_seed), self.learning_rate_tensor, hyper,
            LookupConfig(self.feature_dims, pooling, int(self.bounds_check_mode), self.output_dtype, align),
            UpdateConfig(max_dim, total_rows, align, pooling, check, optimizer, decay, rounding),
            self._row_classes,
        )  # fmt: skip
        merge_bounds_status_op(self.bounds_check_status, status, int(self.bounds_check_mode))
        return out


class _FusedLookup(torch.autograd.Function):
    """Forward lookup; its backward updates the tables in place and returns no gradient
    for them (FBGEMM's ``placeholder_autograd_tensor`` scheme), only for the per-sample
    weights when they require it."""

    @staticmethod
    def forward(ctx, placeholder, per_sample_weights, module, indices, offsets):
        ctx.module = module
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        positions = module._forward_positions(indices, offsets, per_sample_weights, ctx.needs_input_grad[1])
        output = module._lookup(indices, offsets, per_sample_weights, positions)
        ctx.plan = module._plan_backward(indices, offsets, per_sample_weights, ctx.needs_input_grad[1], output,
                                         positions)  # fmt: skip
        return output

    @staticmethod
    def backward(ctx, grad_output):
        indices, offsets, per_sample_weights = ctx.saved_tensors
        plan, ctx.plan = ctx.plan, None  # its memory goes with the step
        psw_grad = ctx.module._fused_backward(
            grad_output, indices, offsets, per_sample_weights, ctx.needs_input_grad[1], plan
        )
        return None, psw_grad, None, None, None
