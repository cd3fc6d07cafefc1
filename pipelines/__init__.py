"""Training pipelines over TorchRec models (issue 5): ``StalenessTrainPipeline``.

This package is the library: the pipeline (``staleness``, ``_compat``, ``reference``),
checkpoints, holds, resumable data positions, metrics, errors and shared input generation
(``inputs``). Two module groups sit on top of it: ``pipelines.app`` (the Hydra training
app: config schemas, data sources, repartitioning, supervisor) and ``pipelines.bench``
(benchmarks). Dependencies point one way: the library imports ``tbe_plugin`` and never
``pipelines.app`` or ``pipelines.bench``; the app never imports ``pipelines.bench``
(``tests/test_layers.py`` checks both).
"""

from pipelines.staleness import StalenessTrainPipeline

__all__ = ["StalenessTrainPipeline"]
