"""Starting the default process group, the one way the project does it.

``init_process_group`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); a single process started without it
becomes a 1-rank group on a free local port. nccl on CUDA, gloo on the CPU.

Imports torch only. The lowest layer that every caller may import: the training app
(``pipelines.app.train``), the benchmarks (``pipelines.bench``,
``tbe_plugin.benchmarks.sharded``) and the tests' spawned workers
(``tests/torchrec/distributed.py``); ``tbe_plugin.ops`` and ``tbe_plugin.module`` do not
start process groups.
"""

import os
import socket
from typing import Optional, Tuple

import torch

BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(device_type: Optional[str] = None) -> Tuple[int, int, torch.device]:
    """Starts the default process group; returns (rank, world size, this rank's device).

    ``device_type``: ``cuda`` (nccl; the device ``cuda:LOCAL_RANK`` becomes current) or
    ``cpu`` (gloo, even where CUDA exists: the tests' CPU workers and the CPU smoke
    benchmarks ask for it); None picks ``cuda`` when CUDA is available. Without ``RANK``
    in the environment (one process, no launcher) it sets ``RANK=0``, ``WORLD_SIZE=1``,
    ``LOCAL_RANK=0`` and ``MASTER_ADDR``/``MASTER_PORT`` to 127.0.0.1 and a free port:
    a stale ``MASTER_PORT`` left in the environment without a rank is not reused, and
    code run after this in the process (TorchRec, DCP) sees a consistent environment."""
    import torch.distributed as dist

    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type not in BACKENDS:
        raise ValueError(f"device_type: {device_type!r} is not one of {', '.join(BACKENDS)}")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))  # fmt: skip
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(BACKENDS[device_type], rank=rank, world_size=world_size)
    return rank, world_size, device
