"""tbe_plugin: Triton table-batched embedding kernels for TorchRec, an FBGEMM drop-in.

Layers, each importing only those before it: ``tbe_plugin.ops`` (Triton + torch:
kernels, custom ops, references) <- ``tbe_plugin.module`` (the nn.Module) <- the
TorchRec adapter <- ``pipelines``.

Without CUDA, Triton kernels can only run in Triton's interpreter, so importing this
package on a machine without a GPU turns it on (``TRITON_INTERPRET=1``) unless the
variable is already set. It must be set before any kernel is defined.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tbe_plugin.module import TritonTableBatchedEmbeddingBags  # noqa: E402
from tbe_plugin.ops.bounds import BoundsCheckError  # noqa: E402

__all__ = ["TritonTableBatchedEmbeddingBags", "BoundsCheckError"]
