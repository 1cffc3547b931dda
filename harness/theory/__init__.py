"""The theory and statistics: acceptance and Leviathan's speedup (``analysis``), estimates and
tests (``stats``), what one decode measures (``timing``). Imports from ``base`` only.
"""
