"""TorchRec adapter: ``backend="triton"`` through TorchRec's planner and sharders.

``get_sharders("triton")`` (or ``"fbgemm"``) gives the sharders for
``DistributedModelParallel`` and the planner; ``make_planner`` a planner that prices our
kernel on CPU and GPU topologies; ``process_group.init_process_group`` starts the default
process group for the training app, the benchmarks and the tests' workers. Depends on
``tbe_plugin.module``; nothing below it depends on TorchRec.
"""

from tbe_plugin.torchrec.planner import make_planner
from tbe_plugin.torchrec.sharders import (
    BACKENDS,
    FbgemmEmbeddingBagCollectionSharder,
    FbgemmEmbeddingCollectionSharder,
    TritonEmbeddingBagCollectionSharder,
    TritonEmbeddingCollectionSharder,
    get_sharders,
)

__all__ = [
    "BACKENDS",
    "FbgemmEmbeddingBagCollectionSharder",
    "FbgemmEmbeddingCollectionSharder",
    "TritonEmbeddingBagCollectionSharder",
    "TritonEmbeddingCollectionSharder",
    "get_sharders",
    "make_planner",
]
