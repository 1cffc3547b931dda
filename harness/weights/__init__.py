"""Weights and exports: the packaged pair's parts assembled and converted (``packaged``,
``gguf_convert``), weights located (``weights``), ONNX exports and their runtime adapter
(``onnx_export``, ``onnx_model``) and the tiny stand-ins (``tiny``). Imports from ``settings`` and below.
"""
