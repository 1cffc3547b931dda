"""Committed baselines, in pytest-benchmark's storage format: one saved run per platform.

Layout: ``baselines/<platform>/0001_baseline.json`` (``storage_file``), which pytest-benchmark reads as
``--benchmark-storage baselines/<platform>``. Each case (``CaseKey``; ``case_id`` is a readable slug of
every setting that changes speed) has an entry per arm: ``plain`` and ``assisted`` (rounds: one
decode's time per token, in seconds) and ``ratio`` (rounds: each interleaved round's assisted/plain
time per token, the inverse of its speedup, which an unchanged build keeps on any host of a platform).
The rest of the case's record (acceptance, c, v, per-round forward costs, where it was measured) is in
its first entry's ``extra_info["baseline"]``; the gate reads its samples from the entries' rounds, so
there is one store. Written sorted and indented, so a git diff shows what moved, and atomically
(temporary file, then ``os.replace``): an interrupted ``--update-baselines`` leaves the old file whole.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest_benchmark
from pytest_benchmark.stats import Stats
from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import get_commit_info, get_machine_id

from harness.base import files
from harness.base.errors import HarnessError
from harness.settings import setup
from harness.theory import trees
from harness.theory.analysis import round_cost
from harness.theory.stats import (
    DEFAULT_ALPHA,
    DEFAULT_MARGIN,
    GateResult,
    gate,
    mean_ci,
    speedup_ci,
)

# Schema 3: a platform's baselines are one pytest-benchmark saved run (``storage_file``); each case's
# record sits in its entries' extra_info, its rounds are the entries' data.
SCHEMA = 3
STORAGE_FILE = "0001_baseline.json"
# A case's pytest-benchmark entries: each arm's time per token, and the per-round ratio that gates.
ARMS = ("ratio", "assisted", "plain")
ARM_UNITS = {
    "plain": "seconds per token",
    "assisted": "seconds per token",
    "ratio": "assisted/plain time per token (dimensionless)",
}
# Schema 1 spelled five case fields its own way; they are now the run settings' column names.
_SCHEMA_1_NAMES = {
    "new_tokens": "max_new_tokens",
    "schedule": "assistant_schedule",
    "backend": "target_backend",
    "kernels": "target_kernels",
    "provider": "execution_provider",
}
_REGENERATE = (
    "rerun the benchmark with --update-baselines to regenerate it (or restore the committed copy with "
    "`git checkout -- {path}`)"
)


class MissingBaselineError(HarnessError):
    """No baseline stored for a case on this platform yet."""


def _part(text: str) -> str:
    # Like platforms.slug, but keeps dots so "t0.7" and "opt-6.7b" stay readable.
    return re.sub(r"[^a-z0-9.]+", "-", str(text).lower()).strip("-.") or "none"


def model_dir(model: str) -> str:
    """Folder name for a model: its own spelling, minus anything unsafe in a path."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.")
    if not cleaned:
        raise HarnessError(f"model name {model!r} has no usable characters for a baseline folder")
    return cleaned


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class CaseKey:
    """Every setting that changes speed; two runs with equal keys are comparable.

    Its fields are the run settings' identity columns (``setup.FIELDS``) that change speed, under
    the same names, plus where the case runs: the task and prompt length. ``prompt_tokens`` and
    ``max_new_tokens`` are None for a case that covers a task's whole prompt set (the seeds' decode
    tables mix prompt lengths). ``draft`` names the draft model or method when the pair name does not
    fix it (a seed table's named draft, or e.g. "prompt-lookup").
    """

    model: str
    task: str
    prompt_tokens: int | None
    max_new_tokens: int | None
    target_precision: str
    draft_precision: str
    num_assistant_tokens: int | None
    assistant_schedule: str | None
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    target_backend: str = "torch"
    draft: str | None = None
    target_kernels: str = "stock"  # "stock" or "invariant" (harness.kernels.invariant)
    draft_vocab: int | None = None  # the draft scored only this many leading token ids
    draft_kernels: str = "stock"  # the draft's kernels ("invariant": the harness's, for speed)
    execution_provider: str | None = None  # the execution provider of an ONNX Runtime target
    engine: str = "transformers"  # what runs the decoding loop (harness.decoding.engines.REGISTRY)
    draft_tree: str | None = None  # a token tree's rank paths (``--draft_tree``); None: a chain of K
    # Identity settings of ``setup.FIELDS`` beyond the fields above (a setting added since), as
    # (column, value), only where a case's value is not the setting's default.
    more: tuple[tuple[str, Any], ...] = ()

    @property
    def draft_steps(self) -> int | None:
        """Draft forwards a round makes: K for a chain, one per level for a token tree (what a
        round's cost, K c + v, counts)."""
        if self.draft_tree:
            return trees.Tree.parse(self.draft_tree).depth
        return self.num_assistant_tokens

    @property
    def sampling(self) -> str:
        if not self.do_sample:
            return "greedy"
        out = "sample"
        if self.temperature is not None:
            out += f"-t{_num(self.temperature)}"
        if self.top_p is not None:
            out += f"-topp{_num(self.top_p)}"
        if self.top_k is not None:
            out += f"-topk{self.top_k}"
        return out

    @property
    def case_id(self) -> str:
        """Readable, stable slug, e.g. ``benchmark-p256-n64-t_fp32-d_fp32-k5-constant-greedy``."""
        parts = [_part(self.task)]
        if self.prompt_tokens is not None:
            parts.append(f"p{self.prompt_tokens}")
        if self.max_new_tokens is not None:
            parts.append(f"n{self.max_new_tokens}")
        parts.append(f"t_{_part(self.target_precision)}")
        parts.append(f"d_{_part(self.draft_precision)}")
        if self.draft_tree is None:  # a tree's shape is its own part, below
            parts.append(
                f"k{self.num_assistant_tokens}" if self.num_assistant_tokens is not None else "kdefault"
            )
        if self.assistant_schedule is not None:
            parts.append(_part(self.assistant_schedule))
        parts.append(self.sampling)
        if self.target_backend != "torch":
            parts.append(_part(self.target_backend))
        if self.execution_provider is not None:
            parts.append(_part(self.execution_provider))
        if self.engine != "transformers":
            parts.append(_part(self.engine))
        if self.target_kernels != "stock":
            parts.append(_part(self.target_kernels))
        if self.draft_vocab is not None:
            parts.append(f"dv{self.draft_vocab}")
        if self.draft_kernels != "stock":
            parts.append(f"dk_{_part(self.draft_kernels)}")
        if self.draft is not None:
            parts.append(f"draft_{_part(self.draft)}")
        if self.draft_tree is not None:
            parts.append(f"tree_{_part(self.draft_tree)}")
        parts += [f"{_part(column)}_{_part(str(value))}" for column, value in self.more]
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # Files of cases without a newer setting (a tree, ``more``) read as they always have.
        if self.draft_tree is None:
            del data["draft_tree"]
        if not self.more:
            del data["more"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseKey:
        data = {_SCHEMA_1_NAMES.get(k, k): v for k, v in data.items()}
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown case fields {sorted(unknown)}")
        more = tuple((str(column), value) for column, value in data.pop("more", ()))
        return cls(**data, more=more)


# The key's fields that are run-setting columns (all but where the case runs and a seed's named draft).
CASE_COLUMNS = tuple(
    f.name for f in fields(CaseKey) if f.name not in ("task", "prompt_tokens", "draft", "more")
)


def case_key(columns: dict[str, Any], task: str, prompt_tokens: int | None) -> CaseKey:
    """A setup's identity columns (``setup.RunSetup.columns``) as the key baseline files carry."""
    given = {c: columns.get(c) for c in CASE_COLUMNS}
    # Columns an older row lacks, or that a plain or torch setup leaves None, read as the setting's
    # default (kernels, backend, engine).
    given.update({f.column: f.default for f in setup.FIELDS if f.column in given and given[f.column] is None})
    more = tuple(
        (f.column, columns.get(f.column))
        for f in setup.FIELDS
        if f.identity
        and f.column not in CASE_COLUMNS
        and columns.get(f.column) is not None
        and columns.get(f.column) != f.default
    )
    return CaseKey(task=task, prompt_tokens=prompt_tokens, **given, more=more)


@dataclass
class BaselineRecord:
    """What a baseline file holds. ``tokens_per_s`` maps mode ("plain"/"assisted") to mean and samples."""

    case: CaseKey
    source: str  # "measured" or "seed:<file>"
    date: str | None
    machine: dict[str, Any]
    versions: dict[str, str]
    tokens_per_s: dict[str, dict[str, Any] | None]
    time_per_token_ms: dict[str, float | None]
    prefill_ms: dict[str, float | None]
    acceptance: float | None
    speedup: dict[str, Any] | None  # Estimate.to_dict() plus "samples" (per repetition or per prompt)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["case"] = self.case.to_dict()
        out["case_id"] = self.case.case_id
        out["schema"] = SCHEMA
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BaselineRecord:
        if not isinstance(data, dict):
            raise ValueError("top level is not a JSON object")
        if data.get("schema") not in (1, 2, SCHEMA):
            raise ValueError(f"schema {data.get('schema')!r}, this harness reads schemas 1 to {SCHEMA}")
        required = [f.name for f in fields(cls) if f.name != "extra"]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"missing keys {missing}")
        case = CaseKey.from_dict(data["case"])
        if data.get("case_id") != case.case_id:
            raise ValueError(f"case_id {data.get('case_id')!r} does not match its case ({case.case_id})")
        for mode, entry in data["tokens_per_s"].items():
            if entry is not None and not isinstance(entry.get("samples"), list):
                raise ValueError(f"tokens_per_s.{mode}.samples is not a list")
        kwargs = {name: data[name] for name in required}
        kwargs["case"] = case
        return cls(extra=data.get("extra", {}), **kwargs)


