"""The sandbox that scores untrusted completions (``sandbox``) and the program it runs inside the
isolation (``sandbox_runner``, which imports nothing of the suite). Imports from ``base`` only.
"""
