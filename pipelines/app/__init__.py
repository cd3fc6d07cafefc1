"""The training app: ``python -m pipelines.app.train [hydra overrides]`` (``train``), its
schemas (``config``), data sources (``data``), re-sharding from statistics
(``repartition``) and the job's controller (``python -m pipelines.app.supervise``).

Imports the library (``pipelines``) and ``tbe_plugin``, never ``pipelines.bench``. The
benchmarks and the launch scripts may import it; the library may not.
"""