def rounded(x: float | None) -> float | None:
    """Round a derived number to 6 significant digits: keeps diffs readable, far below measurement noise."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return float(f"{x:.6g}")


def speedup_summary(plain: Sequence[float], assisted: Sequence[float], paired: bool) -> dict[str, Any]:
    est = speedup_ci(plain, assisted, paired=paired)
    out: dict[str, Any] = {k: (rounded(v) if k != "n" else v) for k, v in est.to_dict().items()}
    out["confidence"] = 0.95
    out["paired"] = paired
    # Per-repetition ratios are what the speedup gate compares against; unpaired runs have none.
    out["samples"] = [rounded(a / p) for p, a in zip(plain, assisted, strict=True)] if paired else []
    return out


def _tps_dict(samples: Sequence[float]) -> dict[str, Any]:
    est = mean_ci(samples)
    return {
        "mean": rounded(est.value),
        "low": rounded(est.low),
        "high": rounded(est.high),
        "samples": [float(x) for x in samples],
    }


def make_record(
    case: CaseKey,
    plain_tps: Sequence[float],
    assisted_tps: Sequence[float],
    *,
    time_per_token_ms: dict[str, float | None],
    prefill_ms: dict[str, float | None],
    acceptance: float | None,
    paired: bool = True,
    source: str = "measured",
    machine: dict[str, Any] | None = None,
    versions: dict[str, str] | None = None,
    date: str | None = None,
    extra: dict[str, Any] | None = None,
) -> BaselineRecord:
    """Build a record from interleaved repetitions (index i of both lists = repetition i when paired)."""
    if machine is None or versions is None:
        from harness.base.platforms import detect, library_versions  # only when measuring on this machine

        machine = detect().to_dict() if machine is None else machine
        versions = library_versions() if versions is None else versions
    return BaselineRecord(
        case=case,
        source=source,
        date=date or _dt.datetime.now(_dt.timezone.utc).date().isoformat(),
        machine=machine,
        versions=versions,
        tokens_per_s={"plain": _tps_dict(plain_tps), "assisted": _tps_dict(assisted_tps)},
        time_per_token_ms={k: rounded(v) for k, v in time_per_token_ms.items()},
        prefill_ms={k: rounded(v) for k, v in prefill_ms.items()},
        acceptance=rounded(acceptance),
        speedup=speedup_summary(plain_tps, assisted_tps, paired),
        extra=extra or {},
    )


def _platform_dir(root: str | os.PathLike[str], platform: str) -> Path:
    if not platform or "/" in platform or platform.startswith("."):
        raise HarnessError(f"platform name {platform!r} is not a usable folder name; use a slug like 'phx'")
    return Path(root) / platform


def storage_file(root: str | os.PathLike[str], platform: str) -> Path:
    """The platform's baselines: one pytest-benchmark saved run, ``root/<platform>/0001_baseline.json``,
    so ``--benchmark-storage root/<platform>`` reads it."""
    return _platform_dir(root, platform) / STORAGE_FILE


def arm_rounds(
    plain_tps: Sequence[float] | None,
    assisted_tps: Sequence[float] | None,
    ratios: Sequence[float] | None = None,
) -> dict[str, list[float]]:
    """The rounds of a case's pytest-benchmark entries: each arm's time per token in seconds (one
    decode each), and each interleaved round's assisted/plain time-per-token ratio (the inverse of
    that round's speedup). ``ratios`` gives the ratios where no paired tokens/s are at hand (a
    published table's speedups)."""
    out: dict[str, list[float]] = {}
    if plain_tps:
        out["plain"] = [1.0 / float(x) for x in plain_tps]
    if assisted_tps:
        out["assisted"] = [1.0 / float(x) for x in assisted_tps]
    if ratios is not None:
        out["ratio"] = [float(x) for x in ratios]
    elif plain_tps and assisted_tps and len(plain_tps) == len(assisted_tps):
        out["ratio"] = [float(p) / float(a) for p, a in zip(plain_tps, assisted_tps, strict=True)]
    return out


