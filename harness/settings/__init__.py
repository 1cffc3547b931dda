"""Run settings and the stores derived from them: ``setup`` (``RunSetup`` and ``FIELDS``), the row
store (``results``), baselines (``baselines``), the sweep's configurations (``configs``), the seeds'
tables (``seeds``) and the precisions a run names (``precision``). Imports from ``theory`` and
``base``.
"""
