"""The batch-invariant kernels (C++ sources beside them, built on first use by ``cppext``) and the
modules that put a model on them: ``invariant`` (dense precisions), ``kquants`` (k-quant blocks),
``fused`` (a decoder layer in a few calls). Imports from ``weights``, ``settings`` and below.
"""