def round_stats(rounds: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's statistics of ``rounds`` (its own ``Stats``), with the rounds themselves."""
    acc = Stats()
    for x in rounds:
        acc.update(float(x))
    out = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in acc.as_dict().items()
    }
    out["data"] = [float(x) for x in rounds]
    out["iterations"] = 1
    return out


def entry_group(case_id: str, arm: str) -> str:
    """The pytest-benchmark group of an entry: the arms' times side by side, the ratio on its own
    (its unit is not seconds)."""
    return f"{case_id} ratio" if arm == "ratio" else case_id


def entry_info(case_id: str, arm: str) -> dict[str, Any]:
    """What identifies an entry of this suite in its ``extra_info``: the schema, the case, the arm
    and the unit of its rounds (a stored baseline's and a run's entries alike)."""
    return {"schema": SCHEMA, "case_id": case_id, "arm": arm, "unit": ARM_UNITS[arm]}


def default_names(case: CaseKey) -> dict[str, str]:
    """Entry full names for a case no test names (imported tables, records written outside pytest)."""
    return {arm: f"{case.model}::{case.case_id}[{arm}]" for arm in ARMS}


def record_entries(record: BaselineRecord, names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The pytest-benchmark entries of one case's record: an entry per arm with its rounds as data,
    the case id and arm in ``extra_info``, and the rest of the record (everything the gate reads
    besides the rounds) in ``extra_info["baseline"]`` of the case's first entry."""
    data = record.to_dict()
    for entry in data["tokens_per_s"].values():
        if entry is not None:
            entry.pop("samples", None)
    ratios = None
    if data["speedup"] is not None:
        samples = data["speedup"].pop("samples", None) or []
        ratios = [1.0 / float(s) for s in samples] if samples else None
    tps = record.tokens_per_s
    rounds = arm_rounds(
        (tps.get("plain") or {}).get("samples"), (tps.get("assisted") or {}).get("samples"), ratios
    )
    if not rounds:
        raise HarnessError(f"record of {record.case.case_id} holds no rounds to store")
    names = {**default_names(record.case), **(names or {})}
    entries = []
    for arm in sorted(rounds, key=ARMS.index):
        fullname = names[arm]
        info = entry_info(record.case.case_id, arm)
        if record.source != "measured":
            info["imported"] = f"{record.source}: a published table; its rounds are the table's examples"
        if not entries:
            info["baseline"] = data
        entries.append(
            {
                "group": entry_group(record.case.case_id, arm),
                "name": fullname.rpartition("::")[2],
                "fullname": fullname,
                "params": {"arm": arm},
                "param": arm,
                "extra_info": info,
                "options": {"timer": "perf_counter", "disable_gc": False, "min_rounds": len(rounds[arm])},
                "stats": round_stats(rounds[arm]),
            }
        )
    return entries


def _entries_record(entries: list[dict[str, Any]]) -> BaselineRecord:
    """One case's record rebuilt from its entries: the gate's samples are the entries' rounds."""
    head = [e for e in entries if "baseline" in e["extra_info"]]
    if len(head) != 1:
        raise ValueError(
            f"case {entries[0]['extra_info'].get('case_id')!r} has {len(head)} record entries, not 1"
        )
    data = json.loads(json.dumps(head[0]["extra_info"]["baseline"]))
    rounds = {e["extra_info"]["arm"]: e["stats"]["data"] for e in entries}
    for arm in ("plain", "assisted"):
        entry = data["tokens_per_s"].get(arm)
        if entry is not None:
            entry["samples"] = [1.0 / float(t) for t in rounds.get(arm, [])]
    if data["speedup"] is not None:
        data["speedup"]["samples"] = [rounded(1.0 / float(r)) for r in rounds.get("ratio", [])]
    return BaselineRecord.from_dict(data)


def read_storage(path: str | os.PathLike[str]) -> list[BaselineRecord]:
    """Every case's record in a platform's storage file, in the file's order."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        by_case: dict[str, list[dict[str, Any]]] = {}
        for entry in doc["benchmarks"]:
            info = entry["extra_info"]
            if info.get("schema") != SCHEMA:
                raise ValueError(
                    f"entry {entry.get('fullname')!r} has schema {info.get('schema')!r}; "
                    f"this suite reads {SCHEMA}"
                )
            by_case.setdefault(info["case_id"], []).append(entry)
        records = [_entries_record(entries) for entries in by_case.values()]
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise HarnessError(
            f"{path}: malformed baseline storage ({exc}); " + _REGENERATE.format(path=path)
        ) from exc
    for case_id, record in zip(by_case, records, strict=True):
        if record.case.case_id != case_id:
            raise HarnessError(
                f"{path}: entries of {case_id} hold a record of {record.case.case_id}; "
                + _REGENERATE.format(path=path)
            )
    return records


def _malformed(path: Path, exc: Exception) -> HarnessError:
    return HarnessError(f"{path}: malformed baseline storage ({exc}); " + _REGENERATE.format(path=path))


def _read_doc(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc.get("benchmarks"), list):
            raise ValueError("no benchmarks list")
        return doc
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise HarnessError(
            f"{path}: malformed baseline storage ({exc}); " + _REGENERATE.format(path=path)
        ) from exc


def save_baseline(
    root: str | os.PathLike[str],
    platform: str,
    case: CaseKey,
    record: BaselineRecord | dict[str, Any],
    *,
    names: dict[str, str] | None = None,
    machine_info: dict[str, Any] | None = None,
    commit_info: dict[str, Any] | None = None,
    saved_at: str | None = None,
) -> Path:
    """Put ``record`` into the platform's storage file in place of the case's earlier entries and
    of its tests' earlier entries (the other tests' entries kept), atomically: the old file stays
    intact unless the new one was completely written. ``names`` gives each arm's entry the full
    name of its test, which is what ``--benchmark-compare`` matches; ``machine_info``,
    ``commit_info`` and ``saved_at`` are pytest-benchmark's (default: the record's machine, the
    checkout's commit, now)."""
    if isinstance(record, dict):
        try:
            record = BaselineRecord.from_dict(record)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise HarnessError(f"not a baseline record ({exc})") from exc
    if record.case != case:
        raise HarnessError(
            f"record is for case {record.case.case_id}, not {case.case_id}; pass the matching case"
        )
    path = storage_file(root, platform)
    doc = _read_doc(path) if path.exists() else {"benchmarks": []}
    entries = record_entries(record, names)
    # A test's earlier entry goes too when its case changed (the test now measures a new
    # configuration): pytest-benchmark's compare reads one entry per test name, the last stored.
    replaced = {e["fullname"] for e in entries}
    kept = [
        e
        for e in doc["benchmarks"]
        if e.get("extra_info", {}).get("case_id") != case.case_id and e.get("fullname") not in replaced
    ]
    benchmarks = sorted(kept + entries, key=lambda e: (e["group"], e["fullname"]))
    if machine_info is None:
        machine_info = dict(record.machine)
    if commit_info is None:
        commit_info = get_commit_info("assisted-generation")
    out = {
        "machine_info": {**machine_info, "platform": platform, "source": record.source},
        "commit_info": commit_info,
        "benchmarks": benchmarks,
        "datetime": saved_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "version": pytest_benchmark.__version__,
    }
    # allow_nan=False: a value that cannot be stored fails here, before the old file is touched.
    text = json.dumps(out, sort_keys=True, indent=2, allow_nan=False) + "\n"
    files.atomic_write(path, text.encode("utf-8"))
    return path


