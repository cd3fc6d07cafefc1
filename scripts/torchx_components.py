"""torchx components for the training app.

Locally: ``torchx run -s local_cwd scripts/torchx_components.py:train -- backend=triton
pipeline.staleness=1`` (from the repository root). The same component targets torchx's
cluster schedulers (``-s slurm``, ``-s kubernetes``, with an image holding this project),
e.g. ``torchx run -s slurm scripts/torchx_components.py:train --nnodes 4 --nproc_per_node 8
--gpu 8 -- experiment=ab_triton_stale1``.
"""

import torchx.specs as specs
from torchx.components import dist


def train(
    *overrides: str,
    nnodes: int = 1,
    nproc_per_node: int = 2,
    gpu: int = 0,
    cpu: int = 2,
    memMB: int = 8192,
    image: str = "ghcr.io/pytorch/torchx:0.7.0",
    rdzv_port: int = 29500,
) -> specs.AppDef:
    """``python -m pipelines.train`` under torchrun, with Hydra overrides.

    Args:
        overrides: Hydra overrides for the training app, e.g. backend=triton pipeline.staleness=1
        nnodes: number of nodes
        nproc_per_node: processes per node (one per GPU on GPU nodes)
        gpu: GPUs per node (0: CPU processes with gloo, and Triton's interpreter)
        cpu: CPUs per node
        memMB: memory per node, in MB
        image: container image with this project installed (ignored by local_cwd)
        rdzv_port: rendezvous port
    """
    env = {} if gpu > 0 else {"TRITON_INTERPRET": "1"}
    return dist.ddp(
        *overrides, m="pipelines.train", j=f"{nnodes}x{nproc_per_node}", gpu=gpu, cpu=cpu, memMB=memMB,
        image=image, name="tbe-train", env=env, rdzv_port=rdzv_port,
    )  # fmt: skip
