"""Training pipelines over TorchRec models (issue 5): ``StalenessTrainPipeline``."""

from pipelines.staleness import StalenessTrainPipeline

__all__ = ["StalenessTrainPipeline"]
