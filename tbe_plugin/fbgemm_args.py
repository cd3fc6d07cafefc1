"""FBGEMM's constructor vocabulary as ``TritonTableBatchedEmbeddingBags`` reads it: the
precisions, optimizers and their state layouts and names, hyperparameter names, the
arguments it does not implement (with the values at which they are inert), and the helpers
that turn FBGEMM's enums (any version's classes, or their names) and devices into ours,
raising on what is not supported and naming it.

Imports torch only; the module (``tbe_plugin.module``) builds on it.
"""

import enum
from typing import Any, Dict, List, Sequence

import torch

# FBGEMM names -> torch dtypes for the precisions we serve.
_PRECISIONS = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}

# Optimizer -> (momentum1 per row or per element, momentum2 ..., has a step counter).
# None: no such state. Layouts follow FBGEMM's split_optimizer_states().
_OPTIMIZER_STATE = {
    "EXACT_SGD": (None, None, False),
    "EXACT_ROWWISE_ADAGRAD": ("row", None, False),
    "EXACT_ADAGRAD": ("element", None, False),
    "ADAM": ("element", "element", True),
    "PARTIAL_ROWWISE_ADAM": ("element", "row", True),
    "LAMB": ("element", "element", True),
}
_WEIGHT_DECAY_MODES = ("NONE", "L2", "DECOUPLE")
# FBGEMM's get_optimizer_state() names for each table's split_optimizer_states(), in order.
_STATE_NAMES = {
    "EXACT_SGD": (),
    "EXACT_ROWWISE_ADAGRAD": ("sum",),
    "EXACT_ADAGRAD": ("sum",),
    "ADAM": ("exp_avg", "exp_avg_sq"),
    "PARTIAL_ROWWISE_ADAM": ("exp_avg", "exp_avg_sq"),
    "LAMB": ("exp_avg", "exp_avg_sq"),
}
# The names FBGEMM's update_hyper_parameters() accepts; "lower_bound" is global weight
# decay's floor, read only with global weight decay, which this module rejects.
_HYPER_PARAMETERS = ("lr", "eps", "beta1", "beta2", "weight_decay", "lower_bound")

# FBGEMM constructor arguments this module does not implement, with the values at which
# they have no effect (FBGEMM's defaults). Passing another value raises, naming it.
_INERT_FBGEMM_ARGS: Dict[str, Any] = {
    "enforce_hbm": False,
    "record_cache_metrics": None,
    "gather_uvm_cache_stats": False,
    "gradient_clipping": False,
    "max_gradient": 1.0,
    "max_norm": 0.0,
    "momentum": 0.9,
    "eta": 0.001,
    "ensemble_mode": None,
    "emainplace_mode": None,
    "counter_based_regularization": None,
    "cowclip_regularization": None,
    "uvm_non_rowwise_momentum": False,
    "use_experimental_tbe": False,
    "prefetch_pipeline": False,
    "stats_reporter_config": None,
    "optimizer_state_dtypes": None,
    "multipass_prefetch_config": None,
    "global_weight_decay": None,
    "uvm_host_mapped": False,
    "extra_optimizer_config": None,
    "tbe_input_multiplexer_config": None,
    "embedding_shard_info": None,
    "enable_raw_embedding_streaming": False,
    "res_params": None,
    "is_qr_tbe": False,
    "preallocated_host_buffers": None,
}
# Software-cache settings: FBGEMM reads them only for MANAGED_CACHING tables, which this
# module rejects, so any value is as inert here as it is in FBGEMM without such tables.
_CACHE_ARGS = ("cache_algorithm", "cache_load_factor", "cache_sets", "cache_reserved_memory", "cache_precision")


def _exclusive_cumsum(sizes: Sequence[int]) -> List[int]:
    """Start of each piece when pieces of ``sizes`` are laid back to back."""
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts


def _enum_name(value: Any, what: str) -> str:
    """The member name of an FBGEMM enum (any version's class), or of a plain string."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, str):
        return value.upper()
    raise TypeError(f"{what} must be an FBGEMM enum member or its name, got {value!r}")


def _dtype_of(value: Any, what: str) -> torch.dtype:
    name = _enum_name(value, what)
    if name not in _PRECISIONS:
        raise NotImplementedError(
            f"{what}={name} is not supported; supported: {', '.join(_PRECISIONS)}"
        )
    return _PRECISIONS[name]


def _resolve_device(specs: Sequence[tuple], device: Any) -> torch.device:
    """The device as FBGEMM derives it: explicit, else from the specs' ComputeDevice."""
    if device is not None:
        resolved = torch.device(device)
        if resolved.type == "cuda" and resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.type not in ("cpu", "cuda"):
            raise NotImplementedError(f"device={resolved} is not supported (cpu or cuda)")
        return resolved
    computes = {_enum_name(s[3], "ComputeDevice") for s in specs if len(s) == 4}
    if len(computes) > 1:
        raise ValueError(f"embedding_specs mix compute devices {sorted(computes)}; give one")
    compute = computes.pop() if computes else ("CUDA" if torch.cuda.is_available() else "CPU")
    if compute == "CUDA":
        return torch.device("cuda", torch.cuda.current_device())
    if compute == "CPU":
        return torch.device("cpu")
    raise NotImplementedError(f"ComputeDevice.{compute} is not supported (CPU or CUDA)")
