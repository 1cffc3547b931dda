"""Acceptance references: what a configuration's drafting achieves on a real prompt set, held on
every host kind.

A speedup depends on the host; acceptance does not, beyond the few near ties a host's rounding
moves. So each configuration (``baselines.CaseKey``, task ``acceptance``) keeps one reference for
all platforms, in ``baselines/acceptance.json``: per prompt (its label and text digest), the tokens
it emitted, the target forwards that emitted them and the drafted/accepted counts per draft
position. A run is held to the reference over the prompts both ran, as vLLM holds acceptance length
per position: its acceptance length (tokens per verification) at least ``LENGTH_FLOOR`` of the
reference's, and each position's acceptance rate at least its floor (``floors``). Written sorted
and indented, atomically, under a file lock (parallel workers may record at once).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.base import files
from harness.base.errors import HarnessError
from harness.theory import analysis

SCHEMA = 1
FILE_NAME = "acceptance.json"
# A run's acceptance length may fall this far below the reference's: a host's rounding moves a few
# near ties (a round or two in a thousand tokens), not the mean. vLLM and TensorRT-LLM hold theirs
# at 95% too.
LENGTH_FLOOR = 0.95
# A position's floor: its reference rate less this many standard errors of a rate over as many
# drafted tokens, and never closer than POSITION_SLACK (later positions are drafted less often, so
# their rates move more with a flipped round).
POSITION_SIGMAS = 3.0
POSITION_SLACK = 0.05
RECORD = "record it with --update-baselines (on any host kind: the reference holds on all)"


@dataclass(frozen=True)
class PromptAcceptance:
    """One prompt's drafting in a run: what acceptance is computed from."""

    label: str
    sha: str  # the prompt text's digest: a changed prompt is another prompt
    new_tokens: int
    target_forwards: int
    # [drafted, accepted] per draft position; None where the engine's books give no positions.
    by_position: tuple[tuple[int, int], ...] | None = None
    # The output's digest: not held (a host may flip a near tie), but it shows whether two runs that
    # accepted differently decoded the same tokens (a dead draft changes acceptance, not the output).
    output_sha: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_sha": self.output_sha,
            "sha": self.sha,
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "by_position": [list(c) for c in self.by_position] if self.by_position is not None else None,
        }

    @classmethod
    def from_dict(cls, label: str, data: dict[str, Any]) -> PromptAcceptance:
        by_position = data.get("by_position")
        return cls(
            label,
            str(data["sha"]),
            int(data["new_tokens"]),
            int(data["target_forwards"]),
            tuple((int(d), int(a)) for d, a in by_position) if by_position is not None else None,
            str(data.get("output_sha", "")),
        )


@dataclass(frozen=True)
class Summary:
    """Acceptance over a set of prompts: tokens per verification, and per draft position the rate
    and the drafted tokens it is over (empty where positions were not counted)."""

    prompts: int
    acceptance_length: float | None
    rates: tuple[float, ...] = ()
    drafted: tuple[int, ...] = ()

    def floors(self) -> tuple[float, ...]:
        """Each position's floor (``POSITION_SIGMAS``, ``POSITION_SLACK``)."""
        out = []
        for rate, n in zip(self.rates, self.drafted, strict=True):
            slack = max(POSITION_SLACK, POSITION_SIGMAS * math.sqrt(rate * (1 - rate) / n)) if n else 1.0
            out.append(max(0.0, rate - slack))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "acceptance_length": _round(self.acceptance_length),
            "rate_by_position": [_round(r) for r in self.rates],
            "floor_by_position": [_round(f) for f in self.floors()],
            "drafted_by_position": list(self.drafted),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def summarize(prompts: Sequence[PromptAcceptance]) -> Summary:
    """Acceptance over ``prompts``: tokens per verification (``analysis.acceptance_length``) over
    their summed counts, and per-position rates where every prompt counted positions (else tokens
    per target forward, and no rates)."""
    new_tokens = sum(p.new_tokens for p in prompts)
    forwards = sum(p.target_forwards for p in prompts)
    if not prompts or any(p.by_position is None for p in prompts):
        return Summary(len(prompts), analysis.acceptance_length(None, new_tokens, forwards))
    width = max(len(p.by_position or ()) for p in prompts)
    drafted, accepted = [0] * width, [0] * width
    for p in prompts:
        for i, (d, a) in enumerate(p.by_position or ()):
            drafted[i] += d
            accepted[i] += a
    counts = list(zip(drafted, accepted, strict=True))
    length = analysis.acceptance_length(counts, new_tokens, forwards)
    rates = tuple(a / d if d else 0.0 for d, a in counts)
    return Summary(len(prompts), length, rates, tuple(drafted))


