"""Where TorchRec versions differ, for the adapter: the one place that knows.

TorchRec 1.6.1 (the device stack) and 1.8.0 (CPU, CI) both define
``EmbeddingComputeKernel.FUSED_TRITON`` and dispatch it in
``GroupedPooledEmbeddingsLookup._create_embedding_kernel`` to a class whose backing module
ships in no wheel (1.6.1 passes ``sharding_type`` and ``env``, 1.8.0 does not). We keep
that method's signature, identical in both, and route FUSED_TRITON to our lookup class;
every other kernel goes to TorchRec's own code untouched. See DESIGN.md, sections 2 and 4.
"""

import functools
import importlib.metadata
import inspect
from typing import Any, Callable

TORCHREC_VERSION = importlib.metadata.version("torchrec")

# GroupedPooledEmbeddingsLookup._create_embedding_kernel, in 1.6.1 and 1.8.0 alike.
_DISPATCH_PARAMETERS = ["self", "config", "device", "pg", "sharding_type", "env"]
_INSTALLED_MARK = "_tbe_plugin_dispatch"


def triton_kernel() -> str:
    """TorchRec's name for a Triton compute kernel (``"fused_triton"``)."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel

    kernel = getattr(EmbeddingComputeKernel, "FUSED_TRITON", None)
    if kernel is None:
        raise RuntimeError(
            f"torchrec {TORCHREC_VERSION} has no EmbeddingComputeKernel.FUSED_TRITON; "
            "backend=triton needs torchrec 1.6 or later"
        )
    return kernel.value


def install_lookup_dispatch() -> None:
    """Routes FUSED_TRITON tables of pooled lookups to ``TritonFusedEmbeddingBag``.

    Idempotent. Raises, naming the TorchRec version, if the method to wrap is not the
    one this adapter was written against.
    """
    from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup

    original = GroupedPooledEmbeddingsLookup._create_embedding_kernel
    if getattr(original, _INSTALLED_MARK, False):
        return
    parameters = list(inspect.signature(original).parameters)
    if parameters != _DISPATCH_PARAMETERS:
        raise RuntimeError(
            f"torchrec {TORCHREC_VERSION}: GroupedPooledEmbeddingsLookup._create_embedding_kernel"
            f" takes {parameters}, not {_DISPATCH_PARAMETERS}; the tbe_plugin adapter does not "
            "know this version"
        )
    GroupedPooledEmbeddingsLookup._create_embedding_kernel = _route_triton(original)


def _route_triton(original: Callable[..., Any]) -> Callable[..., Any]:
    kernel = triton_kernel()

    @functools.wraps(original)
    def create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel.value == kernel:
            from tbe_plugin.torchrec.lookup import TritonFusedEmbeddingBag

            return TritonFusedEmbeddingBag(config, pg=pg, device=device, sharding_type=sharding_type, env=env)
        return original(self, config, device, pg, sharding_type, env)

    setattr(create_embedding_kernel, _INSTALLED_MARK, True)
    return create_embedding_kernel
