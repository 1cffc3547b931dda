"""Read the published seed results (markdown) and turn them into baselines.

The seeds are README-style markdown: platform sections (``# PHX``, ``# STX (with MCDM)``, ``# HPT``,
``# STX B0 with MCDM - 7/13/2024``), headings that name target/draft devices and precisions
(``## Target: AIE/w4abf16 Assistant: CPU/bf16``), bullets with generation settings, and before each result
table the command line that produced it (```` ```python assisted_generation.py --model_name ... ``` ````).
They are read from a folder given by the caller (default ``../shared/seeds`` next to the repo) and never
copied into the repo; only the baselines derived from them are.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.base.errors import HarnessError
from harness.settings.baselines import BaselineRecord, CaseKey, rounded, save_baseline, speedup_summary
from harness.settings.results import SEED_COLUMNS

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SEEDS_DIR = REPO_ROOT.parent / "shared" / "seeds"

_PLATFORM_RE = re.compile(r"^(PHX|STX|HPT)\b", re.IGNORECASE)
_DATE_RE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")
_TARGET_RE = re.compile(r"Target:\s*([A-Za-z]+)/([A-Za-z0-9]+)")
_ASSISTANT_RE = re.compile(r"Assistant:\s*([A-Za-z]+)/([A-Za-z0-9]+)")
_DRAFT_ON_RE = re.compile(r"Draft\b.*?\bon\s+([A-Za-z]+):\s*([A-Za-z0-9]+)", re.IGNORECASE)
_WITH_DRAFT_RE = re.compile(r"with draft:\s*(\S+)", re.IGNORECASE)
_COMMAND_RE = re.compile(r"^```python\s+(.*?)\s*```\s*$")
# Generation settings written in bullets (the llama seed states them there, not on its command line).
_SETTING_RES: dict[str, tuple[re.Pattern[str], type]] = {
    "top_p": (re.compile(r"\btop_p\s*=\s*([0-9.]+)"), float),
    "temperature": (re.compile(r"\btemp\w*\s*=\s*([0-9.]+)"), float),  # the seed spells it "tempertature"
    "do_sample": (re.compile(r"\bdo_sample\s*=\s*(True|False)"), lambda s: s == "True"),
    "num_assistant_tokens": (re.compile(r"\bnum_assistant_tokens\s*=\s*(\d+)"), int),
    "schedule": (re.compile(r"num_assistant_tokens_schedule\s*=\s*\(?\s*[\"']?(\w+)"), str),
}
_INT_COLUMNS = {"example", "prompt_tokens", "new_tokens"}


@dataclass
class SeedTable:
    """One github-style table of a seed file, with the context that explains it."""

    file: str
    platform: str | None  # "phx" / "stx" / "hpt"; None outside a platform section
    model: str | None  # --model_name of the command, when there is one
    command: str | None
    flags: dict[str, Any]
    rows: list[dict[str, Any]]
    columns: list[str] = field(default_factory=list)
    line: int = 0  # 1-based line of the table header
    platform_heading: str | None = None  # the original heading, e.g. "STX B0 with MCDM - 7/13/2024"
    heading: str | None = None  # the nearest "##" heading above the table
    section: int = 0  # tables with equal section share platform and target/draft devices
    context: dict[str, Any] = field(default_factory=dict)  # devices, precisions, settings, draft, date

    @property
    def is_result(self) -> bool:
        """A results table with the seeds' seven columns (other tables are summaries or model lists)."""
        return self.columns == [name for name, _ in SEED_COLUMNS]

    @property
    def assisted(self) -> bool:
        if self.command is not None:
            return bool(self.flags.get("assisted_generation"))
        return bool(self.heading and re.search(r"assisted generation", self.heading, re.IGNORECASE))


def _command_parser() -> argparse.ArgumentParser:
    # The flags of the seeds' assisted_generation.py; unknown flags are kept, not fatal.
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.add_argument("--model_name")
    p.add_argument("--task")
    p.add_argument("--assisted_generation", action="store_true")
    p.add_argument("--draft_precision")
    p.add_argument("--do_sample", action="store_true")
    p.add_argument("--temperature", type=float)
    p.add_argument("--fast_attention", action="store_true")
    return p


def parse_command(command: str) -> dict[str, Any]:
    """Flags of a seed command line, e.g. ``assisted_generation.py --model_name opt-6.7b --task decode``."""
    argv = shlex.split(command)
    if argv and argv[0].endswith(".py"):
        argv = argv[1:]
    try:
        ns, unknown = _command_parser().parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise HarnessError(f"cannot parse seed command {command!r}: {exc}; fix the command line") from exc
    flags = vars(ns)
    flags["unknown"] = unknown
    return flags


