"""Shared input generation (SIG, issue 18): feature transforms as a declared graph, their
parts materialized once as Parquet under a URL and served to every job whose graph needs
them, readers that ask SIG first, and an autoscaled pool of reader processes.

Modules: ``raw`` (raw click-event logs: Criteo-format TSV, a synthetic one), ``transforms``
(the ops), ``graph`` (nodes, stable keys), ``store`` (the Parquet store and its commit
protocol), ``reader`` (``SigReader``), ``service`` (SIG over HTTP, localhost by default),
``pool`` (reader processes and the scaling controller), ``batches`` (the training app's
``data=sig`` source: TorchRec batches). Everything but ``batches`` imports pyarrow, numpy
and fsspec only, so a reader process starts without torch; nothing here imports the app.
"""
