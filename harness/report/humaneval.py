"""HumanEval's table and figure: pass@1 per mode with the per-problem lines, and the speedup per
problem beside its distribution (the scoring and its rows are ``harness.experiments.humaneval``'s)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.base.errors import HarnessError
from harness.experiments.humaneval import summarise
from harness.report import png_bytes


def format_table(summary: Mapping[str, Any], *, per_problem: bool = True, tablefmt: str = "simple") -> str:
    """Overall pass@1 per mode, a summary line, then (optionally) one line per problem in the seeds'
    style (new tokens, tokens/sec; plus acceptance and speedup). ``tablefmt="github"``: markdown."""
    from tabulate import tabulate

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def mark(x: bool | None) -> str:
        return "-" if x is None else ("yes" if x else "no")

    overall = [
        [mode, s["tasks"], s["passed"], pct(s["pass@1"]), pct(summary["paired_pass@1"][mode])]
        for mode, s in summary["modes"].items()
    ]
    text = tabulate(
        overall, headers=["Mode", "Tasks", "Passed", "pass@1", "pass@1 (paired tasks)"], tablefmt=tablefmt
    )
    text += (
        f"\n\npaired tasks: {summary['paired_tasks']}, identical completions: "
        f"{summary['identical_completions']}, pass@1 equal: {mark(summary['pass@1_equal'])}"
    )
    if summary["disagreements"]:
        text += f", tasks passing in one mode only: {', '.join(summary['disagreements'])}"
    rate = summary.get("tokens_per_s") or {}
    if rate.get("plain") and rate.get("assisted"):
        text += (
            f"\ntokens/s (all new tokens / all wall time, prefill included): plain {rate['plain']:.2f}, "
            f"assisted {rate['assisted']:.2f}; speedup {summary['speedup']:.2f}x"
        )
        if summary.get("acceptance") is not None:
            text += f"; acceptance {summary['acceptance']:.2f}"
    if summary["mean_speedup"] is not None:
        text += f"; mean per-problem speedup {summary['mean_speedup']:.2f}x"
    if per_problem:

        def num(x: float | None, fmt: str) -> str:
            return "-" if x is None else format(x, fmt)

        lines = [
            [
                p["task_id"],
                mark(p["plain_passed"]),
                mark(p["assisted_passed"]),
                mark(p["identical"]),
                f"{num(p['new_tokens']['plain'], '.0f')} / {num(p['new_tokens']['assisted'], '.0f')}",
                num(p["tokens_per_s"]["plain"], ".2f"),
                num(p["tokens_per_s"]["assisted"], ".2f"),
                num(p["acceptance"], ".2f"),
                "-" if p["speedup"] is None else f"{p['speedup']:.2f}x",
            ]
            for p in summary["per_problem"]
        ]
        headers = [
            "Task",
            "Plain passed",
            "Assisted passed",
            "Identical",
            "New Tokens (plain / assisted)",
            "Tokens/Sec plain",
            "Tokens/Sec assisted",
            "Acceptance",
            "Speedup",
        ]
        text += "\n\n" + tabulate(lines, headers=headers, tablefmt=tablefmt)
    return text


def plot_speedup(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Assisted-over-plain speedup per problem (needs total_s or tokens_per_s fields): bars in task
    order, a tick every few tasks so the labels stay readable at 164 problems, and beside them the
    distribution of the speedups."""

    from matplotlib.figure import Figure

    summary = summarise(rows)
    points = [(p["task_id"], p["speedup"], p["identical"]) for p in summary["per_problem"] if p["speedup"]]
    if not points:
        raise HarnessError(
            "no problem has both a plain and an assisted row with timing (total_s or tokens_per_s); "
            "pass the timing measurements to make_row to plot speedups"
        )
    speedups = [s for _, s, _ in points]
    labels = [t.split("/")[1] for t, _, _ in points]
    colors = ["tab:blue" if same else "tab:red" for _, _, same in points]
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    bars, hist = fig.subplots(1, 2, width_ratios=(4, 1), sharey=True)
    bars.bar(range(len(points)), speedups, color=colors, width=0.85)
    bars.axhline(1.0, color="black", linewidth=0.8)
    step = max(1, -(-len(points) // 20))  # at most ~20 labelled ticks
    ticks = list(range(0, len(points), step))
    bars.set_xticks(ticks, [labels[i] for i in ticks], fontsize=8)
    bars.set_xlim(-1, len(points))
    bars.set_xlabel("HumanEval task number (red: completion differs from plain)")
    bars.set_ylabel("speedup (plain time / assisted time)")
    bars.set_title(f"Speedup per problem, {len(points)} problems (mean {summary['mean_speedup']:.2f}x)")
    hist.hist(speedups, bins=min(30, max(5, len(points) // 5)), orientation="horizontal", color="tab:blue")
    hist.axhline(1.0, color="black", linewidth=0.8)
    hist.set_xlabel("problems")
    hist.set_title("distribution")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png_bytes(fig))
    return out