@dataclass(frozen=True)
class Reference:
    """A configuration's stored acceptance: its prompts' drafting, where and with what it was recorded."""

    key: str  # "<pair>/<case id>"
    case: dict[str, Any]
    prompts: tuple[PromptAcceptance, ...]
    recorded_on: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "recorded_on": self.recorded_on,
            "versions": self.versions,
            "summary": summarize(self.prompts).to_dict(),
            "prompts": {p.label: p.to_dict() for p in self.prompts},
        }

    @classmethod
    def from_dict(cls, key: str, data: dict[str, Any]) -> Reference:
        prompts = tuple(
            PromptAcceptance.from_dict(label, p) for label, p in (data.get("prompts") or {}).items()
        )
        return cls(
            key,
            dict(data.get("case") or {}),
            prompts,
            str(data.get("recorded_on", "")),
            data.get("versions") or {},
        )


def reference_key(pair: str, case_id: str) -> str:
    return f"{pair}/{case_id}"


def path_of(root: str | os.PathLike[str]) -> Path:
    return Path(root) / FILE_NAME


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"schema": SCHEMA, "references": {}}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"{path} is not a readable acceptance reference file ({exc}): restore it with "
            f"`git checkout -- {path}`, or {RECORD}"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != SCHEMA
        or not isinstance(doc.get("references"), dict)
    ):
        raise HarnessError(
            f"{path} is not schema {SCHEMA} of the acceptance references: restore the committed copy, "
            f"or {RECORD}"
        )
    return doc


def load(root: str | os.PathLike[str], key: str) -> Reference | None:
    """The stored reference of ``key``, or None when none is stored."""
    data = _read(path_of(root))["references"].get(key)
    return Reference.from_dict(key, data) if data is not None else None


def load_all(root: str | os.PathLike[str]) -> list[Reference]:
    """Every stored reference, by key."""
    stored = _read(path_of(root))["references"]
    return [Reference.from_dict(key, data) for key, data in sorted(stored.items())]


def save(root: str | os.PathLike[str], reference: Reference) -> Path:
    """Store ``reference`` (replacing the key's), leaving every other reference as it was."""
    from filelock import FileLock

    path = path_of(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        doc = _read(path)
        doc["references"][reference.key] = reference.to_dict()
        doc["references"] = dict(sorted(doc["references"].items()))
        files.atomic_write(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    Path(str(path) + ".lock").unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class Verdict:
    """A run held to its reference over the prompts both ran."""

    key: str
    problems: tuple[str, ...]
    measured: Summary
    reference: Summary | None

    @property
    def passed(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        def al(s: Summary | None) -> str:
            return "n/a" if s is None or s.acceptance_length is None else f"{s.acceptance_length:.3f}"

        rates = " / ".join(f"{r:.2f}" for r in self.measured.rates) or "not counted"
        held = f", reference {al(self.reference)}" if self.reference is not None else ""
        return (
            f"{self.key}: acceptance length {al(self.measured)}{held} over {self.measured.prompts} prompts; "
            f"per position {rates}"
        )


def check(reference: Reference | None, measured: Sequence[PromptAcceptance], key: str, root: Path) -> Verdict:
    """``measured`` held to ``reference`` (``LENGTH_FLOOR``, ``Summary.floors``) over the prompts both
    ran; a missing reference, or a prompt it does not hold, is a failure naming how to record one."""
    ran = summarize(measured)
    if reference is None:
        return Verdict(key, (f"no acceptance reference for {key} in {path_of(root)}: {RECORD}",), ran, None)
    stored = {p.label: p for p in reference.prompts}
    unknown = [p.label for p in measured if p.label not in stored or stored[p.label].sha != p.sha]
    if unknown:
        problem = (
            f"{key}: the reference holds no record of {len(unknown)} prompt(s) run ({', '.join(unknown[:3])}"
            f"{', ...' if len(unknown) > 3 else ''}; added, or their text changed): {RECORD}"
        )
        return Verdict(key, (problem,), ran, None)
    held = summarize([stored[p.label] for p in measured])
    problems = []
    if held.acceptance_length is not None:
        floor = LENGTH_FLOOR * held.acceptance_length
        if ran.acceptance_length is None or ran.acceptance_length < floor:
            got = "nothing verified" if ran.acceptance_length is None else f"{ran.acceptance_length:.3f}"
            problems.append(
                f"{key}: REGRESSION: acceptance length {got} < {floor:.3f} ({LENGTH_FLOOR:.0%} of the "
                f"reference's {held.acceptance_length:.3f}, recorded on "
                f"{reference.recorded_on or 'an unnamed host'})"
            )
    if held.rates and not ran.rates:
        problems.append(f"{key}: the reference counts acceptance per position; this run counted none")
    for i, (rate, floor) in enumerate(zip(ran.rates, held.floors(), strict=False)):
        if rate < floor:
            problems.append(
                f"{key}: REGRESSION: position {i + 1} accepted {rate:.3f} < its floor {floor:.3f} "
                f"(reference {held.rates[i]:.3f} over {held.drafted[i]} drafted)"
            )
    return Verdict(key, tuple(problems), ran, held)
