"""Regression and performance harness for assisted generation (speculative decoding)."""

__version__ = "0.1.0"
