"""Decoding: what runs a pair's loop and turns one prompt into a ``Measurement``.

``base`` is the ``Engine`` class every engine subclasses; ``engines`` the registry (the entry-point
group ``assisted_generation.engines``) and the one ``resolve``/``load`` every run goes through. The
built-in engines: ``generation`` (transformers' ``generate`` with the suite's clocks, and ``trees``,
the harness's token-tree loop), ``genai`` (onnxruntime-genai's Generator), ``llama_server``
(llama.cpp's server), ``openvino`` (OpenVINO GenAI's pipelines), ``served`` (a deployment's
OpenAI-compatible endpoints). ``strategies`` are the draft strategies the equivalence suite proves.
Imports from ``pairs`` and below.
"""
