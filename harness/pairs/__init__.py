"""Pairs: the registry of model pairs and loading one for a ``RunSetup`` (``models``), with its
precisions, kernels and devices. Imports from ``kernels``, ``weights`` and below.
"""