def _cell(text: str) -> str:
    text = text.strip()
    # Bold marks a highlighted number in the seeds; the value is what matters.
    return re.sub(r"\*\*(.*?)\*\*", r"\1", text).strip()


def _split_row(line: str) -> list[str]:
    # Hand-split: the seeds' pipe tables have no escaped pipes or inline code, so a markdown parser
    # dependency would buy nothing here.
    return [_cell(c) for c in line.strip().strip("|").split("|")]


def _convert(key: str, text: str) -> Any:
    if text.lower() in ("na", "n/a", ""):
        return None
    try:
        return int(text) if key in _INT_COLUMNS else float(text)
    except ValueError as exc:
        raise HarnessError(f"seed cell {key}={text!r} is not a number") from exc


def _parse_table(lines: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    columns = _split_row(lines[0])
    body = [ln for ln in lines[1:] if not re.fullmatch(r"\|?[\s:|-]+\|?", ln.strip())]
    result = columns == [name for name, _ in SEED_COLUMNS]
    rows: list[dict[str, Any]] = []
    for ln in body:
        cells = _split_row(ln)
        if len(cells) != len(columns):
            raise HarnessError(f"table row has {len(cells)} cells, header has {len(columns)}: {ln.strip()!r}")
        if result:
            rows.append({attr: _convert(attr, c) for (_, attr), c in zip(SEED_COLUMNS, cells, strict=True)})
        else:
            rows.append(dict(zip(columns, cells, strict=True)))
    return columns, rows


def parse_seed_file(path: str | Path) -> list[SeedTable]:
    """Every table in one seed file, in order, with its platform, command and settings."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise HarnessError(f"cannot read seed file {path}: {exc}") from exc
    tables: list[SeedTable] = []
    platform = platform_heading = heading = command = None
    ctx: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    section = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("# "):
            title = stripped[2:].strip()
            m = _PLATFORM_RE.match(title)
            platform = m.group(1).lower() if m else None
            platform_heading = title if m else None
            heading = command = None
            settings = {}
            ctx = {}
            d = _DATE_RE.search(title)
            if m and d:
                ctx["date"] = f"{d.group(3)}-{int(d.group(1)):02d}-{int(d.group(2)):02d}"
            section += 1
        elif stripped.startswith("##"):
            heading = stripped.lstrip("#").strip()
            if m := _PLATFORM_RE.match(heading):
                # e.g. "## PHX - Just for reference - Target: CPU/bf16" inside the STX section of the
                # CodeLlama seed: those tables were measured on PHX, whatever section holds them.
                platform, platform_heading = m.group(1).lower(), heading
                ctx, settings = {}, {}
                section += 1
            if t := _TARGET_RE.search(heading):
                # A heading that declares the target starts a new device configuration.
                ctx = {k: v for k, v in ctx.items() if k == "date"}
                ctx.update(target_device=t.group(1), target_precision=t.group(2))
                section += 1
            if a := _ASSISTANT_RE.search(heading) or _DRAFT_ON_RE.search(heading):
                ctx.update(assistant_device=a.group(1), assistant_precision=a.group(2))
            if d := _WITH_DRAFT_RE.search(heading):
                ctx["draft_model"] = d.group(1)
        elif m := _COMMAND_RE.match(stripped):
            command = m.group(1)
        elif stripped.startswith("|"):
            start = i
            while i < len(lines) and lines[i].strip().startswith("|"):
                i += 1
            try:
                columns, rows = _parse_table(lines[start:i])
            except HarnessError as exc:
                raise HarnessError(f"{path}:{start + 1}: {exc}; fix the seed table") from exc
            flags = parse_command(command) if command else {}
            tables.append(
                SeedTable(
                    file=path.name,
                    platform=platform,
                    model=flags.get("model_name"),
                    command=command,
                    flags=flags,
                    rows=rows,
                    columns=columns,
                    line=start + 1,
                    platform_heading=platform_heading,
                    heading=heading,
                    section=section,
                    context={**ctx, "settings": dict(settings)},
                )
            )
            command = None  # a command line belongs to the one table after it
            continue
        elif platform is not None:
            for key, (rx, conv) in _SETTING_RES.items():
                if s := rx.search(stripped):
                    settings[key] = conv(s.group(1))
        i += 1
    return tables


def seed_files(seeds_dir: str | Path) -> list[Path]:
    seeds_dir = Path(seeds_dir)
    if not seeds_dir.is_dir():
        raise HarnessError(
            f"seeds folder {seeds_dir} not found; pass the folder holding the seed *.txt files "
            f"(default {DEFAULT_SEEDS_DIR})"
        )
    files = sorted(seeds_dir.glob("*.txt"))
    if not files:
        raise HarnessError(f"no seed *.txt files in {seeds_dir}; pass the folder that holds them")
    return files


def parse_seeds(seeds_dir: str | Path = DEFAULT_SEEDS_DIR) -> list[SeedTable]:
    """Every table of every seed file, in file order."""
    return [t for f in seed_files(seeds_dir) for t in parse_seed_file(f)]


# --- Import as baselines ---


def _effective(table: SeedTable, partner: SeedTable | None) -> dict[str, Any]:
    """Settings that produced a table: command flags override the section's bullets."""
    settings = table.context.get("settings", {})
    flags = table.flags if table.command else (partner.flags if partner else {})
    do_sample = bool(flags.get("do_sample") or settings.get("do_sample"))
    temperature = flags.get("temperature") or settings.get("temperature")
    return {
        "task": flags.get("task"),
        "model": flags.get("model_name"),
        "do_sample": do_sample,
        "temperature": temperature if do_sample else None,
        "top_p": settings.get("top_p") if do_sample else None,
        "num_assistant_tokens": settings.get("num_assistant_tokens"),
        "schedule": settings.get("schedule"),
    }


def _find_plain(table: SeedTable, tables: Sequence[SeedTable]) -> tuple[SeedTable | None, str | None]:
    """The plain (no --assisted_generation) table measured under the same settings, and how it was matched."""
    candidates = [t for t in tables if t.is_result and not t.assisted and t.section == table.section]
    if table.command is None:
        # No command line of its own: the table with the very same prompt lengths ran the same prompts.
        lengths = [r["prompt_tokens"] for r in table.rows]
        same = [t for t in candidates if [r["prompt_tokens"] for r in t.rows] == lengths]
        return (same[-1], "same prompt lengths as the plain table") if same else (None, None)
    mine = _effective(table, None)
    keys = ("task", "model", "do_sample", "temperature")
    same = [t for t in candidates if all(_effective(t, None)[k] == mine[k] for k in keys)]
    before = [t for t in same if t.line < table.line]
    pick = before[-1] if before else (same[0] if same else None)
    return pick, ("same command without --assisted_generation" if pick else None)


def _tps_basis(row: dict[str, Any]) -> tuple[float | None, str]:
    if row.get("tokens_per_s") is not None:
        return float(row["tokens_per_s"]), "Tokens/Sec"
    if row.get("total_s") and row.get("new_tokens"):
        # Tables without Tokens/Sec ('na') give only total time; the seed's own summary compares
        # total time per new token, so the same basis is used here.
        return row["new_tokens"] / row["total_s"], "New Tokens Generated / Total Time (s)"
    return None, "none"


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return rounded(sum(vals) / len(vals)) if vals else None


def _mode_summary(table: SeedTable | None) -> tuple[dict[str, Any] | None, float | None, float | None]:
    if table is None:
        return None, None, None
    tps = [r["tokens_per_s"] for r in table.rows]
    entry = None
    if all(v is not None for v in tps):
        entry = {"mean": _mean(tps), "samples": tps}
    return (
        entry,
        _mean([r["time_per_token_ms"] for r in table.rows]),
        _mean([r["prefill_ms"] for r in table.rows]),
    )


def seed_record(table: SeedTable, plain: SeedTable | None, matched_by: str | None) -> BaselineRecord:
    """A baseline record for one assisted seed table (and its plain partner, if published)."""
    eff = _effective(table, plain)
    if eff["task"] is None or eff["model"] is None:
        raise HarnessError(
            f"{table.file}:{table.line}: cannot tell which task/model this table ran (no command line and no "
            "plain table with the same prompts); add its command line above it"
        )
    ctx = table.context
    case = CaseKey(
        model=eff["model"],
        task=eff["task"],
        prompt_tokens=None,
        max_new_tokens=None,
        target_precision=ctx.get("target_precision", "default"),
        draft_precision=table.flags.get("draft_precision") or ctx.get("assistant_precision", "default"),
        num_assistant_tokens=eff["num_assistant_tokens"],
        assistant_schedule=eff["schedule"],
        do_sample=eff["do_sample"],
        temperature=eff["temperature"],
        top_p=eff["top_p"],
        draft=ctx.get("draft_model"),
    )
    plain_tps, plain_tpt, plain_prefill = _mode_summary(plain)
    asst_tps, asst_tpt, asst_prefill = _mode_summary(table)
    notes = [f"original heading: {table.platform_heading}"]
    if table.heading and table.heading != table.platform_heading:
        notes.append(f"table heading: {table.heading}")
    if "target_device" in ctx:
        target = f"Target: {ctx['target_device']}/{ctx['target_precision']}"
        if "assistant_device" in ctx:
            target += f" Assistant: {ctx['assistant_device']}/{ctx['assistant_precision']}"
        notes.append(target)
    if table.command is None and plain is not None:
        notes.append(
            f"no command line published; task and model taken from the plain table at line {plain.line} "
            f"({matched_by})"
        )
    speedup = None
    extra: dict[str, Any] = {"rows": {"assisted": table.rows}, "commands": {"assisted": table.command}}
    if plain is not None:
        extra["rows"]["plain"] = plain.rows
        extra["commands"]["plain"] = plain.command
        extra["plain_table_line"] = plain.line
        pairs = list(zip(plain.rows, table.rows, strict=False))
        if len(plain.rows) != len(table.rows):
            notes.append(
                f"plain has {len(plain.rows)} rows, assisted {len(table.rows)}; paired the first ones"
            )
        if moved := [a["example"] for p, a in pairs if p["prompt_tokens"] != a["prompt_tokens"]]:
            notes.append(f"prompt lengths differ between plain and assisted for examples {moved}")
        if differ := [a["example"] for p, a in pairs if p["new_tokens"] != a["new_tokens"]]:
            # Greedy outputs should match; a different length means the output itself changed.
            notes.append(f"new tokens differ between plain and assisted for examples {differ}")
        basis = {_tps_basis(p)[1] for p, _ in pairs} | {_tps_basis(a)[1] for _, a in pairs}
        p_rate = [_tps_basis(p)[0] for p, _ in pairs]
        a_rate = [_tps_basis(a)[0] for _, a in pairs]
        if all(v is not None for v in p_rate + a_rate) and len(basis) == 1:
            speedup = speedup_summary(p_rate, a_rate, paired=True)  # paired by Example#: same prompt
            speedup["basis"] = basis.pop()
            speedup["per_prompt"] = [
                {"example": a["example"], "prompt_tokens": a["prompt_tokens"], "speedup": s}
                for (_, a), s in zip(pairs, speedup["samples"], strict=True)
            ]
    else:
        notes.append("no plain (non-assisted) table published for this command, so no speedup")
    extra["notes"] = notes
    extra["table_line"] = table.line
    return BaselineRecord(
        case=case,
        source=f"seed:{table.file}",
        date=ctx.get("date"),
        machine={
            "name": table.platform,
            "heading": table.platform_heading,
            **{k: ctx[k] for k in ("target_device", "assistant_device") if k in ctx},
        },
        versions={},
        tokens_per_s={"plain": plain_tps, "assisted": asst_tps},
        time_per_token_ms={"plain": plain_tpt, "assisted": asst_tpt},
        prefill_ms={"plain": plain_prefill, "assisted": asst_prefill},
        acceptance=None,
        speedup=speedup,
        extra=extra,
    )


# What pytest-benchmark's commit_info and datetime say of a published table: not measured here.
IMPORTED_COMMIT_INFO = {"id": "published", "project": "assisted-generation", "dirty": False}
IMPORTED_AT = "published"


def import_seed_baselines(
    seeds_dir: str | Path = DEFAULT_SEEDS_DIR, baselines_root: str | Path = REPO_ROOT / "baselines"
) -> list[Path]:
    """Store one baseline per assisted seed table in its platform's storage; returns the storage
    files written (deterministic content: no clock, no checkout in them)."""
    written: dict[tuple[str, str], str] = {}
    paths: set[Path] = set()
    for file in seed_files(seeds_dir):
        tables = parse_seed_file(file)
        for table in tables:
            if not (table.is_result and table.assisted and table.platform):
                continue
            plain, matched_by = _find_plain(table, tables)
            record = seed_record(table, plain, matched_by)
            key = (table.platform, record.case.case_id)
            origin = f"{table.file}:{table.line}"
            if key in written:
                raise HarnessError(
                    f"seed tables {written[key]} and {origin} map to the same baseline {key[1]} on "
                    f"{key[0]}; their settings must differ in a way CaseKey records"
                )
            written[key] = origin
            paths.add(
                save_baseline(
                    baselines_root,
                    table.platform,
                    record.case,
                    record,
                    commit_info=IMPORTED_COMMIT_INFO,
                    saved_at=IMPORTED_AT,
                )
            )
    return sorted(paths)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Import the published seed tables as baselines.")
    parser.add_argument("seeds_dir", nargs="?", default=str(DEFAULT_SEEDS_DIR))
    parser.add_argument("--baselines", default=str(REPO_ROOT / "baselines"))
    args = parser.parse_args(argv)
    for path in import_seed_baselines(args.seeds_dir, args.baselines):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
