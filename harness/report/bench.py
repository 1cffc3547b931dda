"""The benchmark cases' summary: one line per measured case with its gate verdict."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

from tabulate import tabulate

from harness.experiments.bench import CaseMeasurement

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


def summary_table(entries: Sequence[tuple[CaseMeasurement, str]], wide: bool = False) -> str:
    """One line per measured case, GitHub markdown via tabulate. On a terminal (the default) the
    cases are numbered and named below the table with their gate verdicts, within 120 columns;
    ``wide``: every column on one line per case."""
    body = []
    summaries = [m.summary() for m, _ in entries]
    for n, ((_, verdict), s) in enumerate(zip(entries, summaries, strict=True), 1):
        speedup = f"{_f(s['speedup'], '.2f')}x [{_f(s['speedup_low'], '.2f')}-{_f(s['speedup_high'], '.2f')}]"
        if wide:
            body.append(
                [
                    f"{s['pair']} {s['case_id']}",
                    _f(s["plain_tokens_per_s"], ".2f"),
                    _f(s["assisted_tokens_per_s"], ".2f"),
                    speedup,
                    _f(s["acceptance_rate"], ".2f"),
                    _f(s["alpha"], ".2f"),
                    s["num_assistant_tokens"],
                    _f(s["predicted_speedup"], ".2f"),
                    _f(s["predicted_speedup_verify"], ".2f"),
                    _f(s["assisted_non_forward_share"], ".1%"),
                    verdict,
                ]
            )
        else:
            body.append(
                [
                    n,
                    _f(s["plain_tokens_per_s"], ".1f"),
                    _f(s["assisted_tokens_per_s"], ".1f"),
                    speedup,
                    _f(s["alpha"], ".2f"),
                    s["num_assistant_tokens"],
                    _f(s["predicted_speedup_verify"], ".2f"),
                    _f(s["assisted_non_forward_share"], ".1%"),
                ]
            )
    if wide:
        return tabulate(body, headers=SUMMARY_HEADERS, tablefmt="github", disable_numparse=True)
    table = tabulate(body, headers=_SHORT_HEADERS, tablefmt="github", disable_numparse=True)
    names = []
    for n, ((_, verdict), s) in enumerate(zip(entries, summaries, strict=True), 1):
        names.append(f"{n}: {s['pair']} {s['case_id']}")
        names.append(
            # Paths and case ids stay whole (a broken path cannot be copied).
            textwrap.fill(
                f"gate: {verdict}",
                120,
                initial_indent="   ",
                subsequent_indent="   ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join([table, "", *names])


_SHORT_HEADERS = ("#", "Plain tok/s", "Assisted tok/s", "Speedup [95% CI]", "alpha", "K", "Pred.", "Non-fwd")
