"""Experiments: what the suite measures and proves, each writing rows as it goes.

``bench`` (benchmark cases, rounds and the speedup gate) and ``sweep`` (configurations side by side)
sit above ``runner`` (the CLI's runs, and ``record``: a measured decode as a row), ``equivalence``
(assisted output against plain), ``humaneval`` (pass@1 in the sandbox), ``row_divergence`` and
``forwards`` (per-op and per-forward costs); ``experiment`` is the one interleaved loop they share.
Imports from ``decoding`` and below, never from ``report``, ``suite`` or the CLI.
"""
