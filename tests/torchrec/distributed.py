"""Runs a function in a few processes joined by a process group, and collects what each returns.

The workers are spawned: they import everything afresh, inheriting the parent's
environment (``TRITON_INTERPRET=1`` from conftest), and return plain Python values.
"""

import os
import pickle
import tempfile
from typing import Any, Callable, List

import torch.multiprocessing as mp

from tbe_plugin.torchrec.process_group import free_port

# The process-group backend a caller names -> the device type that picks it.
_DEVICE_TYPES = {"gloo": "cpu", "nccl": "cuda"}


def _worker(
    rank: int, world_size: int, port: int, out_dir: str, backend: str, fn: Callable[..., Any], args: tuple
) -> None:
    import torch.distributed as dist

    from tbe_plugin.torchrec.process_group import init_process_group

    # What torchrun would set: one node, every rank local (TorchRec's topology reads
    # LOCAL_WORLD_SIZE).
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
    )  # fmt: skip
    init_process_group(_DEVICE_TYPES[backend])
    try:
        result = fn(rank, world_size, *args)
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: str = "gloo") -> List[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` ranks of a ``backend`` process
    group (gloo on CPU, nccl on GPUs); their results by rank. ``fn`` must be importable
    (a module-level function)."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _worker, args=(world_size, free_port(), out_dir, backend, fn, args), nprocs=world_size,
            start_method="spawn",
        )  # fmt: skip
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
