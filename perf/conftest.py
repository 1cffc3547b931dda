"""Session summaries of the decode suite (the divergence table), printed after the test results."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import equivalence

DIVERGENCE = pytest.StashKey[equivalence.DivergenceTable]()


@pytest.fixture(scope="session")
def divergence_table(pytestconfig: pytest.Config) -> equivalence.DivergenceTable:
    """Collects every precision-tier case; the table is printed in the terminal summary."""
    out = pytestconfig.getoption("--divergence-out")
    table = equivalence.DivergenceTable(rows_path=Path(out) if out else None)
    return pytestconfig.stash.setdefault(DIVERGENCE, table)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    table = config.stash.get(DIVERGENCE, None)
    if table is not None and table.counts:
        terminalreporter.section("divergence of assisted from plain greedy output, per target precision")
        terminalreporter.write_line(table.markdown())
