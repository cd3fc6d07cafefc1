"""TorchRec's pipeline internals the staleness pipeline builds on: the one place that
imports them, checked against the signatures this package was written for (TorchRec
1.6.1 and 1.8.0 agree; see DESIGN.md, section 1)."""

import inspect

from tbe_plugin.torchrec._compat import TORCHREC_VERSION
from torchrec.distributed.train_pipeline.pipeline_context import EmbeddingTrainPipelineContext
from torchrec.distributed.train_pipeline.runtime_forwards import EmbeddingPipelinedForward
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipeline
from torchrec.distributed.types import LazyNoWait
from torchrec.distributed.train_pipeline.utils import (
    _override_input_dist_forwards,
    _pipeline_detach_model,
    _rewrite_model,
    _start_data_dist,
)

_EXPECTED = {
    _rewrite_model: ["model", "context", "dist_stream", "batch"],
    _start_data_dist: ["pipelined_modules", "batch", "context"],
    _pipeline_detach_model: [
        "model", "pipelined_modules", "original_forwards", "original_kjt_dist_forwards", "pipelined_postprocs"
    ],
}
for _function, _parameters in _EXPECTED.items():
    _actual = list(inspect.signature(_function).parameters)[: len(_parameters)]
    if _actual != _parameters:
        raise ImportError(
            f"torchrec {TORCHREC_VERSION}: {_function.__name__} takes {_actual}, not {_parameters}; "
            "the pipelines package does not know this version"
        )

__all__ = [
    "EmbeddingPipelinedForward",
    "EmbeddingTrainPipelineContext",
    "LazyNoWait",
    "TrainPipeline",
    "_override_input_dist_forwards",
    "_pipeline_detach_model",
    "_rewrite_model",
    "_start_data_dist",
]
