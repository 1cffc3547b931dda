"""Is assisted output the target's own output? One helper every equivalence test calls.

Shaped after vLLM's ``run_equality_correctness_test``: a test names a pair, a draft strategy and
settings, and ``check_case`` runs plain and assisted decoding, compares token ids, and explains any
divergence (position, and the target's top-2 logit gap there, so a near-tied argmax flipped by
batched low-precision arithmetic can be told from a real bug).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tabulate import tabulate
from transformers import PreTrainedModel

from harness.base import platforms
from harness.decoding import engines, strategies
from harness.decoding.generation import generate
from harness.pairs.models import LoadedPair
from harness.settings import results
from harness.settings.setup import GenerationSettings
from harness.theory.analysis import first_divergence
from harness.theory.timing import Measurement

STRATEGIES = tuple(strategies.STRATEGIES)


def tolerance_for(pair: LoadedPair) -> float:
    """How far apart the target's top two logits may be for a flip to count as a near tie (its
    engine's word)."""
    return engines.engine_class(pair.target_setup.engine).near_tie_tolerance(pair.target_setup)


def top2_gap(model: PreTrainedModel, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit for the token after ``ids`` (one full forward)."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def eos_token_inside(plain_ids: list[int], start: int = 3) -> int | None:
    """A token that first appears mid-output: as EOS it ends decoding inside the budget."""
    for i in range(max(start, len(plain_ids) // 3), len(plain_ids) - 1):
        if plain_ids[i] not in plain_ids[:i]:
            return plain_ids[i]
    return None


@dataclass
class CaseResult:
    prompt_ids: list[int]
    plain: Measurement
    assisted: Measurement
    first_divergence: int | None  # index into the new tokens, None when identical
    gap: float | None  # target's top-2 logit gap at the divergence
    tolerance: float
    vocab_size: int = 0
    # Whether the gap comes from plain decoding's own computation replayed step for step (then the
    # plain token must lead: a negative gap means plain decoding did not take its own top token, a
    # fault) or from a replay of the prefix as one prompt (a batched prefill, whose rounding can put
    # either token of a near tie ahead: then only its size counts).
    exact_judge: bool = True

    @property
    def identical(self) -> bool:
        return self.first_divergence is None

    @property
    def near_tie(self) -> bool:
        if self.gap is None or abs(self.gap) > self.tolerance:
            return False
        return self.gap >= 0 or not self.exact_judge

    @property
    def acceptable(self) -> bool:
        return self.identical or self.near_tie

    def explain(self) -> str:
        if self.identical:
            return "identical"
        i = self.first_divergence
        return (
            f"diverged at new token {i}: plain {self.plain.output_ids[i : i + 5]} vs assisted "
            f"{self.assisted.output_ids[i : i + 5]}; target top-2 gap there {self.gap:.4g} "
            f"(near-tie tolerance {self.tolerance:g}); lengths {len(self.plain.output_ids)} vs "
            f"{len(self.assisted.output_ids)}"
        )


def check_case(
    pair: LoadedPair,
    prompt_ids: list[int],
    settings: GenerationSettings,
    *,
    plain: Measurement | None = None,
) -> CaseResult:
    """Decode plainly and with assistance under the same settings and compare token ids."""
    if settings.mode == "plain":
        raise ValueError(
            "check_case compares an assisted mode against plain; give mode assisted or prompt_lookup"
        )
    plain = plain or generate(pair, prompt_ids, dataclasses.replace(settings, mode="plain"))
    assisted = generate(pair, prompt_ids, settings)
    i = first_divergence(plain.output_ids, assisted.output_ids)
    gap = None
    if i is not None and pair.engine is not None:
        # The engine's own judgement: the plain token's lead over the other's in its logits.
        gap = pair.engine.gap(prompt_ids, plain.output_ids, assisted.output_ids)
    if i is not None and gap is None and pair.target is not None:
        gap = top2_gap(pair.target, list(prompt_ids) + plain.output_ids[:i])
    tolerance = tolerance_for(pair)
    vocab_size = int(pair.target.config.vocab_size) if pair.target is not None else len(pair.tokenizer)
    exact = pair.engine is None or pair.engine.exact_judge
    return CaseResult(list(prompt_ids), plain, assisted, i, gap, tolerance, vocab_size, exact)


@dataclass
class EqualityRuns:
    """The one helper every greedy equivalence test calls (``case``), with what a test session
    shares: each plain output computed once (it depends on neither K nor the draft), and only the
    latest strategy's draft kept (a real 1.5B target's "self" draft is a 7 GB copy; several at once
    would not fit beside the target in 24 GB)."""

    plain_outputs: dict = field(default_factory=dict)
    drafts: dict = field(default_factory=dict)

    def plain(self, pair: LoadedPair, ids: list[int], s: GenerationSettings) -> Measurement:
        t = pair.target_setup
        target = (pair.spec.name, t.engine, t.backend, t.precision, t.kernels)
        key = (*target, tuple(ids), s.max_new_tokens, s.eos_token_id, s.ignore_eos)
        if key not in self.plain_outputs:
            self.plain_outputs[key] = generate(pair, ids, dataclasses.replace(s, mode="plain"))
        return self.plain_outputs[key]

    def draft(self, pair: LoadedPair, strategy: strategies.Strategy) -> LoadedPair:
        key = (id(pair), strategy.name)
        if key not in self.drafts:
            self.drafts.clear()
            self.drafts[key] = strategy.draft(pair)
        return self.drafts[key]

    def case(
        self,
        pair: LoadedPair,
        text: str,
        strategy: str | strategies.Strategy,
        s: GenerationSettings,
        *,
        eos_inside: bool = False,
        max_prompt_tokens: int | None = None,
    ) -> CaseResult:
        """Plain vs assisted on ``text`` under ``s`` with ``strategy``'s draft; with ``eos_inside``,
        a token of the plain output's middle serves as EOS, so decoding ends inside the budget."""
        strategy = strategies.get(strategy) if isinstance(strategy, str) else strategy
        ids = list(pair.tokenizer(text)["input_ids"])[:max_prompt_tokens]
        whole = dataclasses.replace(s, ignore_eos=True)
        # The whole-budget plain run is needed below anyway (as the reference, or to place an EOS),
        # so a strategy that shapes its prompt from it (prompt lookup) costs no extra decoding.
        ids = strategy.prompt(ids, self.plain(pair, ids, whole).output_ids)
        if eos_inside:
            eos = eos_token_inside(self.plain(pair, ids, whole).output_ids)
            if eos is None:
                raise ValueError("no token to serve as EOS inside the budget; lengthen the budget")
            s = dataclasses.replace(s, eos_token_id=eos)
        else:
            s = whole
        plain = self.plain(pair, ids, s)
        stopped = plain.output_ids[-1] == s.eos_token_id and len(plain.output_ids) < s.max_new_tokens
        if eos_inside and not stopped:
            raise ValueError(f"plain decoding did not stop at the chosen EOS {s.eos_token_id}")
        return check_case(self.draft(pair, strategy), ids, s, plain=plain)


def acceptance_problems(
    cases: list[CaseResult], strategy: str | strategies.Strategy, *, eos: bool = False
) -> list[str]:
    """What is wrong with a test's cases (empty: nothing): an output that is not the target's own
    (beyond a near tie where the kernels allow one), nothing drafted at all (the case would pass
    vacuously), or acceptance other than the strategy implies, summed over the cases (one short
    prompt can be accepted whole by a partly agreeing draft, two rarely are)."""
    strategy = strategies.get(strategy) if isinstance(strategy, str) else strategy
    problems = [case.explain() for case in cases if not case.acceptable]
    drafted = sum(c.assisted.drafted for c in cases)
    accepted = sum(c.assisted.accepted for c in cases)
    if drafted == 0:
        return [*problems, f"{strategy.name}: nothing was drafted, so nothing was tested"]
    why = strategy.acceptance_problem(drafted, accepted, cases[0].vocab_size, whole_budget=not eos)
    return problems + ([why] if why else [])


# What every divergence row holds (``DivergenceTable.add``; rows written before the prompt's digest
# was added lack it, and are then never resumed: ``recorded``).
ROW_KEYS = ("precision", "pair", "prompt")


@dataclass
class DivergenceTable:
    """Per target precision: prompts tested, tokens compared, exact prompts, near ties, failures.

    With ``rows_path`` set, each case is also appended there as one JSON line the moment it is
    counted, so an interrupted hour-long run keeps every prompt it finished, and a rerun resumes.
    """

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    rows_path: Path | None = None

    def add(
        self, precision: str, case: CaseResult, prompt: str = "", pair: str = "", prompt_sha: str = ""
    ) -> None:
        """Count ``case``; with ``rows_path``, also append it there (``pair``, ``prompt`` and the
        prompt's digest name it for resuming)."""
        self._count(precision, len(case.plain.output_ids), case.identical, case.near_tie)
        if self.rows_path is not None:
            row = {
                "precision": precision,
                "pair": pair,
                "prompt": prompt,
                "prompt_sha": prompt_sha,
                "prompt_tokens": len(case.prompt_ids),
                "tokens": len(case.plain.output_ids),
                "identical": case.identical,
                "near_tie": case.near_tie,
                "first_divergence": case.first_divergence,
                "gap": case.gap,
                "versions": platforms.library_versions(),
            }
            results.append_row(self.rows_path, row)

    def recorded(self, precision: str, pair: str = "") -> dict[tuple[str, str], dict]:
        """Rows an earlier (interrupted) run wrote for ``pair`` at ``precision``, by (prompt name,
        prompt digest): a rerun with the same file counts them instead of decoding those prompts
        again, and decodes a prompt whose text changed."""
        if self.rows_path is None:
            return {}
        rows = results.read_records(self.rows_path)
        return {
            (r["prompt"], r.get("prompt_sha", "")): r
            for r in rows
            if r.get("precision") == precision and r.get("pair", "") == pair and r.get("prompt")
        }

    def add_recorded(self, precision: str, row: dict) -> None:
        self._count(precision, row["tokens"], row["identical"], row["near_tie"])

    def _count(self, precision: str, tokens: int, identical: bool, near_tie: bool) -> None:
        c = self.counts.setdefault(
            precision, {"prompts": 0, "tokens": 0, "exact": 0, "near_tie": 0, "other": 0}
        )
        c["prompts"] += 1
        c["tokens"] += tokens
        if identical:
            c["exact"] += 1
        elif near_tie:
            c["near_tie"] += 1
        else:
            c["other"] += 1

    def markdown(self) -> str:
        # Short headers keep the table within 120 columns beside an ONNX Runtime target's long label.
        headers = ["target precision / kernels", "prompts", "tokens", "exact", "near ties", "other"]
        rows = [
            [p, c["prompts"], c["tokens"], c["exact"], c["near_tie"], c["other"]]
            for p, c in sorted(self.counts.items())
        ]
        return tabulate(rows, headers=headers, tablefmt="github")
