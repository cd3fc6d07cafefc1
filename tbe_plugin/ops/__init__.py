"""Triton kernels, their launchers and custom ops, and pure-PyTorch references.

Imports Triton and torch only (never torchrec or fbgemm_gpu). Import through the
``tbe_plugin`` package so that the interpreter switch in its ``__init__`` runs first.
"""
