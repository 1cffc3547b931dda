"""The suite's options, fixtures and parametrisation are the harness's pytest plugin
(``harness/pytest_plugin.py``), which the set-up command installs as a ``pytest11`` entry point.

A checkout run without that install (or with plugin autoloading off) loads the plugin from here
instead, so both ways run the same suite.
"""

import sys

# pytester: the suite's own tests run pytest in-process where a run ends at configure or collection.
pytest_plugins = ["pytester"]
# Entry-point plugins are imported before any conftest: loading it again would register it twice.
if "harness.pytest_plugin" not in sys.modules:
    pytest_plugins.append("harness.pytest_plugin")
