"""Measured rows: one per (prompt, mode), the unit every other tool reads.

A row is flat (no nesting besides ``output_ids`` and ``versions``) so it serialises to one JSON line
and so tables, baselines and gates can read any column by name. Rows are appended to JSONL files one
at a time and flushed, so an interrupted run keeps every finished row and a rerun can resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.base.errors import HarnessError
from harness.settings import setup

# Columns the seeds publish, in their order, mapped to the row attribute that fills each.
SEED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Example#", "example"),
    ("Prompt Length (tokens)", "prompt_tokens"),
    ("New Tokens Generated", "new_tokens"),
    ("Total Time (s)", "total_s"),
    ("Prefill Phase (ms)", "prefill_ms"),
    ("Time/Token (ms)", "time_per_token_ms"),
    ("Tokens/Sec", "tokens_per_s"),
)

# Columns this suite adds after the seeds' seven.
ACCEPTANCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Drafted", "drafted"),
    ("Accepted", "accepted"),
    ("Acceptance", "acceptance_rate"),
    ("Tokens/Target Fwd", "tokens_per_target_forward"),
    ("Target Fwds", "target_forwards"),
    ("Draft (ms)", "draft_ms"),
)


@dataclass
class Measured:
    """A row's fields besides its settings: what ran, what was measured, where and with what."""

    # What was run
    example: int
    assisted: bool
    task: str
    target_model: str
    draft_model: str | None
    # Measurements
    prompt_tokens: int
    new_tokens: int
    total_s: float
    prefill_ms: float  # generate() start -> end of the target's first forward (covers first drafts)
    target_prefill_ms: float  # the target's first forward alone
    time_per_token_ms: float  # (total - prefill) / (new_tokens - 1), draft time included
    tokens_per_s: float  # 1000 / time_per_token_ms
    target_forwards: int
    draft_forwards: int
    target_ms: float  # summed target forward time
    draft_ms: float | None  # summed draft forward time; None where the engine books none (a server)
    other_ms: float  # wall time outside both models' forwards
    drafted: int
    accepted: int
    acceptance_rate: float | None  # accepted / drafted; None when nothing was drafted
    tokens_per_target_forward: float
    output_ids: list[int]
    # Where and with what
    platform: str = ""
    # The CPU's family/model/stepping (``platforms.PlatformInfo.cpu_id``): hosts of one platform slug
    # can be different generations, which differ in speed and in where the kernels are bound.
    cpu: str = ""
    prompt_label: str = ""
    prompt_sha: str = ""  # setup.prompt_digest of the prompt's token ids: part of the resume key
    versions: dict[str, str] = field(default_factory=dict)
    run_id: str = ""
    timestamp: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Accepted tokens proposed from the context, not by the draft model (``--context_draft``); None
    # where nothing proposed from the context.
    accepted_from_context: int | None = None
    # [drafted, accepted] per draft position (position i accepted when candidates 0..i all were),
    # from the run's verifications or the engine's own books (docs/USAGE.md says which, per engine);
    # None for plain decoding, and where an engine's books give no positions.
    accepted_by_position: list[list[int]] | None = None
    # Tokens emitted per verification (vLLM's mean acceptance length: 1 + accepted / verifications),
    # the prompt's forward and its first token left out; None for plain decoding.
    acceptance_length: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        row = cls(**known)
        row.extra.update(extra)
        return row  # type: ignore[return-value]

    def key(self) -> tuple[Any, ...]:
        """Identity of a row for resuming: same run, prompt and settings means already done."""
        return setup.row_key(self)


def _row_class() -> type[Measured]:
    # The setting columns are ``setup.FIELDS``' own (model, mode, precisions, kernels, devices,
    # engine, K and schedule, sampling, budget), so a new setting is a column of every row without a
    # second list here; a column a row written before it existed lacks reads the field's ``missing``.
    settings = [(f.column, Any, field(default=f.missing)) for f in setup.FIELDS]
    return dataclasses.make_dataclass(
        "Row",
        settings,
        bases=(Measured,),
        namespace={
            "__doc__": "One prompt decoded once in one mode, with every setting needed to reproduce it "
            "(its columns: ``Measured``'s and one per ``setup.FIELDS`` entry).",
            "__module__": __name__,
        },
    )


Row = _row_class()


RUNS_ENV = "ASSISTED_GENERATION_RUNS"


def runs_dir() -> Path:
    """Where ordinary runs write rows, tables and plots: ``$ASSISTED_GENERATION_RUNS``, else ``runs/``
    (git-ignored). The committed ``results/`` are inputs; only ``--regen-tables`` writes them."""
    return Path(os.environ.get(RUNS_ENV) or "runs")


