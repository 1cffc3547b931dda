"""Tables and figures people publish: the seeds' markdown tables, plain-vs-assisted comparisons, and
the results/<platform>/<model>.md files regenerated from measured rows.

Tables are ``tabulate(..., tablefmt="github")`` with tabulate's default number format, which is exactly
how the seeds' tables were made, so new tables diff cleanly against the published ones.
"""

from __future__ import annotations

import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.base import files
from harness.settings import setup
from harness.settings.results import ACCEPTANCE_COLUMNS, SEED_COLUMNS, Row

_COMPARE_HEADERS = (
    "Example#",
    "Prompt Length (tokens)",
    "New Tokens Generated",
    "Tokens/Sec (plain)",
    "Tokens/Sec (assisted)",
    "Speedup",
    "End-to-End Speedup",
    "Acceptance",
    "Same Output",
)
# "Rate", as in the seed table: there "Accept" counts accepted tokens and "Rate" is their share.
# "End to end": the request's whole time, prefill included (a long prompt's prefill is most of it on a
# CPU, and an assisted request pays its draft's own read of the prompt there).
_COMPARE_SHORT = (
    "#",
    "Prompt",
    "New",
    "tok/s plain",
    "tok/s assisted",
    "Speedup",
    "End to end",
    "Rate",
    "Same",
)


# The seeds' column names are long: on a terminal the tables use these short names and numbers
# rounded to what they mean (``wide=False``); published tables keep the seeds' spelling.
_COMPACT = {
    "example": ("#", "d"),
    "prompt_tokens": ("Prompt", "d"),
    "new_tokens": ("New", "d"),
    "total_s": ("Total s", ".2f"),
    "prefill_ms": ("Prefill ms", ".1f"),
    "time_per_token_ms": ("ms/tok", ".2f"),
    "tokens_per_s": ("tok/s", ".2f"),
    "drafted": ("Drafted", "d"),
    "accepted": ("Accept", "d"),
    "acceptance_rate": ("Rate", ".2f"),
    "tokens_per_target_forward": ("tok/fwd", ".2f"),
    "target_forwards": ("Fwds", "d"),
    "draft_ms": ("Draft ms", ".1f"),
}


NOT_TIMED = "not timed"  # a rate from a decode too short to time (timing.per_token_ms)


