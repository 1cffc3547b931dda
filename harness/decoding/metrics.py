"""A deployment's own speculative-decoding counters, read off its Prometheus ``/metrics``.

vLLM exports ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
``..._num_accepted_tokens_per_pos{position}``; llama.cpp's server (``--metrics``) the same names
under ``llamacpp:``. Read before and after a request, their difference is that request's drafting as
the deployment booked it, per position included, which a response's own fields (llama.cpp's
``timings``) do not give. The text is parsed by ``prometheus_client``'s parser.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from harness.theory import analysis

# Counter names without their exporter's prefix (``PREFIXES``) and the ``_total`` suffix.
DRAFTS = "spec_decode_num_drafts"
DRAFT_TOKENS = "spec_decode_num_draft_tokens"
ACCEPTED = "spec_decode_num_accepted_tokens"
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"
PREFIXES = ("vllm:", "llamacpp:")
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Counters:
    """The speculative counters' values at one reading, summed over the exporter's other labels
    (vLLM labels each engine and model)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...] = ()

    def since(self, before: Counters) -> Counters:
        """What was counted between ``before`` and this reading."""
        width = max(len(self.per_position), len(before.per_position))
        now, then = (_padded(c.per_position, width) for c in (self, before))
        return Counters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(now, then, strict=True)),
        )

    def position_counts(self, k: int) -> list[list[int]] | None:
        """[[drafted, accepted], ...] per draft position (``analysis.positions_of_counters``), or None
        where the exporter counts no positions."""
        if not self.per_position:
            return None
        accepted = [int(round(a)) for a in self.per_position]
        drafts, draft_tokens = int(round(self.drafts)), int(round(self.draft_tokens))
        return analysis.positions_of_counters(drafts, draft_tokens, accepted, k)


def _padded(values: tuple[float, ...], width: int) -> list[float]:
    return [*values, *([0.0] * (width - len(values)))]


def parse(text: str) -> Counters | None:
    """The speculative counters in a ``/metrics`` page; None where it has none (a deployment that does
    not speculate, or exports under other names)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    positions: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            prefix = next((p for p in PREFIXES if name.startswith(p)), None)
            if prefix is None or not name.endswith("_total"):
                continue
            base = name[len(prefix) : -len("_total")]
            if base == PER_POSITION and "position" in sample.labels:
                position = int(sample.labels["position"])
                positions[position] = positions.get(position, 0.0) + float(sample.value)
            elif base in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
                totals[base] = totals.get(base, 0.0) + float(sample.value)
    if DRAFTS not in totals or ACCEPTED not in totals:
        return None
    width = max(positions) + 1 if positions else 0
    return Counters(
        totals[DRAFTS],
        totals.get(DRAFT_TOKENS, 0.0),
        totals[ACCEPTED],
        tuple(positions.get(i, 0.0) for i in range(width)),
    )


class Reader:
    """A deployment's ``/metrics`` at ``url``: ``read`` gives its counters, or None with ``missing``
    saying why (no such page, or a page without speculative counters), found out on the first read."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.headers = headers or {}
        self.missing: str | None = None

    def read(self) -> Counters | None:
        if self.missing is not None:
            return None
        request = urllib.request.Request(self.url, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                text = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            self.missing = f"{self.url} answered HTTP {exc.code}"
            return None
        except (urllib.error.URLError, OSError) as exc:
            self.missing = f"{self.url} could not be reached ({getattr(exc, 'reason', exc)})"
            return None
        try:
            counters = parse(text)
        except ValueError as exc:
            self.missing = f"{self.url} is not a Prometheus page ({exc})"
            return None
        if counters is None:
            self.missing = (
                f"{self.url} has no speculative-decoding counters ({', '.join(p + DRAFTS for p in PREFIXES)})"
            )
        return counters


def request_positions(
    before: Counters | None, after: Counters | None, k: int, accepted: int
) -> list[list[int]] | None:
    """One request's drafted and accepted tokens per position, from the readings around it; None
    where either reading is missing or the counters moved by other than the request's own accepted
    tokens (another client's request in between)."""
    if before is None or after is None:
        return None
    booked = after.since(before)
    if int(round(booked.accepted)) != accepted:
        return None
    return booked.position_counts(k)
