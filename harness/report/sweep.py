"""The sweep's table (markdown, llama-bench style header), its warnings and its plot."""

from __future__ import annotations

import hashlib
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from harness.base import files
from harness.experiments.sweep import SweepResult
from harness.report import png_bytes

TABLE_HEADERS = (
    "Config",
    "Plain tok/s",
    "Assisted tok/s",
    "Speedup [95% CI]",
    "vs best plain",
    "Acceptance",
    "alpha",
    "K",
    "c",
    "Predicted (v=1)",
    "Predicted (measured v)",
    "Non-forward share",
    "Identical",
)


def cell(x: float | None, spec: str, suffix: str = "") -> str:
    """A number as a table shows it: "-" where it was not measured (None or NaN)."""
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec) + suffix


def header_lines(result: SweepResult) -> list[str]:
    """Where and on what the sweep ran, llama-bench style: enough to tell whether two tables compare."""
    m = result.machine
    v = result.versions
    labels = result.prompt_labels
    span = labels[0] if len(labels) == 1 else f"{labels[0]} .. {labels[-1]}"
    lines = [
        f"- machine: `{result.platform}` ({m.cpu}{f', {m.cpu_id}' if m.cpu_id else ''}, {m.cores} cores, "
        f"accelerator {m.accelerator}; {m.system})",
        f"- threads: {result.threads}; torch {v.get('torch', '?')}, "
        f"transformers {v.get('transformers', '?')}, python {v.get('python', '?')}",
        f"- workload: {len(labels)} prompts ({span}), {result.new_tokens} new tokens each, greedy, EOS "
        "ignored; plain and every configuration interleaved per prompt in rotating order",
        f"- rows: `{result.rows_path}`",
    ]
    if result.command:
        lines.insert(0, f"- command: `{result.command}`")
    return lines


# On a terminal: numbered configurations (their labels listed below the table), the columns a
# reader compares, within 120 columns; the published markdown keeps every column (``wide``).
_SHORT_HEADERS = ("#", "Plain", "Assisted", "Speedup [95% CI]", "vs best", "alpha", "K", "c", "Pred.", "Same")


def _short_table(result: SweepResult) -> str:
    body = []
    for n, r in enumerate(result.results, 1):
        sp = r.speedup
        ci = f" [{cell(sp.low, '.2f')}-{cell(sp.high, '.2f')}]" if math.isfinite(sp.low) else ""
        body.append(
            [
                n,
                cell(r.plain_tokens_per_s, ".1f"),
                cell(r.assisted_tokens_per_s, ".1f"),
                f"{cell(sp.value, '.2f')}x{ci}",
                cell(r.vs_best_plain, ".2f", "x"),
                cell(r.alpha, ".2f"),
                r.config.tree or r.config.num_assistant_tokens,  # a tree has no K: its shape
                cell(r.c, ".2f"),
                cell(r.predicted_speedup_verify, ".2f", "x"),
                "yes" if r.identical else "NO",
            ]
        )
    table = tabulate(body, headers=_SHORT_HEADERS, tablefmt="github", disable_numparse=True)
    labels = [f"{n}: {r.config.label}" for n, r in enumerate(result.results, 1)]
    return "\n".join([table, "", *labels])


def sweep_table(result: SweepResult, wide: bool = True) -> str:
    """The header block and one GitHub-markdown line per configuration (tabulate), with a legend;
    ``wide=False``: the terminal's form (numbered configurations, fewer columns, 120 wide)."""
    if not wide:
        title = (
            f"Configuration sweep - {result.pair} ({result.platform}, {len(result.prompt_labels)} prompts "
            f"x {result.new_tokens} tokens; plain tok/s, speedup over it, Leviathan's prediction)"
        )
        # The command stays one line, however long: it is there to be copied.
        command = [f"command: {result.command}"] if result.command else []
        notes = [textwrap.fill(w, 120) for w in warnings(result)]
        return "\n".join([textwrap.fill(title, 120), *command, "", _short_table(result), *notes])
    body = []
    for r in result.results:
        sp = r.speedup
        ci = f" [{cell(sp.low, '.2f')}-{cell(sp.high, '.2f')}]" if math.isfinite(sp.low) else ""
        body.append(
            [
                r.config.label,
                cell(r.plain_tokens_per_s, ".2f"),
                cell(r.assisted_tokens_per_s, ".2f"),
                f"{cell(sp.value, '.2f')}x{ci}",
                cell(r.vs_best_plain, ".2f", "x"),
                cell(r.acceptance_rate, ".2f"),
                cell(r.alpha, ".2f"),
                r.config.tree or r.config.num_assistant_tokens,  # a tree has no K: its shape
                cell(r.c, ".3f"),
                cell(r.predicted_speedup, ".2f", "x"),
                cell(r.predicted_speedup_verify, ".2f", "x"),
                cell(r.non_forward_share, ".1%"),
                "yes" if r.identical else "NO",
            ]
        )
    table = tabulate(body, headers=TABLE_HEADERS, tablefmt="github", disable_numparse=True)
    best = (
        f"the fastest plain decoder here is {result.best_plain[0]} at {result.best_plain[1]:.2f} tok/s"
        if result.best_plain
        else "no plain run"
    )
    legend = [
        "Speedup: mean assisted tok/s over mean plain tok/s of the same target, paired per prompt "
        "(95% bootstrap CI). vs best plain: assisted tok/s over " + best + ", so a value above 1 means "
        "assistance beats every plain configuration measured. Acceptance: accepted / drafted. alpha: "
        "per-token acceptance (accepted / tried). c: draft forward / target one-token forward (0 for "
        "prompt lookup, whose proposal cost is in the non-forward share). Predicted: Leviathan et al. "
        "(1 - alpha^(K+1)) / ((1 - alpha)(K c + v)) with v = 1, and with v the measured verify / "
        "one-token forward cost (for dynamic and heuristic schedules K is the starting K; a tree, and "
        "proposals from the context, which are no chain of K draft tokens, have none). Non-forward "
        "share: assisted wall time outside both models' forwards. Identical: every assisted output "
        "equals plain greedy.",
    ]
    title = f"# Configuration sweep - {result.pair}"
    return "\n".join([title, "", *header_lines(result), "", table, "", *legend, *warnings(result)])


