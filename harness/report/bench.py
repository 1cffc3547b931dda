"""The benchmark cases' summary: one line per measured case with its gate verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tabulate import tabulate

from harness.bench import CaseMeasurement

SUMMARY_HEADERS = (
    "Case",
    "Plain tok/s",
    "Assisted tok/s",
    "Speedup [95% CI]",
    "Acceptance",
    "alpha",
    "K",
    "Predicted (v=1)",
    "Predicted (measured v)",
    "Non-forward share",
    "Gate",
)


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summary_table(entries: Sequence[tuple[CaseMeasurement, str]]) -> str:
    """One line per measured case (with its gate verdict), GitHub markdown via tabulate."""
    body = []
    for m, verdict in entries:
        s = m.summary()
        body.append(
            [
                f"{s['pair']} {s['case_id']}",
                _f(s["plain_tokens_per_s"], ".2f"),
                _f(s["assisted_tokens_per_s"], ".2f"),
                f"{_f(s['speedup'], '.2f')}x [{_f(s['speedup_low'], '.2f')}-{_f(s['speedup_high'], '.2f')}]",
                _f(s["acceptance_rate"], ".2f"),
                _f(s["alpha"], ".2f"),
                s["num_assistant_tokens"],
                _f(s["predicted_speedup"], ".2f"),
                _f(s["predicted_speedup_verify"], ".2f"),
                _f(s["assisted_non_forward_share"], ".1%"),
                verdict,
            ]
        )
    return tabulate(body, headers=SUMMARY_HEADERS, tablefmt="github", disable_numparse=True)
