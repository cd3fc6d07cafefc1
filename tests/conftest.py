"""Test session set-up: the Triton interpreter on CPU-only machines, and the gpu marker.

TRITON_INTERPRET must be set before any kernel is defined, so it is set here, before
the tests import tbe_plugin (whose __init__ would set it too).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marker gpu); run on the device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
