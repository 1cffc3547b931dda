"""Concurrent requests' levels as a table and a plot: where speculation stops paying as load grows."""

from __future__ import annotations

from collections.abc import Sequence

from harness.experiments.concurrency import Level
from harness.report import png_bytes


def title(model: str, engine: str, platform: str) -> str:
    return f"{model} on {engine}, {platform}: tokens/s against concurrent streams"


def table(levels: Sequence[Level]) -> str:
    """Per level: each mode's aggregate and per-request tokens/s, and speculation's gain in both."""
    from tabulate import tabulate

    by = {(lv.concurrency, lv.mode): lv for lv in levels}
    body = []
    for n in sorted({lv.concurrency for lv in levels}):
        plain, assisted = by.get((n, "plain")), by.get((n, "assisted"))
        row = [n]
        for lv in (plain, assisted):
            row += (
                [f"{lv.aggregate_tokens_per_s:.2f}", f"{lv.request_tokens_per_s:.2f}"] if lv else ["-", "-"]
            )
        gain = (
            f"{assisted.aggregate_tokens_per_s / plain.aggregate_tokens_per_s:.2f}x"
            if plain and assisted
            else "-"
        )
        body.append([*row, gain])
    headers = [
        "streams",
        "plain tok/s (all)",
        "plain tok/s (each)",
        "assisted tok/s (all)",
        "assisted tok/s (each)",
        "speculation's gain (all)",
    ]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def plot(levels: Sequence[Level], title: str) -> bytes:
    """Aggregate tokens/s against concurrency, plain and assisted (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for mode, colour in (("plain", "#757575"), ("assisted", "#2e7d32")):
        mine = sorted((lv for lv in levels if lv.mode == mode), key=lambda lv: lv.concurrency)
        if mine:
            xs = [lv.concurrency for lv in mine]
            ax.plot(
                xs, [lv.aggregate_tokens_per_s for lv in mine], marker="o", color=colour, label=f"{mode}, all"
            )
            ax.plot(
                xs, [lv.request_tokens_per_s for lv in mine], marker="x", linestyle=":", color=colour,
                label=f"{mode}, each request",
            )  # fmt: skip
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("tokens/s")
    ax.set_xticks(sorted({lv.concurrency for lv in levels}))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)
