"""A/B benchmarks of our Triton TBE against FBGEMM and plain PyTorch.

``common`` holds what every benchmark shares (configs, input generation, timing,
byte accounting, reports); ``forward`` is the pooled-forward benchmark, run as
``python -m tbe_plugin.benchmarks.forward``; ``backward`` the backward + fused-optimizer
benchmark, ``python -m tbe_plugin.benchmarks.backward``. Benchmarks compare and report; they never
assert a time. Nothing in the library imports this package.
"""