def utc_now() -> str:
    """A row's timestamp: UTC, to the second, ISO 8601 (so that strings compare as times)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def append_row(path: str | os.PathLike[str], row: Row | dict[str, Any]) -> None:
    """Append one row as a JSON line and force it to disk before returning.

    Opening in append mode per row (rather than holding a handle) keeps a crash from losing
    anything already written and lets several tools read the file while a run goes on. A torn last
    line left by a killed run is healed first (``drop_torn_tail``), so it never glues onto this row.
    """
    data = row.to_dict() if isinstance(row, Row) else row
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def drop_torn_tail(path: str | Path) -> bool:
    """Cut a half-written last line (a run killed mid-append) so the next row starts on its own line.

    ``read_records`` already ignores such a line, but appending after it would glue the next row onto it
    and turn the pair into one unreadable line in the middle of the file. Returns whether it cut.
    """
    path = Path(path)
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    keep = data.rfind(b"\n") + 1  # 0 when the torn row is the only line
    try:
        json.loads(data[keep:])
    except ValueError:
        with path.open("r+b") as fh:
            fh.truncate(keep)
        return True
    # Killed between the row and its newline: the row is whole (read_rows counted it), so keep it.
    with path.open("ab") as fh:
        fh.write(b"\n")
    return False


def check_out_folder(flag: str, folder: str | None) -> None:
    """A folder a run will write into (``--results_dir``, ``--humaneval-out``): a folder or creatable
    as one, and writable; checked before any model loads."""
    if folder is None:
        return
    path = Path(folder)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise HarnessError(f"{flag} {folder}: {existing} is a file, not a folder; pass a folder")
    if not os.access(existing, os.W_OK):
        raise HarnessError(f"{flag} {folder}: {existing} is not writable; pass a folder you can write to")
    try:
        # os.access says yes to root everywhere (/proc included): a file made and removed says for sure.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise HarnessError(
            f"{flag} {folder}: nothing can be written under {existing} ({exc.strerror}); pass a folder you "
            "can write to"
        ) from None


ROW_KEYS = ("example",)  # what every measured row holds (``_check_row``)


def check_rows_path(path: Path, flag: str = "--json", keys: tuple[str, ...] = ROW_KEYS) -> None:
    """A rows file must be a regular file we can append to (or create), checked before any model
    loads: a folder, a device, a path under a file or a read-only place fails now, not after a decode."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # judged below: a path to create, or one under a file
    except OSError as exc:  # a name too long, a loop of links: nothing can be written there
        raise HarnessError(
            f"{flag} {path}: a file cannot be created there ({exc.strerror}); pass another path"
        ) from None
    if path.is_symlink() and not path.exists():
        raise HarnessError(
            f"{flag} {path} is a link to {os.readlink(path)}, which does not exist; pass the rows file's own "
            "path, or create the file the link names"
        )
    if path.is_dir():
        raise HarnessError(f"{flag} {path} is a folder; pass a file path such as runs/run.jsonl")
    if path.exists() and not path.is_file():
        raise HarnessError(f"{flag} {path} is not a regular file (a device or pipe); pass a file path")
    parent = path.parent if str(path.parent) else Path(".")
    existing = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise HarnessError(f"{flag} {path}: {existing} is a file, so nothing can be created under it")
    target = path if path.exists() else existing
    if not os.access(target, os.W_OK):
        raise HarnessError(f"{flag} {path}: {target} is not writable; pass a path you can write to")
    if path.exists():
        with path.open("rb") as fh:
            first = fh.readline()  # read, not stat: /proc files report size 0 and still hold text
        if first.strip() and not _is_row_line(first, keys):
            raise HarnessError(
                f"{flag} {path} exists and is not a rows file (its first line is not a result row); "
                "it is left untouched: pass a new file or a rows file of an earlier run"
            )
    elif path.parent.is_dir():
        # Create and remove it now: a place that takes no new file (/proc, a name too long for the
        # file system) fails before any model loads, not when the first row is written. (A folder
        # still to be made is made by the run; ``existing`` above was checked writable.)
        try:
            path.open("x").close()
        except OSError as exc:
            raise HarnessError(
                f"{flag} {path}: a file cannot be created there ({exc.strerror}); pass another path"
            ) from None
        path.unlink()


def _is_row_line(line: bytes, keys: tuple[str, ...]) -> bool:
    """Whether a file's first line is a row this harness wrote (a torn single line still counts)."""
    try:
        data = json.loads(line)
    except ValueError:
        # A run killed mid-way through its first row leaves a torn line: a rows file still.
        return line.lstrip().startswith(b'{"') and b"\n" not in line
    return isinstance(data, dict) and all(k in data for k in keys)


def read_records(
    path: str | os.PathLike[str], check: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Every complete JSON object line of a row file (every store's one reader): a torn last line
    (killed mid-write) is ignored, not fatal; a damaged line elsewhere, or one ``check`` refuses
    (by raising TypeError), is an error naming it."""
    path = Path(path)
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            if check is not None:
                check(data)
        except (json.JSONDecodeError, TypeError) as exc:
            if number == len(lines):
                break  # interrupted write: the row was not finished, so it is not a result
            raise ValueError(f"{path}:{number}: not a result row ({exc}); fix or remove that line") from exc
        records.append(data)
    return records


def read_rows(path: str | os.PathLike[str]) -> list[Row]:
    """The measured rows of a file (``read_records``, each checked to be a ``Row``)."""
    return [Row.from_dict(data) for data in read_records(path, _check_row)]


def _check_row(data: dict[str, Any]) -> None:
    example = data.get("example")
    if not isinstance(example, int) or isinstance(example, bool):
        raise TypeError(f"'example' must be an integer, got {example!r}")


@contextlib.contextmanager
def exclusive(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold a lock on the rows file ``path`` for a run that appends to it: a second run on the same
    file is refused at once (two identical runs would each write every row, duplicating them).

    The lock is taken on the file itself (its inode, created empty when new), not on a name beside
    it: a symlink, a hard link or another spelling of the path reaches the same lock."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fh = path.open("a")
    except OSError as exc:
        raise HarnessError(
            f"--json {path}: cannot open it for writing ({exc.strerror}); pass another file"
        ) from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HarnessError(
                f"another run is writing {path}; wait for it to finish or pass another file"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def iter_rows(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Row]:
    for p in paths:
        yield from read_rows(p)
