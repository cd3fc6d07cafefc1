"""torchx components for the training app.

Locally: ``torchx run -s local_cwd scripts/torchx_components.py:train -- backend=triton
pipeline.staleness=1`` (from the repository root). The same component targets torchx's
cluster schedulers (``-s slurm``, ``-s kubernetes``, with an image holding this project),
e.g. ``torchx run -s slurm scripts/torchx_components.py:train --nnodes 4 --nproc_per_node 8
--gpu 8 -- experiment=ab_triton_stale1``.

The job exits 3 on a permanent-error hold and 4 on a data hold (``HOLD.json`` in its
working directory says why): torchrun is run under ``python -m pipelines.app.supervise
--once``, which passes those codes through (torchrun alone exits 1 for both), so a
scheduler's retry policy can tell them from a crash.
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
    """``python -m pipelines.app.train`` under torchrun, with Hydra overrides.

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
    app = dist.ddp(
        *overrides, m="pipelines.app.train", j=f"{nnodes}x{nproc_per_node}", gpu=gpu, cpu=cpu, memMB=memMB,
        image=image, name="tbe-train", env=env, rdzv_port=rdzv_port,
    )  # fmt: skip
    role = app.roles[0]
    if role.entrypoint != "bash" or role.args[:1] != ["-c"]:  # torchx's layout, probed: it may change
        raise RuntimeError(f"torchx dist.ddp gave entrypoint {role.entrypoint!r} {role.args[:1]}, expected bash -c")
    role.args = ["-c", f"python -m pipelines.app.supervise --once -- {role.args[1]}"]
    return app
