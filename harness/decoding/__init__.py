"""Decoding: what runs a pair's loop and turns one prompt into a ``Measurement``.

``engines`` is the engine interface and its registry (transformers' loop, onnxruntime-genai's);
``generation`` is transformers' ``generate`` with the suite's clocks, ``genai`` onnxruntime-genai's
Generator, ``strategies`` the draft strategies the equivalence suite proves. Imports from ``pairs``
and below.
"""