def check_compare(storage: str, compare: str | bool) -> list[Path]:
    """The saved runs ``--benchmark-compare[=compare]`` will read from ``storage`` (a
    ``--benchmark-storage`` value), checked: the folder exists, the id matches a run, every file is
    a pytest-benchmark saved run, and this suite's entries in it are of this schema."""
    if "://" in storage and not storage.startswith("file://"):
        return []  # another storage service: pytest-benchmark reads it
    folder = Path(storage.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise HarnessError(
            f"--benchmark-storage {storage}: no such folder; the committed baselines are "
            "baselines/<platform> (one per platform), your own history is wherever "
            "--benchmark-autosave wrote it"
        )
    # pytest-benchmark's own lookup: the newest saved run, or the runs whose names match the id.
    found = FileStorage(folder, logger=None, default_machine_id=get_machine_id())
    runs = found.query("[0-9][0-9][0-9][0-9]_") if compare is True else found.query(str(compare))
    runs = runs[-1:] if compare is True else runs
    if not runs:
        saved = ", ".join(p.name for p in found.query("[0-9][0-9][0-9][0-9]_")) or "none"
        what = "no saved run" if compare is True else f"no saved run matches {compare!r}"
        raise HarnessError(f"--benchmark-compare: {what} in {folder} (saved runs there: {saved})")
    for path in runs:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            entries = doc["benchmarks"]
            schemas = {e["extra_info"].get("schema") for e in entries if "case_id" in e.get("extra_info", {})}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise HarnessError(
                f"--benchmark-compare: {path} is not a pytest-benchmark saved run ({exc!r}); restore it "
                "(`git checkout -- FILE` for a committed baseline) or compare against another"
            ) from exc
        if schemas - {SCHEMA}:
            raise HarnessError(
                f"--benchmark-compare: {path} holds baseline entries of schema {sorted(schemas - {SCHEMA})}; "
                f"this suite writes schema {SCHEMA}: re-record them with --update-baselines"
            )
    return [Path(p) for p in runs]


def platform_records(root: str | os.PathLike[str], platform: str) -> list[BaselineRecord]:
    """Every case's record stored for ``platform`` ([] when it has none)."""
    path = storage_file(root, platform)
    return read_storage(path) if path.is_file() else []


def load_baseline(root: str | os.PathLike[str], platform: str, case: CaseKey) -> BaselineRecord | None:
    """The stored record for this case, or None if there is none yet."""
    path = storage_file(root, platform)
    for record in platform_records(root, platform):
        if record.case.case_id == case.case_id:
            if record.case != case:
                raise HarnessError(
                    f"{path}: holds case {record.case.to_dict()}, expected {case.to_dict()}; "
                    + _REGENERATE.format(path=path)
                )
            return record
    return None


def baseline_platform(root: str | os.PathLike[str], platform: str, case: CaseKey) -> str:
    """The platform whose baseline of ``case`` a run on ``platform`` is held to: its own when it has
    one, else the platform with a baseline of this case whose slug shares most parts with it (a
    host kind nobody measured yet is still gated, by the host-independent speedup adjusted for its
    own forward costs). MissingBaselineError when no platform holds this case."""
    if load_baseline(root, platform, case) is not None:
        return platform
    mine = set(platform.split("-"))
    holders = [
        p.name
        for p in sorted(Path(root).iterdir() if Path(root).is_dir() else ())
        if p.is_dir() and p.name != platform and load_baseline(root, p.name, case) is not None
    ]
    if not holders:
        raise MissingBaselineError(
            f"no baseline for {case.case_id} on platform {platform!r} nor on any other platform under "
            f"{root}; run with --update-baselines to record one"
        )
    return max(holders, key=lambda name: (len(mine & set(name.split("-"))), name))


def list_baselines(root: str | os.PathLike[str], platform: str | None = None) -> list[Path]:
    """Every platform's storage file under root (or one platform's), sorted for stable output."""
    base = Path(root)
    if not base.is_dir():
        return []
    folders = [base / platform] if platform is not None else sorted(p for p in base.iterdir() if p.is_dir())
    return [f / STORAGE_FILE for f in folders if (f / STORAGE_FILE).is_file()]


def _baseline_samples(entry: dict[str, Any] | None, key: str) -> list[float] | float | None:
    if entry is None:
        return None
    samples = entry.get("samples") or []
    if len(samples) >= 2:
        return [float(x) for x in samples]
    value = entry.get(key)
    return None if value is None else float(value)


# How far a host's forward costs may move the expected speedup and still be judged: two VMs of one
# slug differed by x0.89 here; a factor far outside this says the run's c or v was measured on a busy
# machine, not on a different host.
ADJUSTMENT_RANGE = (0.75, 1.33)


@dataclass(frozen=True)
class HostAdjustment:
    """How much this host's forward costs alone should move the baseline's speedup.

    The speedup is not a property of the code alone: it depends on the draft/target cost ratio ``c`` and
    the verify cost ratio ``v``, and those depend on the host. Seen here: the same commit on two VMs
    that both report "AMD EPYC, 2 cores, AVX-512" ran the registered case at 1.15x (c 0.41) and 1.04x
    (c 0.47, plain 19% faster), while the speedup over the cost model's prediction stayed at 1.20-1.21x.
    So the gate expects ``baseline speedup x factor``, where ``factor`` is Leviathan's prediction with
    this run's ``c`` and ``v`` over the same prediction with the baseline's: the baseline's round cost
    over this run's (``round_cost``), in plain target steps, since the acceptance terms cancel. An
    acceptance drop or time lost outside the forwards still fails the gate; a forward that got slower
    moves c or v and is absorbed here, so it is watched by the tokens/s numbers (reported next to the
    gate) and by ``python -m harness.forwards`` on one host.
    """

    factor: float
    c: tuple[float, float]  # (baseline, this run); NaN where the engine books drafting inside v
    v: tuple[float, float]

    def describe(self) -> str:
        if math.isnan(self.c[0]):
            return (
                f"baseline adjusted x{self.factor:.3f} for this host's forward costs (a round "
                f"{self.v[0]:.3g} -> {self.v[1]:.3g} plain steps, its drafting included)"
            )
        return (
            f"baseline adjusted x{self.factor:.3f} for this host's forward costs "
            f"(c {self.c[0]:.3g} -> {self.c[1]:.3g}, v {self.v[0]:.3g} -> {self.v[1]:.3g})"
        )


def _cost(value: Any) -> float:
    """A stored or measured cost ratio; NaN where it was not measured (stored as null)."""
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def host_adjustment(record: BaselineRecord, k: int, c: float, v: float) -> HostAdjustment | None:
    """The adjustment for a run with cost ratios ``c`` and ``v``; None when the baseline lacks its own
    (records imported from published tables, or written before they were kept), or when the run and
    the baseline did not book their rounds alike (one measured c, the other did not)."""
    extra = record.extra or {}
    base_c, base_v, c, v = _cost(extra.get("c")), _cost(extra.get("v")), _cost(c), _cost(v)
    if math.isnan(base_c) != math.isnan(c):
        return None
    then, now = round_cost(k, base_c, base_v), round_cost(k, c, v)
    if then is None or now is None:
        return None
    return HostAdjustment(factor=then / now, c=(base_c, c), v=(base_v, v))


def pair_adjustments(
    record: BaselineRecord, k: int, costs: Sequence[tuple[float, float]]
) -> list[HostAdjustment] | None:
    """One adjustment per interleaved pair, from that pair's own ``(c, v)``; None when any cannot be made.

    Per pair, because a host's phase moves the arms apart: seen here, a minute in which plain decoding
    ran 17% faster (memory-bound, its bandwidth freed) while the compute-bound verification did not,
    took those pairs' speedups from 1.35x to 1.17x. The same pairs' v rose from 1.24 to 1.44, so each
    pair's speedup over its own prediction held within 1%, where the pooled adjustment left the spread
    in and failed an unchanged build."""
    adjustments = [host_adjustment(record, k, c, v) for c, v in costs]
    if not adjustments or None in adjustments:
        return None
    return [a for a in adjustments if a is not None]


def _baseline_at_own_costs(
    record: BaselineRecord, samples: list[float] | float, k: int
) -> list[float] | float:
    """The baseline's speedup samples, each brought to the record's pooled ``c`` and ``v`` by its own
    pair's costs where the record kept them (the current run's pairs are brought there the same way)."""
    kept = (record.extra or {}).get("pair_costs")
    if not isinstance(samples, list) or not kept or len(kept) != len(samples):
        return samples
    own = pair_adjustments(record, k, [(_cost(c), _cost(v)) for c, v in kept])
    return samples if own is None else [x / a.factor for x, a in zip(samples, own, strict=True)]


def acceptance_gate(
    record: BaselineRecord | None, counts: Sequence[Sequence[int]], rounds: int
) -> GateResult | None:
    """Drafted/accepted per draft position, required equal to the baseline's (per round), or None
    when the baseline holds none. No timing is involved: under greedy decoding on deterministic
    kernels any difference is a change in drafting or verification."""
    stored = (record.extra or {}).get("acceptance_by_position") if record is not None else None
    stored_rounds = (record.extra or {}).get("rounds") if record is not None else None
    if not stored or not stored_rounds or rounds <= 0:
        return None
    per_round = [[d / rounds, a / rounds] for d, a in counts]
    expected = [[d / stored_rounds, a / stored_rounds] for d, a in stored]
    name = f"{record.case.case_id} acceptance by position"
    if per_round == expected:
        return GateResult(
            "pass", 1.0, 1.0, (1.0, 1.0), f"{name}: equal to the baseline's {expected}", "exact"
        )
    return GateResult(
        "regression",
        math.nan,
        0.0,
        (math.nan, math.nan),
        f"{name}: REGRESSION: drafted/accepted per position per round {per_round} differ from the "
        f"baseline's {expected}; greedy decoding on deterministic kernels repeats these exactly, so drafting "
        "or verification changed (rerun with --update-baselines if that was intended)",
        "exact",
    )


def compare_to_baseline(
    root: str | os.PathLike[str],
    platform: str,
    case: CaseKey,
    plain_tps: Sequence[float],
    assisted_tps: Sequence[float],
    *,
    forward_costs: Sequence[tuple[float, float]] | None = None,
    cpu_id: str | None = None,
    margin: float = DEFAULT_MARGIN,
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, GateResult]:
    """Gate interleaved repetitions against the stored baseline.

    Returns up to four results. "speedup": per-repetition assisted/plain ratios, which cancel the host's
    overall speed; with ``forward_costs`` (each interleaved pair's ``c`` and ``v``) each pair's ratio
    is first adjusted for how its forward costs move the speedup (``pair_adjustments``), and
    "speedup_unadjusted" keeps the plain comparison. "assisted_tokens_per_s" and "plain_tokens_per_s"
    catch a slower target, which can leave the speedup unchanged; they read "not comparable" when
    ``cpu_id`` (this host's, ``platforms.detect().cpu_id``) names another CPU family or model than the
    baseline's. A gate is skipped when the baseline lacks that number.
    """
    record = load_baseline(root, platform, case)
    path = storage_file(root, platform)
    if record is None:
        raise MissingBaselineError(
            f"no baseline for {case.case_id} on platform {platform!r} (expected {path}); "
            "run with --update-baselines to record one"
        )
    if len(plain_tps) != len(assisted_tps):
        raise HarnessError(
            f"got {len(plain_tps)} plain and {len(assisted_tps)} assisted repetitions; the speedup gate "
            "needs them interleaved one-for-one (same --repeats for both modes)"
        )
    if forward_costs is not None and len(forward_costs) != len(plain_tps):
        raise HarnessError(
            f"got forward costs of {len(forward_costs)} pairs for {len(plain_tps)} repetitions; "
            "the host adjustment needs one (c, v) per interleaved pair"
        )
    results: dict[str, GateResult] = {}
    opts = {"margin": margin, "alpha": alpha}
    base_speedup = _baseline_samples(record.speedup, "value")
    if base_speedup is not None:
        k = case.draft_steps
        ratios = [a / p for p, a in zip(plain_tps, assisted_tps, strict=True)]
        metric = f"{case.case_id} speedup"
        pairs = pair_adjustments(record, k, forward_costs) if forward_costs is not None else None
        if pairs is None:
            results["speedup"] = gate(ratios, base_speedup, metric=metric, **opts)
        else:
            summary = HostAdjustment(
                factor=statistics.median(a.factor for a in pairs),
                c=(pairs[0].c[0], statistics.median(a.c[1] for a in pairs)),
                v=(pairs[0].v[0], statistics.median(a.v[1] for a in pairs)),
            )
            adjusted = gate(
                [r / a.factor for r, a in zip(ratios, pairs, strict=True)],
                _baseline_at_own_costs(record, base_speedup, k),
                metric=f"{metric} ({summary.describe()}; median over pairs, each adjusted by its own)",
                **opts,
            )
            plain = gate(ratios, base_speedup, metric=metric, gated=False, **opts)
            lo, hi = ADJUSTMENT_RANGE
            if not lo <= summary.factor <= hi:
                adjusted = adjusted.as_inconclusive(
                    f"this host's forward costs moved the expected speedup x{summary.factor:.2f}, outside "
                    f"[{lo}, {hi}]: a loaded or very different host; rerun on an idle machine"
                )
            elif adjusted.status == "improvement" and plain.failed:
                adjusted = adjusted.as_inconclusive(
                    "the adjustment turned a significant drop into an improvement; rerun on an idle machine"
                )
            results["speedup"] = adjusted
            results["speedup_unadjusted"] = plain
    other_cpu = cpu_kind(cpu_id) != cpu_kind(record.machine.get("cpu_id"))
    for mode, current in (("assisted", assisted_tps), ("plain", plain_tps)):
        base = _baseline_samples(record.tokens_per_s.get(mode), "mean")
        if base is not None:
            metric = f"{case.case_id} {mode} tokens/s"
            result = gate(current, base, metric=metric, gated=False, **opts)
            if cpu_id is not None and other_cpu:
                result = result.as_not_comparable(
                    metric,
                    f"the baseline was measured on a {record.machine.get('cpu_id') or 'unrecorded'} CPU "
                    f"and this host's is {cpu_id}; absolute tokens/s compare within one CPU kind only",
                )
            results[f"{mode}_tokens_per_s"] = result
    return results


def cpu_kind(cpu_id: str | None) -> str | None:
    """A CPU id's family and model ("family 25 model 17"): its stepping does not move a kernel's speed."""
    if not cpu_id:
        return None
    return re.sub(r"\s*stepping \S+", "", cpu_id).strip()
