"""The suite's options, fixtures and parametrisation are the harness's pytest plugin
(``harness/pytest_plugin.py``), which the set-up command installs as a ``pytest11`` entry point.

A checkout run without that install (or with plugin autoloading off) loads the plugin from here
instead, so both ways run the same suite.
"""

import sys

# Entry-point plugins are imported before any conftest: loading it again would register it twice.
if "harness.pytest_plugin" not in sys.modules:
    pytest_plugins = ["harness.pytest_plugin"]
