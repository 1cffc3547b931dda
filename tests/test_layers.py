"""The package's layers (pyproject.toml's import-linter contract) hold: no module imports from a layer
above its own, and every module has its place."""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter import cli

ROOT = Path(__file__).resolve().parents[1]


def test_harness_imports_only_downward(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    code = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out
