"""What the backward's update kernels take beside their sums, for both designs (``embedding_backward``'s
chunk launches and ``pieces_launch``): the step count, the momenta, the hyperparameters' device vector, the
output-gradient cell, and the device's multiprocessors that size the looping grids.

Lives in ``tbe_plugin.ops``: imports torch only.
"""

from typing import Optional

import torch

from tbe_plugin.ops.optimizers import OptimizerArgs, hyper_values

_MULTIPROCESSORS: dict = {}


def _cell_argument(grad_cell: Optional[torch.Tensor], grad_output: torch.Tensor) -> torch.Tensor:
    """The ``grad_cell_ptr`` argument of the kernels that read the output gradient (their
    GRAD_CELL is ``grad_cell is not None``): the cell when there is one, else the gradient
    itself, a pointer then never read."""
    return grad_cell if grad_cell is not None else grad_output


def hyper_tensor(args: OptimizerArgs, device: torch.device, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``args``' runtime values (``optimizers.HYPER_FIELDS``) as the fp64 vector the update
    kernels read, on ``device`` (into ``out`` when given): one small host-to-device copy a
    step, from pinned memory on CUDA (no host sync)."""
    values = torch.tensor(hyper_values(args), dtype=torch.float64, pin_memory=device.type == "cuda")
    if out is None:
        return values.to(device, non_blocking=True)
    return out.copy_(values, non_blocking=True)


def _update_operands(args, weights, momentum1, momentum2, step, sorted_rows, align):
    """What every update kernel takes beside its sums: the step count, both momenta (the
    weights stand in for state an optimizer lacks: never read), the hyperparameters (a
    device vector, ``hyper_tensor``) and the constexpr modes."""
    if step is None:
        step = sorted_rows  # never read: only Adam and LAMB take a step count
    m1 = momentum1 if momentum1 is not None else weights
    m2 = momentum2 if momentum2 is not None else weights
    hyper = args.hyper if args.hyper is not None else hyper_tensor(args, weights.device)
    modes = dict(OPTIMIZER=args.optimizer, WEIGHT_DECAY_MODE=args.weight_decay_mode,
                 STOCHASTIC_ROUNDING=args.stochastic_rounding, ALIGN=align)  # fmt: skip
    return step, m1, m2, hyper, modes


def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (4 for the CPU's interpreter)."""
    key = str(device)
    if key not in _MULTIPROCESSORS:
        cuda = device.type == "cuda"
        _MULTIPROCESSORS[key] = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    return _MULTIPROCESSORS[key]
