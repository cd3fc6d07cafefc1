"""Where TorchRec versions differ, for the adapter: the one place that knows.

TorchRec 1.6.1 (the device stack) and 1.8.0 (CPU, CI) both define
``EmbeddingComputeKernel.FUSED_TRITON`` and dispatch it in
``GroupedPooledEmbeddingsLookup._create_embedding_kernel`` to a class whose backing module
ships in no wheel (1.6.1 passes ``sharding_type`` and ``env``, 1.8.0 does not), and
``GroupedEmbeddingsLookup`` (unpooled) has no branch for it. We keep both methods'
signatures, identical in the two versions, and route FUSED_TRITON to our lookup classes;
every other kernel goes to TorchRec's own code untouched. See DESIGN.md, sections 2 and 4.
"""

import functools
import importlib.metadata
import inspect
from typing import Any, Callable

TORCHREC_VERSION = importlib.metadata.version("torchrec")

# The kernel factories of the pooled and unpooled lookups, in 1.6.1 and 1.8.0 alike.
_POOLED_PARAMETERS = ["self", "config", "device", "pg", "sharding_type", "env"]
_UNPOOLED_PARAMETERS = ["self", "config", "pg", "device", "env"]
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
    """Routes FUSED_TRITON tables to ``TritonFusedEmbeddingBag`` (pooled lookups) and
    ``TritonFusedEmbedding`` (unpooled). Idempotent. Raises, naming the TorchRec version,
    if a method to wrap is not the one this adapter was written against."""
    from torchrec.distributed.embedding_lookup import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup

    _wrap(GroupedPooledEmbeddingsLookup, _POOLED_PARAMETERS, _route_pooled)
    _wrap(GroupedEmbeddingsLookup, _UNPOOLED_PARAMETERS, _route_unpooled)


def _wrap(lookup: type, expected: list, route: Callable[..., Any]) -> None:
    original = lookup._create_embedding_kernel
    if getattr(original, _INSTALLED_MARK, False):
        return
    parameters = list(inspect.signature(original).parameters)
    if parameters != expected:
        raise RuntimeError(
            f"torchrec {TORCHREC_VERSION}: {lookup.__name__}._create_embedding_kernel takes "
            f"{parameters}, not {expected}; the tbe_plugin adapter does not know this version"
        )
    routed = functools.wraps(original)(route(original, triton_kernel()))
    setattr(routed, _INSTALLED_MARK, True)
    lookup._create_embedding_kernel = routed


def _route_pooled(original: Callable[..., Any], kernel: str) -> Callable[..., Any]:
    def create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel.value == kernel:
            from tbe_plugin.torchrec.lookup import TritonFusedEmbeddingBag

            return TritonFusedEmbeddingBag(config, pg=pg, device=device, sharding_type=sharding_type, env=env)
        return original(self, config, device, pg, sharding_type, env)

    return create_embedding_kernel


def _route_unpooled(original: Callable[..., Any], kernel: str) -> Callable[..., Any]:
    def create_embedding_kernel(self, config, pg, device, env=None):
        if config.compute_kernel.value == kernel:
            from tbe_plugin.torchrec.lookup import TritonFusedEmbedding

            return TritonFusedEmbedding(config, pg=pg, device=device, env=env)
        return original(self, config, pg, device, env)

    return create_embedding_kernel