# A measured speedup further than this factor from the cost model's prediction (with measured v)
# says something outside the model moved: a busy machine, a slow loop, or a bug.
PREDICTION_GAP = 1.5


def warnings(result: SweepResult) -> list[str]:
    """Lines flagging numbers that cannot be read as they look."""
    out = []
    for r in result.results:
        predicted, measured = r.predicted_speedup_verify, r.speedup.value
        if predicted and measured and math.isfinite(measured):
            gap = measured / predicted
            if not 1 / PREDICTION_GAP <= gap <= PREDICTION_GAP:
                out.append(
                    f"WARNING: {r.config.label} measured {measured:.2f}x against {predicted:.2f}x predicted "
                    f"from its own acceptance and forward costs (more than {PREDICTION_GAP:g}x apart): rerun "
                    "on an idle machine before reading it"
                )
    return ["", *out] if out else []


def plot_sweep(result: SweepResult, path: str | Path) -> Path:
    """Speedup per configuration with its 95% CI, the theory's prediction, and a line at 1.0 (PNG)."""
    # A bare Figure on the Agg canvas, as report.py does: no pyplot global state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    rs = list(result.results)
    xs = list(range(len(rs)))
    values = [r.speedup.value for r in rs]
    lows = [r.speedup.value - r.speedup.low if math.isfinite(r.speedup.low) else 0.0 for r in rs]
    highs = [r.speedup.high - r.speedup.value if math.isfinite(r.speedup.high) else 0.0 for r in rs]
    fig = Figure(figsize=(max(7.0, 1.6 * len(rs) + 3.0), 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = ["tab:green" if v >= 1.0 else "tab:red" for v in values]
    ax.bar(xs, values, color=colors, alpha=0.75, label="measured speedup")
    ax.errorbar(xs, values, yerr=[lows, highs], fmt="none", ecolor="black", capsize=4, label="95% CI")
    predicted = [(x, r.predicted_speedup) for x, r in zip(xs, rs, strict=True) if r.predicted_speedup]
    if predicted:
        ax.scatter(
            *zip(*predicted, strict=True), marker="x", color="tab:blue", zorder=3, label="predicted (v=1)"
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no speedup")
    ax.set_xticks(xs)
    # Labels broken at their dashes into short lines, so none is clipped or runs into another.
    ax.set_xticklabels([textwrap.fill(r.config.label.replace("-", " "), 18) for r in rs], fontsize=8)
    ax.set_ylabel("assisted / plain tokens/s")
    ax.set_title(
        f"{result.pair} on {result.platform}\n{len(result.prompt_labels)} prompts, "
        f"{result.new_tokens} new tokens, {result.threads} thread{'s' if result.threads != 1 else ''}",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="lower right")
    files.atomic_write(path, png_bytes(fig))
    return path


def output_paths(
    results_dir: str | Path, platform: str, pair: str, labels: Sequence[str]
) -> tuple[Path, Path]:
    """``<results_dir>/<platform>/sweep-<pair>-<digest>.md`` and ``.png``: the digest of the sweep's
    configuration labels, so the same sweep run again rewrites its own page and another sweep of
    the pair writes a page of its own beside it."""
    digest = hashlib.sha256("\n".join(labels).encode()).hexdigest()[:8]
    folder = Path(results_dir) / files.file_name(platform)
    stem = f"sweep-{files.file_name(pair)}-{digest}"
    return folder / f"{stem}.md", folder / f"{stem}.png"


def write_sweep(result: SweepResult, results_dir: str | Path, reference: str = "") -> tuple[Path, Path]:
    """Write the markdown table (linking the plot) and the PNG beside it; return both paths.
    ``reference``: a line about a reference decoder (llama.cpp) measured in the same run."""
    labels = [r.config.label for r in result.results]
    md_path, png_path = output_paths(results_dir, result.platform, result.pair, labels)
    plot_sweep(result, png_path)
    text = sweep_table(result) + (f"\n\n{reference}" if reference else "")
    text += f"\n\n![Speedup per configuration](./{png_path.name})\n"
    files.atomic_write(md_path, text.encode("utf-8"))
    return md_path, png_path
