"""Regression and performance harness for assisted generation (speculative decoding).

"The seeds", throughout: the documents this project grew from (AMD's published assisted-generation
results for Ryzen AI laptops: their ``assisted_generation.py`` command line, model pairs, settings and
result tables). The suite keeps their command line and table format, and its baselines for those
pairs are read from them (``harness.settings.seeds``).
"""

__version__ = "0.1.0"
