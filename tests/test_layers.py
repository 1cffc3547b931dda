"""The package's layers (pyproject.toml's import-linter contract) hold: no module imports from a layer
above its own, and every module has its place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# In a child process: import-linter configures logging for its own output, which would switch off
# the harness's loggers for every later test in this process.
CHECK = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
)


def test_harness_imports_only_downward() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "harness layers KEPT" in done.stdout
