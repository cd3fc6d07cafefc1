"""Benchmarks of the pipelines: step time of the pipelines on a DLRM (``pipeline``), the
end-to-end TorchRec DLRM over CTR tables (``e2e``), shared input generation's targets
(``inputs``). Each runs as ``python -m pipelines.bench.<name>``.

The top of ``pipelines``: imports the library, the app's schemas, data sources and model
builder (``pipelines.app``) so it times the job users run, and ``tbe_plugin``. Nothing in
``pipelines`` or ``pipelines.app`` imports it; tests and scripts may.
"""
