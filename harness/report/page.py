"""The results page: every committed result as a table, written from the committed rows alone.

``--regen-tables`` writes it (``results/README.md``): per platform, the benchmark cases, the
sweeps, the divergence tiers, the forward costs and the HumanEval runs, each table headed by the
machine it ran on, the versions its rows record and the command that reproduces it. Nothing on it
is typed by hand, so regenerating from the same rows gives the same bytes; what the numbers mean is
discussed in ``docs/FINDINGS.md``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.base import backends, categories, files, tasks
from harness.decoding import engines
from harness.experiments import bench, concurrency, forwards, sweep
from harness.report import chosen_run, compare_rows, disturbed, overall_speedup, png_bytes
from harness.report import concurrency as concurrency_report
from harness.report.sweep import cell
from harness.settings import acceptance, baselines, configs, results, setup
from harness.settings.results import Row

PAGE_NAME = "README.md"
REGEN = "python assisted_generation.py --regen-tables"


def _shown_versions() -> tuple[str, ...]:
    """The versions a table names: the libraries of the harness's own loop, each engine's build, Python."""
    built = (key for name in engines.names() for key in engines.engine_class(name).version_names)
    return ("torch", "transformers", "onnxruntime", *built, "python")


def _versions(rows: Iterable[Row]) -> str:
    return _record_versions({"versions": row.versions} for row in rows)


def _record_versions(records: Iterable[Mapping[str, Any]]) -> str:
    """The versions records carry (``versions``), one value per package (several: all, sorted);
    older divergence and HumanEval rows carry none."""
    seen: dict[str, set[str]] = defaultdict(set)
    shown = _shown_versions()
    for record in records:
        for name, value in (record.get("versions") or {}).items():
            if name in shown:
                seen[name].add(str(value))
    if not seen:
        return "not recorded in these rows"
    return ", ".join(f"{name} {'/'.join(sorted(seen[name]))}" for name in shown if name in seen)


def _header(platform: str, command: str, versions: str, rows: str) -> list[str]:
    return [
        f"- machine: `{platform}`",
        f"- versions: {versions}",
        f"- command: `{command}`",
        f"- rows: `{rows}`",
    ]


def _made_by(command: str, row: Row, rounds: int) -> str | None:
    """What reruns a benchmark row: the CLI command for a row the CLI wrote; for one of the benchmark
    suite's rows (``extra["bench"]``), the pytest command that measures its case today, or None when
    no current case measures that configuration."""
    bench_extra = row.extra.get("bench")
    if not isinstance(bench_extra, dict):
        return command
    provider = row.execution_provider or backends.DEFAULT_PROVIDER
    return bench.real_case_command(row.model, str(bench_extra.get("case_id", "")), rounds, provider)


# --------------------------------------------------------------------------- benchmark cases


def benchmark_section(platform: str, rows: Sequence[Row], source: str) -> list[str]:
    """One line per benchmark command (the run covering the most rounds): plain and assisted
    tokens/s, speedup, acceptance and whether every output equalled plain."""
    by_command: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.mode != "plain":
            by_command[setup.command(row)].append(row)
    lines = []
    for command in sorted(by_command):
        # One measurement per command: the run covering the most prompts (the newest of those),
        # both its modes.
        run_id = chosen_run(by_command[command])[0].run_id
        run = [r for r in rows if r.run_id == run_id]
        pairs = [p for p in compare_rows(run) if p["command"] == command]
        if not pairs:
            continue
        first = next(r for r in run if r.mode != "plain")
        if first.mode != "assisted":
            proposals = first.mode.replace("_", " ")
        elif first.engine not in (None, "transformers"):
            proposals = f"{first.engine}'s own draft"
        else:
            proposals = f"{first.draft_precision} draft"
        lines += [f"#### {first.model}, {first.task}: {first.target_precision} target, {proposals}", ""]
        made_by = _made_by(command, first, len(pairs))
        header = _header(platform, made_by or "", _versions(run), source)
        if made_by is None:
            case_id = first.extra["bench"].get("case_id")
            header[2] = (
                f"- command: none today (the benchmark suite measured case {case_id} then; no "
                "current case is that one: the pair's registered configuration or the case's "
                "budget has changed since)"
            )
        lines += [*header, ""]
        why = disturbed(run)
        if why is not None:
            # Published numbers are results; a run whose own rounds disagree this much is not one.
            lines += [f"Not shown as a result: {why}. Rerun it on an idle machine.", ""]
            continue
        of_means, _ = overall_speedup(pairs)
        acceptance = [p["acceptance_rate"] for p in pairs if p["acceptance_rate"] is not None]
        table = tabulate(
            [
                [
                    len(pairs),
                    statistics.fmean(p["plain_tokens_per_s"] for p in pairs),
                    statistics.fmean(p["assisted_tokens_per_s"] for p in pairs),
                    cell(of_means, ".2f", "x"),
                    cell(statistics.fmean(acceptance) if acceptance else None, ".2f"),
                    f"{sum(p['identical'] for p in pairs)}/{len(pairs)}",
                ]
            ],
            headers=["rounds", "plain tok/s", "assisted tok/s", "speedup", "acceptance", "identical"],
            tablefmt="github",
            floatfmt=".2f",
        )
        lines += [table, ""]
    return lines


# --------------------------------------------------------------------------- sweeps


def _config_of(row: Row) -> configs.SweepConfig:
    """The configuration a sweep row ran, from its own columns."""
    target = setup.Target(
        row.target_precision,
        row.target_kernels or "stock",
        row.target_backend or "torch",
        row.execution_provider,
        engine=row.engine or "transformers",
    )
    draft = None
    if row.mode == "assisted":  # an engine's own draft is named by its target (``draft_precision``)
        draft = setup.Draft(row.draft_precision, row.draft_kernels or "stock", row.draft_vocab)
    k = row.prompt_lookup_num_tokens if row.mode == "prompt_lookup" else row.num_assistant_tokens
    return configs.SweepConfig(
        target,
        draft,
        row.mode,
        int(k or 0),
        row.assistant_schedule or "constant",
        row.draft_tree or "",
        int(getattr(row, "context_draft", None) or 0),
        getattr(row, "synthetic_acceptance", None),
    )


def _arm(row: Row) -> str:
    return str(((row.extra or {}).get("sweep") or {}).get("config", ""))


def _sweep_spec(config: configs.SweepConfig) -> str:
    items = [f"t={config.target_precision}"]
    own = config.target.engine != "transformers"
    if config.target_kernels != "stock":
        items.append(f"{'engine' if own else 'kernels'}={config.target_kernels}")
    if config.mode == "prompt_lookup":
        items.append("mode=prompt_lookup")
    elif not own:
        items.append(f"d={config.draft_precision}")
        if config.draft_kernels != "stock":
            items.append(f"dk={config.draft_kernels}")
        if config.draft_vocab is not None:
            items.append(f"dv={config.draft_vocab}")
    if config.context:
        items.append(f"ctx={config.context}")
    if config.synthetic is not None:
        items.append(f"synth={config.synthetic:g}")
    if config.tree:
        items.append(f"tree={config.tree}")
        return ",".join(items)
    items.append(f"k={config.num_assistant_tokens}")
    if config.mode == "assisted" and config.schedule != "constant":
        items.append(f"sched={config.schedule}")
    return ",".join(items)


@dataclass(frozen=True)
class SweepSummary:
    """A sweep file's configurations against their targets' plain runs, as its table shows them."""

    results: list[sweep.ConfigResult]
    plain_rate: dict[str, float]  # plain arm -> mean tok/s
    chosen: dict[str, list[Row]]  # arm -> the run's rows the table reads
    reference: Mapping[str, Any] | None  # llama.cpp's plain decoding measured around these rows
    newest: str  # the newest row's timestamp
    engines: dict[str, str]  # configuration label -> what ran its decoding loop

    def engine_of(self, result: sweep.ConfigResult) -> str:
        return self.engines.get(result.config.label, "transformers")

    @property
    def model(self) -> str:
        """The pair the sweep ran (every row of a sweep file is one pair's)."""
        return next(iter(self.chosen.values()))[0].model


def _engine(row: Row) -> str:
    if row.engine not in (None, "transformers"):
        return str(row.engine)
    return "transformers (ONNX Runtime target)" if row.target_backend == "onnxruntime" else "transformers"


def _sweep_summary(rows: Sequence[Row], references: Sequence[Mapping[str, Any]] = ()) -> SweepSummary | None:
    by_arm: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_arm[_arm(row)].append(row)
    plain_arms = {arm for arm, group in by_arm.items() if group[0].mode == "plain"}
    chosen: dict[str, list[Row]] = {arm: chosen_run(group) for arm, group in by_arm.items()}
    plain_of_run = {r.run_id: arm for arm in plain_arms for r in chosen[arm]}
    plain_rate = {arm: statistics.fmean(r.tokens_per_s for r in chosen[arm]) for arm in plain_arms}
    best = max(plain_rate.values(), default=None)
    results_, engines = [], {}
    for arm in sorted(set(by_arm) - plain_arms):
        assisted = chosen[arm]
        plain_arm = plain_of_run.get(assisted[0].run_id)
        if plain_arm is None:
            continue  # its target's plain runs belong to a run this file does not hold
        config = _config_of(assisted[0])
        plain = {r.example: r for r in chosen[plain_arm] if r.run_id == assisted[0].run_id}
        results_.append(sweep.summarize(config, plain, {r.example: r for r in assisted}, best))
        engines[config.label] = _engine(assisted[0])
    if not results_:
        return None
    read = [r for group in chosen.values() for r in group]
    ref = sweep.covering_reference(references, read)
    return SweepSummary(results_, plain_rate, chosen, ref, max(r.timestamp or "" for r in read), engines)


def sweep_section(platform: str, rows: Sequence[Row], source: str, summary: SweepSummary) -> list[str]:
    """One table per sweep file (``summary`` of its ``rows``): every configuration against its
    target's plain runs of the same run (the run with the most prompts for each configuration), as
    the sweep printed it; below it, llama.cpp's plain decoding when a reference was measured around
    those rows."""
    results_, plain_rate, ref = summary.results, summary.plain_rate, summary.reference
    configs_ = [r.config for r in results_]
    best = max(plain_rate.values(), default=None)
    first = rows[0]
    tokens = sorted({r.new_tokens for r in rows})
    command = (
        f"python assisted_generation.py --model_name {first.model} --task sweep --limit "
        f"{max(r.prompts for r in results_)} --max_new_tokens {max(tokens)}{_sets_flag(rows)} --sweep "
        f'"{";".join(_sweep_spec(c) for c in configs_)}"'
    )
    body = [
        [
            r.config.label,
            r.prompts,
            r.plain_tokens_per_s,
            r.assisted_tokens_per_s,
            f"{r.speedup.value:.2f}x [{r.speedup.low:.2f}-{r.speedup.high:.2f}]",
            cell(r.vs_best_plain, ".2f", "x"),
            cell(r.alpha, ".2f"),
            cell(r.c, ".2f"),
            "yes" if r.identical else "no",
        ]
        for r in results_
    ]
    plain_lines = [f"{arm}: {rate:.2f} tok/s" for arm, rate in sorted(plain_rate.items())]
    table = tabulate(
        body,
        headers=[
            "configuration",
            "prompts",
            "plain tok/s",
            "assisted tok/s",
            "speedup [95% CI]",
            "vs best plain",
            "alpha",
            "c",
            "identical",
        ],  # fmt: skip
        tablefmt="github",
        floatfmt=".2f",
    )
    counts = f"{len(results_)} configuration{'s' * (len(results_) > 1)}"
    counts += f", {len(plain_rate)} target{'s' * (len(plain_rate) > 1)}"
    lines = [f"#### Sweep: {first.model}, {counts}", ""]
    lines += _header(platform, command, _versions(rows), source)
    lines += _cpu_lines(rows)
    lines += ["", table, "", "Plain decoding in the same run: " + "; ".join(plain_lines) + ".", ""]
    lines += category_section(platform, summary)
    if ref is not None:
        exact = [r.assisted_tokens_per_s for r in results_ if r.identical]
        rate = ref["tokens_per_s"]
        lines += [
            f"llama.cpp's plain decoding of the same GGUF ({ref['gguf']}, build {ref['build']}, "
            f"{ref['threads']} threads, {ref['new_tokens']} tokens), measured just before and just after "
            f"this sweep: {ref['before']:.2f} and {ref['after']:.2f} tok/s, mean {rate:.2f}. Fastest plain "
            f"decoding here: {best / rate:.2f}x of it"
            + (f"; fastest exact assisted decoding: {max(exact) / rate:.2f}x." if exact else "."),
            "",
        ]
    return lines


def _prompt_set(label: str) -> str | None:
    """The prompt set a row's prompt came from, by its label's prefix (``tasks.decode_prompts``)."""
    prefix = label.split("-", 1)[0]
    return prefix if prefix in tasks.PROMPT_SETS and "-" in label else None


def _sets_flag(rows: Sequence[Row]) -> str:
    """``--prompts`` as the rows' prompts were chosen, or "" for HumanEval's (the sweep's default)."""
    sets = [_prompt_set(r.prompt_label) for r in rows]
    if not sets or None in sets:
        return ""
    return f" --prompts {','.join(dict.fromkeys(s for s in sets if s))}"


def category_section(platform: str, summary: SweepSummary) -> list[str]:
    """Per task category, each configuration of one sweep against its plain runs: speedup (mean
    plain time per token over mean assisted) and tokens per verification. Empty unless the sweep
    ran the category prompt sets."""
    names = [c.name for c in categories.CATEGORIES]
    rows = [r for group in summary.chosen.values() for r in group]
    if not rows or any(_prompt_set(r.prompt_label) not in names for r in rows):
        return []
    plain_arms = {arm for arm, group in summary.chosen.items() if group[0].mode == "plain"}
    plain_of_run = {r.run_id: arm for arm in plain_arms for r in summary.chosen[arm]}
    found = [c for c in names if any(_prompt_set(r.prompt_label) == c for r in rows)]
    columns: list[tuple[Row, dict[str, str]]] = []  # a configuration's first row, its cells
    shares = False  # whether any cell gives the share of tokens from the context
    for arm in sorted(set(summary.chosen) - plain_arms):
        assisted = summary.chosen[arm]
        plain_arm = plain_of_run.get(assisted[0].run_id)
        if plain_arm is None:
            continue
        plain = {r.example: r for r in summary.chosen[plain_arm] if r.run_id == assisted[0].run_id}
        cells = {}
        for category in found:
            both = [(plain[r.example], r) for r in assisted
                    if r.example in plain and _prompt_set(r.prompt_label) == category]  # fmt: skip
            if not both:
                continue
            speedup = _decode_speedup(both)
            per_verify = [_per_verify(a) for _, a in both]
            share = _context_share([a for _, a in both])
            shares = shares or bool(share)
            cells[category] = f"{speedup:.2f}x / {statistics.fmean(per_verify):.2f}{share}"
        columns.append((assisted[0], cells))
    headers = _column_names([row for row, _ in columns])
    body = [[c, *(cells.get(c, "-") for _, cells in columns)] for c in found]
    table = tabulate(body, headers=["category", *headers], tablefmt="github")
    return [
        f"Per task category (speedup over the same engine's plain decoding / tokens per verification"
        f"{'; in brackets, the share of accepted tokens proposed from the context' if shares else ''}), "
        f"on {platform}:",
        "",
        table,
        "",
    ]


def _configuration(row: Row) -> str:
    """A column's name where one engine runs several configurations: what proposes the tokens."""
    if row.mode == "prompt_lookup":
        return f"{_engine(row)}: prompt lookup"
    if row.context_draft:
        return f"{_engine(row)}: context ({row.context_draft}) + draft"
    if row.draft_tree:
        return f"{_engine(row)}: tree {row.draft_tree}"
    return f"{_engine(row)}: chain"


def _column_names(firsts: Sequence[Row], first: Callable[[Row], str] = _engine) -> list[str]:
    """One table's column names, a configuration each (given by one of its rows): ``first``'s names
    where they tell the configurations apart; else what proposes the tokens (one engine in several
    configurations); else the configurations' labels (alike but for a setting, K say)."""
    for name in (first, _configuration):
        names = [name(row) for row in firsts]
        if len(set(names)) == len(names):
            return names
    return [_config_of(row).label for row in firsts]


def _context_share(rows: Sequence[Row]) -> str:
    """ " (N% from context)" for rows that book where their accepted tokens came from, else ""."""
    booked = [r for r in rows if r.accepted_from_context is not None]
    accepted = sum(r.accepted for r in booked)
    if not booked or not accepted:
        return ""
    return f" ({sum(r.accepted_from_context for r in booked) / accepted:.0%} from context)"


CONTEXT_PNG = "context-length.png"


@dataclass(frozen=True)
class ContextPoint:
    """One engine at one context length: its assisted rows against its plain rows of the same prompts."""

    decode: float  # speedup in decoding (time per token past the prompt's forward)
    end_to_end: float  # speedup in the requests' whole time, prefill included
    lowest: float  # the lowest prompt's end-to-end speedup
    per_verify: float  # tokens per verification
    share: str  # " (N% from context)" or ""


def _context_points(rows: Sequence[Row]) -> dict[str, dict[int, ContextPoint]]:
    """Per configuration (by its column's name), per context length, from each run's plain and
    assisted rows of one prompt. Runs of one configuration fill one column."""
    runs: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        runs[row.run_id].append(row)
    points: dict[str, dict[int, ContextPoint]] = defaultdict(dict)
    firsts: dict[str, Row] = {}  # a configuration's label -> a row of it
    for group in runs.values():
        # Paired as every report pairs a baseline: a run's id names its settings, not its prompts, so
        # runs of the same settings at other lengths share it and number their prompts from 1 again.
        plain = {setup.pairing_key(r): r for r in group if r.mode == "plain"}
        assisted = [r for r in group if r.mode == "assisted" and setup.pairing_key(r) in plain]
        for n in sorted({r.prompt_tokens for r in assisted}):
            both = [(plain[setup.pairing_key(r)], r) for r in assisted if r.prompt_tokens == n]
            label = _config_of(both[0][1]).label
            firsts.setdefault(label, both[0][1])
            points[label][n] = ContextPoint(
                decode=_decode_speedup(both),
                end_to_end=sum(p.total_s for p, _ in both) / sum(a.total_s for _, a in both),
                lowest=min(p.total_s / a.total_s for p, a in both),
                per_verify=statistics.fmean(_per_verify(a) for _, a in both),
                share=_context_share([a for _, a in both]),
            )
    names = _column_names(list(firsts.values()), _context_name)
    return {name: points[label] for name, label in zip(names, firsts, strict=True)}


def _decode_speedup(both: Sequence[tuple[Row, Row]]) -> float:
    """(plain, assisted) rows of the same prompts: plain's mean time per token over assisted's."""
    return statistics.fmean(p.time_per_token_ms for p, _ in both) / statistics.fmean(
        a.time_per_token_ms for _, a in both
    )


def _cpu_lines(rows: Sequence[Row]) -> list[str]:
    """The host kinds the rows ran on; rows written before rows named their CPU cannot say theirs."""
    cpus = sorted({r.cpu for r in rows if r.cpu})
    unnamed = "; some rows name none" if any(not r.cpu for r in rows) else ""
    return [f"- CPU: {', '.join(cpus)}{unnamed}"] if cpus else []


def _per_verify(row: Row) -> float:
    return row.acceptance_length or row.tokens_per_target_forward


def _context_cell(p: ContextPoint) -> str:
    return f"{p.decode:.2f}x / {p.end_to_end:.2f}x (lowest {p.lowest:.2f}x) / {p.per_verify:.2f}{p.share}"


def _context_name(row: Row) -> str:
    """A column of the context table: the engine, and what proposes where that is more than a chain."""
    return _configuration(row) if row.context_draft or row.draft_tree else _engine(row)


def context_section(platform: str, rows: Sequence[Row], source: str) -> list[str]:
    """Speedup and acceptance against context length (``--context-tokens``), per engine: in decoding
    and end to end (a long prompt's prefill is most of a request on a CPU), with the lowest prompt."""
    points = _context_points(rows)
    if not points:
        return []
    lengths = sorted({n for by_length in points.values() for n in by_length})
    body = [[n, *(_context_cell(by[n]) if n in by else "-" for by in points.values())] for n in lengths]
    table = tabulate(body, headers=["context tokens", *points], tablefmt="github")
    first = rows[0]
    commands = []
    for engine in dict.fromkeys(_engine(r) for r in rows):
        mine = [r for r in rows if _engine(r) == engine]
        plain = [r for r in mine if r.mode == "plain"]
        limit = max(Counter((r.run_id, r.prompt_tokens) for r in plain).values(), default=0)
        own = mine[0].engine not in (None, "transformers")
        commands.append(
            f"`python assisted_generation.py --model_name {first.model}"
            + (f" --engine {mine[0].engine}" if own else "")
            + f" --context-tokens {','.join(str(n) for n in sorted({r.prompt_tokens for r in mine}))}"
            f" --compare --limit {limit} --max_new_tokens {max(r.max_new_tokens for r in mine)}"
            f" --json {source}`"
        )
    return [
        f"#### Context length: {first.model}, speedup over plain decoding / tokens per verification",
        "",
        f"- machine: `{platform}`",
        *_cpu_lines(rows),
        f"- versions: {_versions(rows)}",
        f"- commands: {'; '.join(commands)}",
        f"- rows: `{source}`",
        "",
        "Each cell: the speedup in decoding (past the prompt's forward) / end to end, prefill included, over"
        " the prompts of that length, and the lowest single prompt's end to end / tokens per verification"
        " (and the share of accepted tokens proposed from the context, where some were).",
        "",
        table,
        "",
        f"![Speedup and acceptance against context length](./{files.file_name(platform)}/{CONTEXT_PNG})",
        "",
    ]


def context_png(platform: str, rows: Sequence[Row]) -> bytes:
    """Speedup (left) and tokens per verification (right) against context length, one line per engine."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    speed, accept = fig.subplots(1, 2)
    points = _context_points(rows)
    for name, by_length in points.items():
        lengths = sorted(by_length)
        decode = [by_length[n].decode for n in lengths]
        line = speed.plot(lengths, decode, marker="o", label=f"{name}, decoding")
        speed.plot(
            lengths,
            [by_length[n].end_to_end for n in lengths],
            marker="s",
            linestyle="--",
            color=line[0].get_color(),
            label=f"{name}, end to end",
        )
        accept.plot(lengths, [by_length[n].per_verify for n in lengths], marker="o", label=name)
    speed.axhline(1.0, color="black", linewidth=0.8)
    lengths = sorted({n for by_length in points.values() for n in by_length})
    for ax, label in ((speed, "speedup over plain decoding"), (accept, "tokens per verification")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("context tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Against context length, on {platform}", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def concurrency_png_name(source: Path) -> str:
    return f"concurrency-{source.stem}.png"


def concurrency_section(platform: str, rows: Sequence[Row], source: str) -> list[str]:
    """A serving engine under concurrent streams (``--concurrency``): each level's aggregate and
    per-request tokens/s, plain and speculative, and its plot."""
    levels = concurrency.levels_of_rows(rows)
    if not levels:
        return []
    first = rows[0]
    engine = _engine(first)
    streams = ",".join(str(n) for n in sorted({lv.concurrency for lv in levels}))
    prompts = max(lv.requests for lv in levels)
    # A deployment's endpoints are part of the command that measures it again (where it serves),
    # spelled as the run settings' own flags.
    urls = [
        f" {field.flag} {url}"
        for field in setup.FIELDS
        if field.column in ("endpoint", "speculative_endpoint")
        and (url := next((getattr(r, field.column) for r in rows if getattr(r, field.column)), None))
    ]
    command = (
        f"python assisted_generation.py --model_name {first.model} --engine {engine}{''.join(urls)} "
        f"--concurrency {streams} --compare --limit {prompts} --max_new_tokens "
        f"{max(r.new_tokens for r in rows)}{_sets_flag(rows)}"
    )
    lines = [f"#### Concurrent streams: {first.model} on {engine}", ""]
    lines += _header(platform, command, _versions(rows), source)
    lines += ["", concurrency_report.table(levels), ""]
    lines += [f"![Tokens/s against concurrent streams](./{files.file_name(platform)}/"
              f"{concurrency_png_name(Path(source))})", ""]  # fmt: skip
    return lines


# --------------------------------------------------------------------------- divergence and HumanEval


def tier_test(label: str, pair: str) -> str:
    """The pytest node id of the real tier whose rows carry the precision ``label`` (``"P / K"``:
    a precision and kernels of the harness's own, or an engine's target and the engine)."""
    precision, _, rest = label.partition(" / ")
    where = "perf/test_decode.py::"
    if " / tree " in rest:  # the registered pair's token tree (``_tier_check``'s label)
        return f"{where}test_precision_tier_real_tree[{pair}]"
    engine, _, provider = rest.partition(" ")
    if engine == "onnxruntime":
        return f"{where}test_precision_tier_real_onnxruntime[{pair}-onnxruntime-{provider}]"
    if engine in engines.names():
        return f"{where}test_engine_tier[{pair}-{engines.engine_class(engine).test_id()}]"
    if precision == "gguf":
        return f"{where}test_precision_tier_real_gguf[{pair}]"
    return f"{where}test_precision_tier_real[{pair}-{precision}-{engine}]"


def divergence_section(platform: str, tiers: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """All prompts of each precision tier: exact, near ties (with the largest gap), other."""
    body = []
    commands = []
    for source, records in sorted(tiers.items()):
        near = [r for r in records if not r.get("identical") and r.get("near_tie")]
        other = [r for r in records if not r.get("identical") and not r.get("near_tie")]
        gaps = [abs(r["gap"]) for r in near if r.get("gap") is not None]
        first = records[0]
        body.append(
            [
                first.get("precision", Path(source).stem),
                len(records),
                sum(int(r.get("tokens", 0)) for r in records),
                sum(bool(r.get("identical")) for r in records),
                f"{len(near)}" + (f" (max gap {max(gaps):.3f})" if gaps else ""),
                len(other),
            ]
        )
        commands.append(
            f"pytest {tier_test(first.get('precision', ''), first.get('pair', ''))} "
            f"--real-prompts {len(records)} --divergence-out {source}"
        )
    table = tabulate(
        body,
        headers=["precision / kernels", "prompts", "tokens", "exact", "near ties", "other"],
        tablefmt="github",
    )
    lines = ["#### Divergence: assisted against plain, every prompt", ""]
    every = [r for records in tiers.values() for r in records]
    lines += [f"- machine: `{platform}`", f"- versions: {_record_versions(every)}"]
    lines += [f"- command ({Path(s).stem}): `{c}`" for s, c in zip(sorted(tiers), commands, strict=True)]
    return lines + ["", table, ""]


def humaneval_test(stem: str) -> str | None:
    """The pytest node id of the HumanEval test that writes rows file ``stem`` (named by the suite:
    ``humaneval.rows_name``, then the backend or the engine), or None for a pair not registered."""
    from harness.experiments import humaneval

    found = humaneval.split_rows_name(stem)
    if found is None:
        return None
    (pair, rest), where = found, "perf/test_humaneval.py::test_humaneval_pass_at_1_equal_real"
    for name in engines.names():  # ``humaneval.engine_rows_name``: the engine, then any provider
        if rest == f"-{name}" or rest.startswith(f"-{name}-"):
            return f"{where}_engine[{pair}-{engines.engine_class(name).test_id()}]"
    if rest.startswith("-onnxruntime-"):
        return f"{where}[{pair}-onnxruntime-{rest.removeprefix('-onnxruntime-')}]"
    return f"{where}[{pair}]"


def _humaneval_command(stem: str, tasks: int) -> str:
    """The run that writes rows file ``stem``: its one test, its problem count and precisions."""
    from harness.experiments import humaneval

    test = humaneval_test(stem)
    command = (
        f"pytest {test}"
        if test is not None
        else 'pytest perf/test_humaneval.py -k "pass_at_1_equal_real and not genai"'
    )
    command += f" --humaneval-limit {tasks}"
    named = humaneval.named_precisions(stem)
    if named:
        command += f" --humaneval-precision {','.join(named)}"
    return command + " --humaneval-out runs/humaneval"


def humaneval_section(platform: str, records: list[dict[str, Any]], source: str) -> list[str]:
    from harness.experiments import humaneval

    summary = humaneval.summarise(records)
    modes = summary["modes"]
    body = [
        [
            mode,
            s["tasks"],
            s["passed"],
            cell(None if s["pass@1"] is None else 100 * s["pass@1"], ".1f", "%"),
        ]
        for mode, s in modes.items()
    ]
    table = tabulate(body, headers=["mode", "tasks", "passed", "pass@1"], tablefmt="github")
    tasks = max((s["tasks"] for s in modes.values()), default=0)
    command = _humaneval_command(Path(source).stem, tasks)
    lines = [f"#### HumanEval: {Path(source).stem}", ""]
    lines += _header(platform, command, _record_versions(records), source)
    lines += [
        "",
        table,
        "",
        f"Identical completions: {summary['identical_completions']} of {summary['paired_tasks']}; "
        f"pass@1 equal: {'yes' if summary['pass@1_equal'] else 'no'}.",
        "",
    ]
    return lines


def forward_runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A forward-cost rows file's runs, in the file's order: its rows by (command, timestamp)."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        runs[(record.get("command", ""), record.get("timestamp", ""))].append(record)
    return list(runs.values())


def forwards_png_name(source: Path, run: int) -> str:
    """The plot of the ``run``-th run (from 1) in a forward-cost rows file: a run appended later
    leaves the earlier runs' names as they were."""
    return f"forwards-{source.stem}-{run}.png"


def forwards_section(platform: str, records: list[dict[str, Any]], source: str) -> list[str]:
    """One table per ``python -m harness.forwards --json`` run in the file: each forward's median
    ms by M beside the bytes it reads over the run's measured read bandwidth, and its plot."""
    lines: list[str] = []
    for run, mine in enumerate(forward_runs(records), start=1):
        first = mine[0]
        command = first.get("command", "")
        costs = [forwards.ForwardCost.from_record(r) for r in mine]
        own = any(c.bound_gbs for c in costs)
        lines += [f"#### Forward costs: {first.get('pair')} {costs[0].role}", ""]
        lines += _header(platform, command, _record_versions(mine), source)
        if first.get("cpu"):
            lines += [f"- CPU: {first['cpu']}"]
        lengths = ", ".join(str(n) for n in dict.fromkeys(r.get("cache_tokens") for r in mine))
        lines += [
            f"- one forward of M tokens onto a {lengths}-token cache, median of "
            f"{first.get('repetitions')} (ms; in brackets relative to M=1), {first.get('threads')} "
            f"threads; read bandwidth {first.get('bandwidth_gbs')} GB/s at the run's start"
            + ("; each line's bound at its own reading, taken between its forwards" if own else "")
            + _read_counts(costs),
            "",
            forwards.table(costs, first.get("bandwidth_gbs")),
            "",
            f"![A forward's cost by rows](./{files.file_name(platform)}/"
            f"{forwards_png_name(Path(source), run)})",
            "",
        ]
    return lines


def forwards_png(
    platform: str, costs: Sequence[forwards.ForwardCost], bandwidth_gbs: float | None = None
) -> bytes:
    """A forward-cost run drawn: ms by M (left) and relative to M = 1 (right), a line per precision,
    kernels and cache length; the reference's dashed, in its cache length's colour; and where the
    run read the host's bandwidth, each line's read bound at M = 1 (the table's), a bar in its colour."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    absolute, relative = fig.subplots(1, 2)
    lines: dict[tuple[str, str, int | None], dict[int, forwards.ForwardCost]] = defaultdict(dict)
    for c in costs:
        lines[(c.precision, c.kernels, c.cache_tokens)][c.m] = c
    caches = sorted({cache for _, _, cache in lines if cache is not None})
    colours = {cache: f"C{i}" for i, cache in enumerate(caches)}
    # Where colour tells the cache lengths apart, the marker tells the precisions and kernels apart.
    kinds = list(dict.fromkeys((precision, kernels) for precision, kernels, _ in lines))
    markers = {kind: "osD^v<>"[i % 7] for i, kind in enumerate(kinds)}
    for i, ((precision, kernels, cache), by_m) in enumerate(lines.items()):
        ms = sorted(by_m)
        reference = next(iter(by_m.values())).reference
        name = precision if reference else f"{precision} / {kernels}"
        label = name + (f", {cache}-token cache" if len(caches) > 1 else "")
        style = {
            "marker": markers[(precision, kernels)],
            "linestyle": "--" if reference else "-",
            "color": colours[cache] if len(caches) > 1 and cache is not None else f"C{i}",
            "label": label,
        }
        absolute.plot(ms, [by_m[m].ms for m in ms], **style)
        if 1 not in by_m:
            continue
        relative.plot(ms, [by_m[m].ms / by_m[1].ms for m in ms], **style)
        bound = by_m[1].bound_ms(bandwidth_gbs)
        if bound:
            absolute.plot([1], [bound], marker="_", markersize=18, color=style["color"])
    every_m = sorted({c.m for c in costs})
    absolute.set_title("bars at M = 1: the read bound", fontsize=8)
    for ax, label in ((absolute, "ms a forward"), (relative, "relative to one token (M = 1)")):
        ax.set_xticks(every_m, [str(m) for m in every_m])
        ax.set_xlabel("tokens a forward (M)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    # on the right where it has lines (a run without M = 1 draws only the left)
    (relative if relative.lines else absolute).legend(fontsize=7)
    role = costs[0].role if costs else ""
    fig.suptitle(f"A {role} forward's cost by rows, on {platform}", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _read_counts(costs: Sequence[forwards.ForwardCost]) -> str:
    """What a run's "GB read" holds: rows recorded before the KV cache was measured count the
    weights alone, which understates a long cache's bound."""
    if not any(c.bytes_read for c in costs):
        return ""
    if all(c.cache_bytes for c in costs if c.bytes_read):
        return "; what a token reads counts the KV cache it attends over"
    return "; what a token reads counts the weights alone (the run did not record its KV cache)"


def _context_beside(case: baselines.CaseKey) -> str:
    """A label's ", context N" where the case proposes from the context (``--context_draft``)."""
    context = dict(case.more).get("context_draft")
    return f", context {context}" if context else ""


def _case_label(case: baselines.CaseKey) -> str:
    target = case.target_precision + ("" if case.target_kernels == "stock" else f" ({case.target_kernels})")
    if case.engine != "transformers":
        return f"{case.engine}: {target}, its draft, K={case.num_assistant_tokens}"
    draft = case.draft_precision + ("" if case.draft_kernels == "stock" else f" ({case.draft_kernels})")
    if case.draft_vocab is not None:
        draft += f", vocab {case.draft_vocab}"
    if case.draft_tree is not None:
        return f"{target} / {draft}, tree {case.draft_tree}"
    shape = f"K={case.num_assistant_tokens} {case.assistant_schedule}"
    return f"{target} / {draft}, {shape}{_context_beside(case)}"


def baselines_section(platform: str, records: Sequence[baselines.BaselineRecord], source: str) -> list[str]:
    """The measured baselines the speed gate holds this platform's benchmark cases against."""
    body = []
    for record in sorted(records, key=lambda r: r.case.case_id):
        speed, tps = record.speedup or {}, record.tokens_per_s
        mean = {mode: (tps.get(mode) or {}).get("mean") for mode in ("plain", "assisted")}
        ci = f"[{cell(speed.get('low'), '.2f')}-{cell(speed.get('high'), '.2f')}]"
        body.append(
            [
                record.case.model,
                _case_label(record.case),
                f"{record.case.prompt_tokens} x {record.case.max_new_tokens}",
                cell(mean["plain"], ".2f"),
                cell(mean["assisted"], ".2f"),
                f"{cell(speed.get('value'), '.2f', 'x')} {ci}",
                cell(record.acceptance, ".2f"),
                cell(record.extra.get("c"), ".2f"),
                record.date or "-",
            ]
        )
    table = tabulate(
        body,
        headers=[
            "pair",
            "target / draft",
            "prompt x new",
            "plain tok/s",
            "assisted tok/s",
            "speedup [CI]",
            "acceptance",
            "c",
            "measured",
        ],  # fmt: skip
        tablefmt="github",
        disable_numparse=True,
    )
    versions = _record_versions({"versions": r.versions} for r in records)
    cpus = sorted({str(r.machine.get("cpu_id") or r.machine.get("cpu") or "?") for r in records})
    command = "pytest perf/test_benchmark.py -k test_benchmark_real --update-baselines"
    lines = ["#### Speed gate baselines", ""]
    lines += _header(platform, command, versions, source)
    lines += [f"- CPU: {', '.join(cpus)}", "", table, ""]
    return lines


ACCEPTANCE_PNG = "acceptance.png"
ACCEPTANCE_COMMAND = "pytest perf/test_acceptance.py -k test_acceptance_tier --update-baselines"


def _reference_label(reference: acceptance.Reference) -> str:
    """A reference's configuration in a few words: its engine, K and schedule (or tree)."""
    case = baselines.CaseKey.from_dict(reference.case) if reference.case else None
    if case is None:
        return reference.key
    shape = f"tree {case.draft_tree}" if case.draft_tree else f"K={case.num_assistant_tokens}"
    schedule = f" {case.assistant_schedule}" if case.assistant_schedule else ""
    precisions = f"{case.target_precision} + {case.draft_precision}"
    return f"{case.model} / {case.engine} / {precisions} / {shape}{schedule}{_context_beside(case)}"


def acceptance_section(references: Sequence[acceptance.Reference], source: str) -> list[str]:
    """The acceptance references every host is held to: acceptance length and per position."""
    body = []
    for reference in references:
        summary = acceptance.summarize(reference.prompts)
        rates = " / ".join(f"{r:.2f}" for r in summary.rates) or "not counted"
        floors = " / ".join(f"{f:.2f}" for f in summary.floors()) or "-"
        body.append(
            [
                _reference_label(reference),
                str(summary.prompts),
                cell(summary.acceptance_length, ".3f"),
                rates,
                floors,
                reference.recorded_on or "-",
            ]
        )
    table = tabulate(
        body,
        headers=[
            "pair / engine / target + draft precision / proposals",
            "prompts",
            "acceptance length",
            "accepted by position",
            "floors",
            "recorded on",
        ],
        tablefmt="github",
        disable_numparse=True,
    )
    versions = _record_versions({"versions": r.versions} for r in references)
    return [
        "## Acceptance, held on every host",
        "",
        f"- Command: `{ACCEPTANCE_COMMAND}` records them; without `--update-baselines` every host is held "
        f"to them: acceptance length (tokens per verification) at least {acceptance.LENGTH_FLOOR:.0%} of "
        "the reference's, each position's acceptance at least its floor",
        f"- Versions: {versions}",
        f"- Source: `{source}`",
        "",
        table,
        "",
        f"![Acceptance by draft position per engine](./{ACCEPTANCE_PNG})",
        "",
    ]


def acceptance_png(references: Sequence[acceptance.Reference]) -> bytes:
    """Per-position acceptance of each reference, one line per configuration, floors dotted."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for reference in references:
        summary = acceptance.summarize(reference.prompts)
        if not summary.rates:
            continue
        positions = range(1, len(summary.rates) + 1)
        label = f"{_reference_label(reference)} (length {cell(summary.acceptance_length, '.2f')})"
        (line,) = ax.plot(list(positions), list(summary.rates), marker="o", label=label)
        ax.plot(list(positions), list(summary.floors()), linestyle=":", color=line.get_color())
    widest = max((len(acceptance.summarize(r.prompts).rates) for r in references), default=0)
    ax.set_xticks(list(range(1, widest + 1)))
    ax.set_xlabel("draft position (dotted: the floor each host is held to)", fontsize=9)
    ax.set_ylabel("accepted / drafted", fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance by draft position, per engine", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return png_bytes(fig)


# --------------------------------------------------------------------------- the summary


SPEEDS_PNG = "speeds.png"


def _best_humaneval(
    humaneval: Sequence[tuple[str, list[dict[str, Any]]]], config: Any = None
) -> tuple[str, dict[str, Any]] | None:
    """The HumanEval file of ``config``'s precisions (when one is named so), else of any, covering
    the most problems both ways, and its summary."""
    from harness.experiments import humaneval as he

    found = [(source, he.summarise(records)) for source, records in humaneval if records]
    if config is not None:
        own = [config.target_precision, config.draft_precision]
        named = [f for f in found if he.named_precisions(Path(f[0]).stem) in (own, own[:1])]
        found = named or found
    return max(found, key=lambda x: (x[1]["paired_tasks"], x[0]), default=None)


def summary_section(
    platforms_: Sequence[str],
    sweeps: Mapping[str, list[tuple[str, SweepSummary]]],
    humaneval: Mapping[str, list[tuple[str, list[dict[str, Any]]]]],
) -> list[str]:
    """The page's opening: per machine, the fastest exact configuration measured, its speedup over
    its own plain decoding, its ratio to llama.cpp's plain decoding (where measured around it),
    HumanEval pass@1 both ways, and the engines side by side; then where each number comes from."""
    body, engines_lines, commands = [], [], []
    for platform in platforms_:
        exact = [
            (summary, result, source)
            for source, summary in sweeps.get(platform, [])
            for result in summary.results
            if result.identical
        ]
        fastest = max(exact, key=lambda x: x[1].assisted_tokens_per_s) if exact else None
        scored = _best_humaneval(humaneval.get(platform, []), fastest[1].config if fastest else None)
        if fastest is None and scored is None:
            continue
        row = [f"`{platform}`"]
        if fastest is not None:
            summary, best, _ = fastest
            ref = summary.reference
            commands.append(
                f"- `{platform}`: `python assisted_generation.py --model_name {summary.model} --task sweep "
                f'--sweep "{_sweep_spec(best.config)}"` (against its plain decoding, as measured here)'
            )
            row += [
                f"{best.config.label} ({summary.engine_of(best)})",
                f"{best.assisted_tokens_per_s:.2f}",
                f"{best.speedup.value:.2f}x",
                f"{best.assisted_tokens_per_s / ref['tokens_per_s']:.2f}x" if ref else "not measured",
                f"yes, {best.prompts} of {best.prompts}",
                summary.newest[:10],
            ]
        else:
            row += ["-"] * 6
        if scored is not None:
            modes = scored[1]["modes"]
            rates = [modes[m]["pass@1"] for m in ("plain", "assisted")]
            row.append(
                " / ".join("-" if r is None else f"{100 * r:.1f}%" for r in rates)
                + f" ({scored[1]['paired_tasks']} problems, {Path(scored[0]).stem})"
            )
        else:
            row.append("-")
        body.append(row)
        by_engine: dict[str, list[tuple[sweep.ConfigResult, SweepSummary]]] = defaultdict(list)
        for _, summary in sweeps.get(platform, []):
            for result in summary.results:
                by_engine[summary.engine_of(result)].append((result, summary))
        if by_engine:
            table = tabulate(
                [
                    [
                        engine,
                        r.config.label,
                        r.plain_tokens_per_s,
                        r.assisted_tokens_per_s,
                        f"{r.speedup.value:.2f}x",
                        "yes" if r.identical else "no",
                        s.newest[:10],
                    ]
                    for engine, results_ in sorted(by_engine.items())
                    for r, s in [max(results_, key=lambda x: x[0].assisted_tokens_per_s)]
                ],
                headers=[
                    "engine",
                    "its fastest configuration",
                    "plain tok/s",
                    "assisted tok/s",
                    "speedup",
                    "identical",
                    "date",
                ],  # fmt: skip
                tablefmt="github",
                floatfmt=".2f",
            )
            engines_lines += [f"Engines side by side on `{platform}` (each sweep's own run):", "", table, ""]
    if not body:
        return []
    headers = ["machine", "fastest exact configuration", "tok/s", "vs its plain", "vs llama.cpp plain",
               "identical", "date", "HumanEval pass@1 plain / assisted"]  # fmt: skip
    lines = ["## Summary", "", tabulate(body, headers=headers, tablefmt="github"), ""]
    if commands:
        lines += ["The fastest exact configuration of each machine, run:", "", *commands, ""]
    lines += [
        "The fastest configuration whose every output equalled plain greedy decoding, from the sweeps "
        "below (tok/s and speedups measured within one run; llama.cpp's plain decoding of the same "
        "GGUF timed just before and after that sweep). Details, commands and versions follow per machine.",
        "",
        *engines_lines,
    ]
    return lines


def speeds_png(platform: str, sweeps: Sequence[tuple[str, SweepSummary]]) -> bytes:
    """Absolute tokens/s of every configuration and plain decoder of a machine's sweeps, side by
    side, with llama.cpp's plain decoding measured around a sweep as a reference line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bars: list[tuple[str, float, str]] = []
    refs: list[tuple[float, int, int]] = []  # llama.cpp's rate, and the first and last bar of its sweep
    for source, summary in sweeps:
        name = Path(source).stem.removesuffix(platform).removesuffix("-").removeprefix(summary.model)
        name = name.strip("-")
        name = name or "sweep"
        first = len(bars)
        for arm, rate in sorted(summary.plain_rate.items()):
            bars.append((f"{name}: {arm} (plain)", rate, "plain"))
        for r in summary.results:
            kind = "exact" if r.identical else "not exact"
            bars.append((f"{name}: {r.config.label} ({summary.engine_of(r)})", r.assisted_tokens_per_s, kind))
        if summary.reference is not None:
            refs.append((float(summary.reference["tokens_per_s"]), first, len(bars) - 1))
    fig = Figure(figsize=(14, 0.3 * len(bars) + 1.6))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colours = {"plain": "#9e9e9e", "exact": "#2e7d32", "not exact": "#c62828"}
    ys = range(len(bars))
    ax.barh(list(ys), [b[1] for b in bars], color=[colours[b[2]] for b in bars])
    ax.set_yticks(list(ys))
    ax.set_yticklabels([b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    # Each sweep's own reference spans that sweep's bars only, its value beside its foot: lines drawn
    # across the whole plot, labelled at one height, ran into one unreadable block.
    for rate, first, last in refs:
        ax.vlines(rate, first - 0.45, last + 0.45, color="#1565c0", linestyle="--", linewidth=1.2)
        ax.annotate(f"llama.cpp {rate:.1f}", (rate, last + 0.45), fontsize=7, color="#1565c0",
                    xytext=(3, -2), textcoords="offset points", va="bottom", ha="left",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
    ax.set_xlabel(
        "Tokens/Sec\ngrey: plain; green: assisted, every output identical; red: not; "
        "blue dashes: llama.cpp's plain decoding, measured around that sweep",
        fontsize=9,
    )
    ax.set_title(f"Tokens/s per engine and configuration, by sweep, on {platform}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    return png_bytes(fig)


# --------------------------------------------------------------------------- the page


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def results_page(results_dir: Path, baselines_dir: Path | None = None) -> str:
    """The page for every row file under ``results_dir`` and every measured baseline under
    ``baselines_dir`` (default: ``baselines/`` beside it); paths shown relative to their parent."""
    return _page(results_dir, baselines_dir)[0]


def _page(
    results_dir: Path, baselines_dir: Path | None = None
) -> tuple[str, dict[str, list[tuple[str, SweepSummary]]]]:
    """The page's text, and the sweeps' summaries by machine (what its plots draw)."""
    results_dir = Path(results_dir)
    root = results_dir.parent
    baselines_dir = root / "baselines" if baselines_dir is None else Path(baselines_dir)
    sections: dict[str, list[str]] = defaultdict(list)
    newest: dict[str, str] = defaultdict(str)

    for path in sorted([*results_dir.glob("**/rows/*.jsonl"), *results_dir.glob("*/engine/*.jsonl")]):
        rows = results.read_rows(path)
        for platform in sorted({r.platform or "unknown" for r in rows}):
            mine = [r for r in rows if (r.platform or "unknown") == platform]
            newest[platform] = max([newest[platform], *(r.timestamp or "" for r in mine)])
            sections[platform] += benchmark_section(platform, mine, _rel(path, root))
    for folder in sorted(p for p in baselines_dir.glob("*") if p.is_dir()):
        measured = [
            r for r in baselines.platform_records(baselines_dir, folder.name) if r.source == "measured"
        ]
        if measured:
            newest[folder.name] = max([newest[folder.name], *(r.date or "" for r in measured)])
            sections[folder.name] += baselines_section(folder.name, measured, _rel(folder, root) + "/")
    # Each sweep file summarised once: its table here, and the summary and the plot read the same.
    sweeps: dict[str, list[tuple[str, SweepSummary]]] = defaultdict(list)
    for path in sorted(results_dir.glob("**/rows/sweep/*.jsonl")):
        rows = results.read_rows(path)
        platform = rows[0].platform if rows else "unknown"
        newest[platform] = max([newest[platform], *(r.timestamp or "" for r in rows)])
        summary = _sweep_summary(rows, results.read_records(sweep.reference_path(path)))
        if summary is not None:
            sweeps[platform].append((_rel(path, root), summary))
            sections[platform] += sweep_section(platform, rows, _rel(path, root), summary)
    for folder, section in (("context", context_section), ("concurrency", concurrency_section)):
        for path in sorted(results_dir.glob(f"rows/{folder}/*.jsonl")):
            rows = results.read_rows(path)
            if rows:
                platform = rows[0].platform or "unknown"
                newest[platform] = max([newest[platform], *(r.timestamp or "" for r in rows)])
                sections[platform] += section(platform, rows, _rel(path, root))
    humaneval_files: dict[str, list[tuple[str, list[dict[str, Any]]]]] = defaultdict(list)
    for path in sorted(results_dir.glob("*/humaneval/*.jsonl")):
        humaneval_files[path.parent.parent.name].append((_rel(path, root), results.read_records(path)))
    for folder in sorted(results_dir.glob("*/divergence")):
        tiers = {_rel(p, root): results.read_records(p) for p in sorted(folder.glob("*.jsonl"))}
        if any(tiers.values()):
            sections[folder.parent.name] += divergence_section(
                folder.parent.name, {k: v for k, v in tiers.items() if v}
            )
    for path in sorted(results_dir.glob("*/forwards/*.jsonl")):
        records = results.read_records(path)
        if records:
            sections[path.parent.parent.name] += forwards_section(
                path.parent.parent.name, records, _rel(path, root)
            )
    for path in sorted(results_dir.glob("*/humaneval/*.jsonl")):
        records = results.read_records(path)
        if records:
            sections[path.parent.parent.name] += humaneval_section(
                path.parent.parent.name, records, _rel(path, root)
            )

    lines = [
        "# Results",
        "",
        f"Generated by `{REGEN}` from the committed rows under `{results_dir.name}/`; do not edit. "
        "Every table names the machine it ran on, the versions its rows record and the command that "
        "reproduces it. Hosts of one kind differ by ~25% in absolute speed: compare ratios measured "
        "in one run. What the numbers mean: `docs/FINDINGS.md`.",
        "",
    ]
    order = sorted(sections, key=lambda p: (newest[p], p), reverse=True)
    lines += summary_section(order, sweeps, humaneval_files)
    references = acceptance.load_all(baselines_dir)
    if references:
        lines += acceptance_section(references, _rel(acceptance.path_of(baselines_dir), root))
    for platform in order:
        lines += [f"## {platform}", ""]
        if sweeps.get(platform):
            lines += [f"![Absolute speed on {platform}](./{files.file_name(platform)}/{SPEEDS_PNG})", ""]
        lines += sections[platform]
    return "\n".join(lines).rstrip() + "\n", sweeps


def write_results_page(results_dir: Path, baselines_dir: Path | None = None, out: Path | None = None) -> Path:
    """The page of ``results_dir`` and its per-machine speed plots, written into ``out`` (default:
    ``results_dir`` itself)."""
    out = Path(out if out is not None else results_dir)
    text, sweeps = _page(Path(results_dir), baselines_dir)
    for platform, found in sweeps.items():
        files.atomic_write(out / files.file_name(platform) / SPEEDS_PNG, speeds_png(platform, found))
    for source in sorted(Path(results_dir).glob("rows/context/*.jsonl")):
        rows = results.read_rows(source)
        if rows:
            platform = rows[0].platform or "unknown"
            files.atomic_write(out / files.file_name(platform) / CONTEXT_PNG, context_png(platform, rows))
    for source in sorted(Path(results_dir).glob("rows/concurrency/*.jsonl")):
        rows = results.read_rows(source)
        levels = concurrency.levels_of_rows(rows)
        if levels:
            platform = rows[0].platform or "unknown"
            title = concurrency_report.title(rows[0].model, _engine(rows[0]), platform)
            png = out / files.file_name(platform) / concurrency_png_name(source)
            files.atomic_write(png, concurrency_report.plot(levels, title))
    for source in sorted(Path(results_dir).glob("*/forwards/*.jsonl")):
        platform = source.parent.parent.name
        for run, mine in enumerate(forward_runs(results.read_records(source)), start=1):
            costs = [forwards.ForwardCost.from_record(r) for r in mine]
            png = out / files.file_name(platform) / forwards_png_name(source, run)
            files.atomic_write(png, forwards_png(platform, costs, mine[0].get("bandwidth_gbs")))
    root = Path(results_dir).parent
    references = acceptance.load_all(root / "baselines" if baselines_dir is None else Path(baselines_dir))
    if references:
        files.atomic_write(out / ACCEPTANCE_PNG, acceptance_png(references))
    path = out / PAGE_NAME
    files.atomic_write(path, text.encode("utf-8"))
    return path


def write_rows_page(out: Path, rows_by_file: dict[str, list[Row]]) -> Path:
    """A page of given row files only (``--regen-tables --rows``): their benchmark sections by machine."""
    sections: dict[str, list[str]] = defaultdict(list)
    for source, rows in sorted(rows_by_file.items()):
        for platform in sorted({r.platform or "unknown" for r in rows}):
            mine = [r for r in rows if (r.platform or "unknown") == platform]
            sections[platform] += benchmark_section(platform, mine, source)
    lines = [
        "# Results",
        "",
        f"Generated by `{REGEN} --rows ...` from {', '.join(sorted(rows_by_file))}.",
        "",
    ]
    for platform in sorted(sections):
        lines += [f"## {platform}", "", *sections[platform]]
    path = Path(out) / PAGE_NAME
    files.atomic_write(path, ("\n".join(lines).rstrip() + "\n").encode("utf-8"))
    return path