def _cell(value: Any, spec: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return NOT_TIMED
    return "-" if value is None else format(value, spec)


def _compact_grid(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-markdown table of right-aligned cells, one space of padding. Written here because
    tabulate pads every header by at least two spaces (its module-level MIN_PADDING), which alone
    pushes a 13-column table past 120 columns."""
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in body)])


def _not_timed(value: Any) -> Any:
    return NOT_TIMED if isinstance(value, float) and math.isnan(value) else value


def seed_table(rows: list[Row], acceptance: bool = True, wide: bool = True) -> str:
    """The seeds' seven columns in their order, then (if ``acceptance``) drafted/accepted counts;
    ``wide=False``: short names and rounded numbers, to fit a 120-column terminal."""
    columns = SEED_COLUMNS + (ACCEPTANCE_COLUMNS if acceptance else ())
    if not wide:
        body = [[_cell(getattr(row, attr), _COMPACT[attr][1]) for _, attr in columns] for row in rows]
        headers = [_COMPACT[attr][0] for _, attr in columns]
        return _compact_grid(headers, body)
    body = [[_not_timed(getattr(row, attr)) for _, attr in columns] for row in rows]
    # None (acceptance of a plain row) prints as missingval, which keeps the column numeric and aligned.
    return tabulate(body, headers=[name for name, _ in columns], tablefmt="github", missingval="-")


def _finite_positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _sort_key(row: Row) -> tuple[Any, ...]:
    return tuple("" if v is None else str(v) for v in (row.run_id, row.task, row.model)) + (
        row.example,
        row.mode,
        setup.command(row),
    )


def compare_rows(rows: Iterable[Row], defaults: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Pair each assisted (or prompt-lookup) row with the plain row of the same prompt in the same run.

    Rows without a partner are left out: a speedup is only ever computed against a plain decode of the
    same prompt measured in the same run. If a run holds the same plain prompt twice the later row wins.
    """
    rows = list(rows)
    plain: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        if row.mode == "plain":
            plain[setup.pairing_key(row)] = row
    pairs = []
    for row in sorted((r for r in rows if r.mode != "plain"), key=_sort_key):
        base = plain.get(setup.pairing_key(row))
        if base is None:
            continue
        speedup = row.tokens_per_s / base.tokens_per_s if _finite_positive(base.tokens_per_s) else None
        pairs.append(
            {
                "run_id": row.run_id,
                "task": row.task,
                "model": row.model,
                "example": row.example,
                "prompt_label": row.prompt_label,
                "prompt_tokens": row.prompt_tokens,
                "max_new_tokens": row.max_new_tokens,
                "mode": row.mode,
                "command": setup.command(row, defaults),
                "plain_new_tokens": base.new_tokens,
                "assisted_new_tokens": row.new_tokens,
                "plain_tokens_per_s": base.tokens_per_s,
                "assisted_tokens_per_s": row.tokens_per_s,
                "plain_time_per_token_ms": base.time_per_token_ms,
                "assisted_time_per_token_ms": row.time_per_token_ms,
                "speedup": speedup if speedup is None or math.isfinite(speedup) else None,
                "plain_total_s": base.total_s,
                "assisted_total_s": row.total_s,
                "end_to_end": base.total_s / row.total_s if _finite_positive(row.total_s) else None,
                "acceptance_rate": row.acceptance_rate,
                "identical": list(base.output_ids) == list(row.output_ids),
            }
        )
    return pairs


def overall_speedup(pairs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(mean plain time/token over mean assisted time/token, geometric mean of per-prompt speedups)."""
    plain_tpt = [
        p["plain_time_per_token_ms"] for p in pairs if _finite_positive(p["plain_time_per_token_ms"])
    ]
    assisted_tpt = [
        p["assisted_time_per_token_ms"] for p in pairs if _finite_positive(p["assisted_time_per_token_ms"])
    ]
    of_means = None
    if plain_tpt and assisted_tpt and len(plain_tpt) == len(assisted_tpt) == len(pairs):
        of_means = statistics.fmean(plain_tpt) / statistics.fmean(assisted_tpt)
    speedups = [p["speedup"] for p in pairs if _finite_positive(p["speedup"])]
    geo = statistics.geometric_mean(speedups) if speedups and len(speedups) == len(pairs) else None
    return of_means, geo


# Below this many new tokens a row's time/token rests on too few decode steps to read as a rate.
MIN_TIMED_TOKENS = 8
# Per-prompt speedups further apart than this (max / min) average different regimes.
MAX_SPREAD = 2.0


# Rounds of one prompt, budget and mode in one run repeat the same work: tokens/s further apart than
# this (fastest / slowest) says the host was disturbed (another job, a throttled VM), not the build.
MAX_ROUND_SPREAD = 2.0


def disturbed(rows: Iterable[Row]) -> str | None:
    """Why a run's rows cannot stand as a result, or None: the same prompt decoded in the same mode
    several times, at speeds more than ``MAX_ROUND_SPREAD`` apart."""
    speeds: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in rows:
        if math.isfinite(row.tokens_per_s) and row.tokens_per_s > 0:
            speeds[(row.run_id, row.mode, row.prompt_sha, row.prompt_tokens, row.max_new_tokens)].append(row)
    worst = None
    for group in speeds.values():
        if len(group) < 2:
            continue
        tps = [r.tokens_per_s for r in group]
        spread = max(tps) / min(tps)
        if spread > MAX_ROUND_SPREAD and (worst is None or spread > worst[0]):
            worst = (spread, group)
    if worst is None:
        return None
    spread, group = worst
    times = [r.total_s for r in group]
    return (
        f"the host was disturbed: {len(group)} {group[0].mode} rounds of one {group[0].prompt_tokens}-token "
        f"prompt ran at {min(r.tokens_per_s for r in group):.2f}-{max(r.tokens_per_s for r in group):.2f} "
        f"tokens/s ({spread:.1f}x apart, {min(times):.1f}-{max(times):.1f} s each; more than "
        f"{MAX_ROUND_SPREAD:g}x apart for the same work)"
    )


def cautions(rows: Iterable[Row], pairs: list[dict[str, Any]]) -> list[str]:
    """Why the numbers of a run may not read as they look: a disturbed host, too few tokens to time,
    per-prompt speedups far apart, and the two overall speedups disagreeing."""
    rows = list(rows)
    out = []
    why = disturbed(rows)
    if why is not None:
        out.append(f"{why}: not a result; rerun on an idle machine")
    short = [r for r in rows if r.new_tokens < MIN_TIMED_TOKENS]
    if short:
        out.append(
            f"{len(short)} row(s) decoded fewer than {MIN_TIMED_TOKENS} new tokens: their tokens/s rest on "
            "too few steps to read as a rate (raise --max_new_tokens)"
        )
    speedups = [p["speedup"] for p in pairs if _finite_positive(p["speedup"])]
    if len(speedups) >= 2 and max(speedups) / min(speedups) > MAX_SPREAD:
        out.append(
            f"per-prompt speedups range {min(speedups):.2f}x-{max(speedups):.2f}x (more than {MAX_SPREAD:g}x "
            "apart): the overall figures average different regimes; read the per-prompt table"
        )
    of_means, geo = overall_speedup(pairs)
    if of_means and geo and max(of_means, geo) / min(of_means, geo) > 1.25:
        out.append(
            f"the speedup of mean time/token ({of_means:.2f}x) and the geometric mean ({geo:.2f}x) differ by "
            "more than 25%: a few prompts dominate the mean"
        )
    return out


def _warned(line: str, notes: list[str]) -> str:
    return line + "".join(f"\nWARNING: {n}" for n in notes)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _overall_line(pairs: list[dict[str, Any]]) -> str:
    of_means, geo = overall_speedup(pairs)
    plain = _mean([p["plain_time_per_token_ms"] for p in pairs])
    assisted = _mean([p["assisted_time_per_token_ms"] for p in pairs])
    totals = [(p["plain_total_s"], p["assisted_total_s"]) for p in pairs]
    whole = None
    if all(_finite_positive(t) for pair in totals for t in pair):
        whole = sum(t for t, _ in totals) / sum(t for _, t in totals)
    return (
        f"Overall ({len(pairs)} prompt{'s' * (len(pairs) != 1)}): speedup of mean time/token "
        f"{_fmt(of_means, '.2f', 'x')} "
        f"({_fmt(plain, '.1f')} ms plain -> {_fmt(assisted, '.1f')} ms assisted); "
        f"geometric mean of per-prompt speedups {_fmt(geo, '.2f', 'x')}; "
        f"end to end, prefill included, {_fmt(whole, '.2f', 'x')}"
    )


# Printed under a compare whose outputs differ, where the user reads the "no".
SAME_NO = (
    "Same = no: the assisted output left plain greedy decoding's at some token. Batched verification "
    "sums in another order than one-token steps unless the target runs on the batch-invariant kernels "
    "(--target_kernels invariant, the registered default), so at a near tie (two top logits closer "
    "than that rounding) a token can flip and the rest follows; on those kernels any difference is a "
    "bug. `pytest perf/test_decode.py` judges each flip by its logit gap (README, the exactness tiers)."
)


def compare_table(
    rows: Iterable[Row],
    defaults: Mapping[str, Any] | None = None,
    wide: bool = True,
    shown: str | None = None,
) -> str:
    """Per prompt: plain vs assisted tokens/sec, speedup, acceptance, identical output; per setting
    (``wide=False``: short names and rounded numbers). ``shown``: the command printed above the
    table instead of the rows' own (the invocation that made them, with its prompts and budget)."""
    rows_list = list(rows)
    pairs = compare_rows(rows_list, defaults)
    if not pairs:
        return "No plain and assisted rows of the same prompt in the same run: no speedup to report."
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for pair in pairs:
        groups[(pair["run_id"], pair["command"])].append(pair)
    sections = []
    for (_, command), group in sorted(groups.items()):
        body = [
            [
                p["example"],
                p["prompt_tokens"],
                p["assisted_new_tokens"],
                p["plain_tokens_per_s"],
                p["assisted_tokens_per_s"],
                None if p["speedup"] is None else f"{p['speedup']:.2f}x",
                None if p["end_to_end"] is None else f"{p['end_to_end']:.2f}x",
                p["acceptance_rate"],
                "yes" if p["identical"] else "no",
            ]
            for p in group
        ]
        if wide:
            table = tabulate(body, headers=_COMPARE_HEADERS, tablefmt="github", missingval="-")
        else:
            specs = ("d", "d", "d", ".2f", ".2f", "s", "s", ".2f", "s")
            short = [[_cell(v, f) for v, f in zip(line, specs, strict=True)] for line in body]
            table = _compact_grid(_COMPARE_SHORT, short)
        rows_of = [r for r in rows_list if r.run_id == group[0]["run_id"]]
        overall = _warned(_overall_line(group), cautions(rows_of, group))
        if not all(p["identical"] for p in group):
            overall += "\n" + SAME_NO
        sections.append(f"```{shown or command}```\n\n{table}\n\n{overall}")
    return "\n\n".join(sections)


def pooled_rate(rows: Iterable[Row]) -> float | None:
    """Tokens per second over rows taken together: their tokens after the first over the time those
    took (a mean of per-row rates would weigh a short prompt's rate like a long one's)."""
    tokens = time_ms = 0.0
    for row in rows:
        if _finite_positive(row.time_per_token_ms) and row.new_tokens > 1:
            tokens += row.new_tokens - 1
            time_ms += (row.new_tokens - 1) * row.time_per_token_ms
    return 1000.0 * tokens / time_ms if time_ms > 0 else None


def summary_line(
    rows: Iterable[Row],
    defaults: Mapping[str, Any] | None = None,
    baseline: Iterable[Row] = (),
    speedup: bool = True,
) -> str:
    """One line: tokens/sec per mode (pooled: ``pooled_rate``), mean acceptance, and a speedup only if it
    was measured.

    ``baseline`` offers extra plain rows to pair with (e.g. the plain section of the same results
    file); they are used only for pairing, not in the means. ``speedup=False``: the rates alone (a
    compare table above already states the speedup and its cautions).
    """
    rows = list(rows)
    if not rows:
        return "No rows."
    parts = []
    for mode in sorted({r.mode for r in rows}, key=lambda m: (m != "plain", m)):
        timed = [r for r in rows if r.mode == mode and _finite_positive(r.time_per_token_ms)]
        noun = "row" if len(timed) == 1 else "rows"
        parts.append(f"{mode}: {len(timed)} {noun}, {_fmt(pooled_rate(timed), '.2f')} tokens/s")
    line = "; ".join(parts)
    rates = [r.acceptance_rate for r in rows if r.acceptance_rate is not None]
    if rates:
        line += f"; mean acceptance {statistics.fmean(rates):.2f}"
    if not speedup:
        return line
    pairs = compare_rows(rows + [r for r in baseline if r.mode == "plain" and r not in rows], defaults)
    if all(r.mode == "plain" for r in rows):
        return _warned(line, cautions(rows, []))  # nothing assisted: no speedup to claim or disclaim
    if pairs:
        of_means, geo = overall_speedup(pairs)
        line += (
            f"; speedup over plain {_fmt(of_means, '.2f', 'x')} by mean time/token "
            f"(geometric mean {_fmt(geo, '.2f', 'x')}, {len(pairs)} prompt{'s' * (len(pairs) != 1)} paired "
            "within the same run)"
        )
    else:
        line += "; no speedup claimed (no plain rows of the same prompts from the same run)"
    return _warned(line, cautions(rows, pairs))


def _latest_per_prompt(rows: list[Row]) -> list[Row]:
    # A run that was resumed may hold a prompt twice; its newest measurement stands.
    latest: dict[tuple[Any, ...], Row] = {}
    for row in sorted(rows, key=lambda r: (r.timestamp, r.run_id)):
        latest[(row.example, row.prompt_tokens, row.max_new_tokens)] = row
    return sorted(latest.values(), key=lambda r: (r.example, r.prompt_tokens, r.max_new_tokens))


def chosen_run(rows: list[Row]) -> list[Row]:
    """One run's rows for a published section: the run covering the most prompts, the newest of
    those (then the greatest run id). A results file accumulates reruns; mixing their rows would
    put numbers of different runs (and machine states) side by side, and which rows win would
    depend on what was appended last. Rows without a run id count as one run."""
    runs: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        runs[row.run_id or ""].append(row)

    def rank(run_id: str) -> tuple[int, str, str]:
        kept = _latest_per_prompt(runs[run_id])
        return len(kept), max(r.timestamp or "" for r in kept), run_id

    return _latest_per_prompt(runs[max(runs, key=rank)])


def _series_label(row: Row) -> str:
    # The target leads every label: two assisted series with the same draft on different targets
    # must not read alike.
    target = f"{row.target_precision} target"
    if row.mode == "plain":
        label = f"plain: {target}"
    elif row.mode == "prompt_lookup":
        label = f"prompt lookup: {target}, N={row.prompt_lookup_num_tokens}"
    else:
        label = (
            f"assisted: {target}, {row.draft_precision} draft, K={row.num_assistant_tokens} "
            f"{row.assistant_schedule}"
        )
    return label + (f", T={row.temperature}" if row.do_sample else "")


def _speedup_png(title: str, sections: list[tuple[str, list[Row]]]) -> bytes:
    """Grouped bars of tokens/sec per prompt, one bar per command line, one panel per task.

    Assisted bars carry their speedup over the plain bar of the same prompt and run, when there is one.
    """
    # A bare Figure on the Agg canvas: no pyplot, so no global backend switch or figure registry.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_task: dict[str, list[tuple[str, list[Row]]]] = defaultdict(list)
    for command, rows in sections:
        by_task[rows[0].task].append((command, rows))
    plain = {setup.pairing_key(r): r for _, rows in sections for r in rows if r.mode == "plain"}
    tasks = sorted(by_task)
    fig = Figure(figsize=(11, 4.2 * len(tasks)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(tasks), 1, squeeze=False)
    for ax, task in zip(axes[:, 0], tasks, strict=True):
        series = by_task[task]
        prompts = sorted({(r.example, r.prompt_tokens, r.max_new_tokens) for _, rows in series for r in rows})
        index = {p: i for i, p in enumerate(prompts)}
        width = 0.8 / len(series)
        for k, (_, rows) in enumerate(series):
            offset = (k - (len(series) - 1) / 2) * width
            xs = [index[(r.example, r.prompt_tokens, r.max_new_tokens)] + offset for r in rows]
            ys = [r.tokens_per_s if math.isfinite(r.tokens_per_s) else 0.0 for r in rows]
            ax.bar(xs, ys, width=width, label=_series_label(rows[0]))
            for x, y, row in zip(xs, ys, rows, strict=True):
                base = plain.get(setup.pairing_key(row)) if row.mode != "plain" else None
                if base is not None and _finite_positive(base.tokens_per_s) and y > 0:
                    # Upright when the bars are narrow, so neighbouring labels do not overlap.
                    ax.annotate(
                        f"{y / base.tokens_per_s:.2f}x",
                        (x, y),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        rotation=90 if len(series) >= 4 else 0,
                    )
        ax.set_xticks(range(len(prompts)))
        ax.set_xticklabels([f"#{e}\n{p} tok\n+{n}" for e, p, n in prompts], fontsize=8)
        # At least four slots wide, so one or two prompts do not stretch into one huge bar.
        ax.set_xlim(-0.6, max(len(prompts), 4) - 0.4)
        ax.margins(y=0.12)
        ax.set_xlabel("Example#, prompt length (tokens), new-token budget")
        ax.set_ylabel("Tokens/Sec")
        ax.set_title(f"{title}: task {task}")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return png_bytes(fig)


def png_bytes(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes, with no Software metadata (PNG has no date by default), so
    an unchanged figure is byte-identical."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _markdown(
    platform: str,
    model: str,
    sections: list[tuple[str, list[Row]]],
    png: str,
    defaults: Mapping[str, Any] | None,
) -> str:
    lines = [f"# Assisted generation - {model}", "", f"# {platform}", ""]
    shown = [r for _, section_rows in sections for r in section_rows]
    versions = sorted({tuple(sorted(r.versions.items())) for r in shown if r.versions})
    for v in versions:
        lines.append("Versions: " + ", ".join(f"{k} {val}" for k, val in v))
        lines.append("")
    lines += [f"## ![Speed up summary]({png})", ""]
    for command, section_rows in sections:
        first = section_rows[0]
        run_ids = ", ".join(sorted({r.run_id for r in section_rows if r.run_id}))
        lines += [f"```{command}```", ""]
        lines.append(
            f"Target {first.target_model} ({first.target_precision}, {first.target_device})"
            + (
                f"; draft {first.draft_model} ({first.draft_precision}, {first.draft_device})"
                if first.draft_model
                else ""
            )
            + (f"; run {run_ids}" if run_ids else "")
        )
        plain = [r for r in shown if r.mode == "plain"]
        lines += ["", seed_table(section_rows), "", summary_line(section_rows, defaults, plain), ""]
    lines += [
        "## Plain vs assisted",
        "",
        compare_table(shown, defaults),
        "",
    ]
    return "\n".join(lines)


def regen_results(
    rows: Iterable[Row], out_dir: Path, defaults: Mapping[str, Any] | None = None
) -> list[Path]:
    """Write ``out_dir/<platform>/<model>.md`` and ``<model>-speedup.png`` for every platform/model.

    Each distinct command line gets a section with one run's rows (``chosen_run``); output is sorted
    so regenerating from the same rows gives the same bytes, in any order. Returns the written paths.
    """
    out_dir = Path(out_dir)
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row.platform or "unknown-platform", row.model)].append(row)
    written = []
    for (platform, model), group in sorted(groups.items()):
        by_command: dict[str, list[Row]] = defaultdict(list)
        for row in group:
            by_command[setup.command(row, defaults)].append(row)
        sections = [(command, chosen_run(by_command[command])) for command in sorted(by_command)]
        folder = out_dir / files.file_name(platform)
        png_path = folder / f"{files.file_name(model)}-speedup.png"
        md_path = folder / f"{files.file_name(model)}.md"
        files.atomic_write(png_path, _speedup_png(f"{model} on {platform}", sections))
        md = _markdown(platform, model, sections, f"./{png_path.name}", defaults)
        files.atomic_write(md_path, md.encode("utf-8"))
        written += [md_path, png_path]
    return written


def pairs_table(pairs: Sequence[Any], weights_dir: str | None, wide: bool = False) -> str:
    """``--list-models``: every registered pair, its precisions and whether its weights are here;
    ``wide`` adds the models' ids and where the weights were found (long paths)."""
    from harness.pairs import models

    table = []
    for pair in pairs:
        t = models.locate_model(pair.target, weights_dir)
        d = models.locate_model(pair.draft, weights_dir)
        table.append(
            [
                pair.name,
                pair.family,
                pair.target.hf_id or pair.target.name,
                pair.draft.hf_id or pair.draft.name,
                f"{pair.target_setup.precision}/{pair.draft_setup.precision}",
                "yes" if t.present and d.present else "no",
                t.detail if t.detail == d.detail else f"target: {t.detail}; draft: {d.detail}",
            ]
        )
    headers = ["model_name", "family", "target", "draft", "precision t/d", "present", "weights"]
    if not wide:
        keep = (0, 1, 4, 5)
        headers = [headers[i] for i in keep]
        table = [[row[i] for i in keep] for row in table]
    return tabulate(table, headers=headers, tablefmt="github")
