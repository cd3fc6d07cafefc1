"""Fixtures the backward's tests share."""

import pytest


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 16 positions for the sorted operands and the marks (both kernels): a batch of a
    few hundred ids spans many."""
    from tbe_plugin.ops import embedding_backward, pieces_launch

    monkeypatch.setattr(embedding_backward, "SORTED_OPERANDS_BLOCK", 16)
    monkeypatch.setattr(pieces_launch, "MARKS_BLOCK", 16)
