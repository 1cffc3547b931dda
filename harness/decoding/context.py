"""Proposals from the context: the continuation the prompt or the output so far already holds.

Code edits copy a function, answers quote their document, summaries reuse its phrases: where the
latest tokens occurred before, what followed them then is a proposal that costs no draft forward.
As prompt lookup (transformers' ``PromptLookupCandidateGenerator``, llama.cpp's n-gram speculation)
and suffix decoding do, the index keys every ``MIN_MATCH``-gram of the sequence by the positions it
ends at; a round takes the most recent occurrence of the sequence's own last ``MIN_MATCH`` tokens
whose match runs furthest back (a longer match predicts the continuation better), and proposes what
followed it.

Both its length and how long a match it asks for adapt to how context proposals fare: the length
doubles after a proposal kept whole and falls to just past what was kept after one that missed,
within ``limit``; a proposal kept not at all makes the next ask for a longer match (so a document
whose phrases recur without being copied, as questions about it do, falls back to the draft model
instead of verifying guesses), and one kept in part relaxes it again.

Whether a round verifies the context's proposal is then chosen by what it is expected to gain per
ms on this host (``RoundPlan``): the proposal is cut to the length whose expected tokens (Leviathan's
``expected_tokens_per_forward`` at the rate context proposals are kept) over the verification's
measured cost (``RowCosts``) is highest, and verified where that beats a plain step; otherwise the
draft model's chain runs. None of this touches the output: the target verifies every proposal as it
verifies the draft model's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from harness.theory.analysis import optimal_k

MIN_MATCH = 3  # tokens the latest tokens must share with an earlier place to propose from it
LONGEST_MATCH = 32  # how far back a match is compared when choosing among places
FIRST_LENGTH = 8  # a proposal's length before any has been verified
# Weight a record keeps at each new entry (proposals' verdicts, chain rounds): about five entries'
# memory, as a copy starts and ends within a few rounds.
DECAY = 0.8
# What the keep rate reads before any verdict: a match of MIN_MATCH tokens or more is usually followed
# by what followed it before (3 kept to 1 missed), held as two proposals' worth of evidence so that a
# run of misses can take it below what a row costs.
PRIOR_KEPT, PRIOR_MISSED = 1.5, 0.5
# Matches are judged apart by how far back they run (shorter than the first, up to the second, the
# longest compared): inside a copy the match runs the whole way back and the next token nearly always
# follows, while a phrase the text reuses matches a few tokens and often parts at once, and one rate
# for both would cut a copy's proposals short or verify a phrase's guesses at length.
RUNS = (8, LONGEST_MATCH)


def _kind(run: int) -> int:
    return sum(run >= r for r in RUNS)


class ContextProposer:
    """The sequence's ``MIN_MATCH``-grams, indexed as tokens arrive, and the proposals they give."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.length = min(FIRST_LENGTH, limit)
        self.need = MIN_MATCH  # the match a proposal needs now
        self.seq: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = defaultdict(list)  # n-gram -> its end indices
        # Per kind of match (``RUNS``): the tokens kept and the misses of recent proposals, decaying.
        self.kept = [0.0] * (len(RUNS) + 1)
        self.missed = [0.0] * (len(RUNS) + 1)
        self.run = 0  # how far back the last proposal's match ran

    def extend(self, seq: Sequence[int]) -> None:
        """Take the sequence as it now is (it only ever grows by what was kept)."""
        for i in range(len(self.seq), len(seq)):
            self.seq.append(int(seq[i]))
            if i + 1 >= MIN_MATCH:
                self.ends[tuple(self.seq[i + 1 - MIN_MATCH : i + 1])].append(i)

    def propose(self, room: int) -> list[int]:
        """Up to ``min(room, length)`` tokens that followed the best earlier place the sequence's
        last tokens occurred (none: the context holds no continuation)."""
        n = len(self.seq)
        if n < MIN_MATCH + 1 or room < 1:
            return []
        best, best_run = None, 0
        for end in reversed(self.ends.get(tuple(self.seq[n - MIN_MATCH :]), ())):
            if end >= n - 1:
                continue  # the sequence's own end
            run = MIN_MATCH
            while run < LONGEST_MATCH and end - run >= 0 and self.seq[end - run] == self.seq[n - 1 - run]:
                run += 1
            if run > best_run:
                best, best_run = end, run
        if best is None or best_run < self.need:
            return []
        self.run = best_run
        return self.seq[best + 1 : best + 1 + min(room, self.length)]

    def verified(self, proposed: int, kept: int) -> None:
        """How a proposal fared: ``kept`` of its ``proposed`` tokens were the target's."""
        if kept == proposed:
            self.length = min(self.limit, self.length * 2)
        else:
            self.length = max(2, min(self.limit, kept + 2))
        self.need = min(LONGEST_MATCH, self.need + 2) if kept == 0 else max(MIN_MATCH, self.need - 1)
        i = _kind(self.run)
        self.kept[i] = DECAY * self.kept[i] + kept
        self.missed[i] = DECAY * self.missed[i] + (kept < proposed)

    def passed_over(self) -> None:
        """The last proposal was not verified: its kind's record fades toward the prior, so a kind
        of match that went quiet is tried again after a few rounds (a copy may begin)."""
        i = _kind(self.run)
        self.kept[i], self.missed[i] = DECAY * self.kept[i], DECAY * self.missed[i]

    @property
    def keep_rate(self) -> float:
        """How likely a token of the last proposal is kept, given the one before it was: the
        geometric rate that recent proposals from as long a match kept and missed (with
        ``PRIOR_KEPT``, ``PRIOR_MISSED``)."""
        i = _kind(self.run)
        kept = self.kept[i] + PRIOR_KEPT
        return kept / (kept + self.missed[i] + PRIOR_MISSED)


class RowCosts:
    """What a target forward of ``n`` rows costs now, fitted to the rounds' own verifications.

    A proposal's last rows pay only where a row costs something: on a host whose products hide under
    the weight stream a 16-row verification costs about one step, on one bound by its arithmetic
    (AVX-512 at half width, a long cache's attention) four or five. So the cost is measured, not
    assumed: ms = a + b (n - 1) by least squares over the latest verifications (weights decaying by
    ``KEEP`` per forward: about twenty forwards' memory, enough to average a forward's noise out and
    short enough to follow the cache's growth and the host's drift), with ``b`` at ``PRIOR_SLOPE`` of
    ``a`` until the rows' counts have varied enough to fit it.
    """

    KEEP = 0.95
    PRIOR_SLOPE = 0.1  # an extra row's cost in one-row forwards, before any is measured

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def observe(self, rows: int, ms: float) -> None:
        x, keep = float(rows - 1), self.KEEP
        self.w, self.x, self.y = keep * self.w + 1.0, keep * self.x + x, keep * self.y + ms
        self.xx, self.xy = keep * self.xx + x * x, keep * self.xy + x * ms

    def ms(self, rows: int) -> float | None:
        """ms of a forward of ``rows`` rows; None before any was measured."""
        if self.w == 0.0:
            return None
        mx, my = self.x / self.w, self.y / self.w
        spread = self.xx - self.w * mx * mx  # the rows' weighted variance, times the weight
        slope = (self.xy - self.w * mx * my) / spread if spread > 1.0 else math.nan
        if not math.isfinite(slope) or slope < 0.0 or my - slope * mx <= 0.0:
            one = my / (1.0 + self.PRIOR_SLOPE * mx)
            return one * (1.0 + self.PRIOR_SLOPE * (rows - 1))
        return my + slope * (rows - 1 - mx)


class RoundPlan:
    """Whether a round verifies the context's proposal, cut to the length expected to gain most per
    ms on this host, or the draft model's chain.

    The proposal is held to a plain step's rate, not the chain's as its rounds ran: a chain round
    emits 1 to K+1 tokens, so its rate over the few rounds a record remembers swings widely, and a
    plan that also weighed it (and a plain step where neither paid) took plain steps on the speed
    gate's prompt where the chain pays over a whole request. Measured, the proposals that beat a
    plain step are the copies', which beat the chain too."""

    def __init__(self, context: ContextProposer) -> None:
        self.context = context
        self.costs = RowCosts()

    def choose(self, found: Sequence[int]) -> list[int]:
        """The context's tokens the round verifies (none: the draft model's chain runs)."""
        one = self.costs.ms(1)
        if not found or one is None:  # before any cost is measured, the context where it proposes
            return list(found)
        costs = self.costs

        def v(k: int) -> float:
            return costs.ms(1 + k) / one

        # Tokens a verification of n rows is expected to emit over its cost, against a plain step's
        # one token per one-row forward (n = 0): optimal_k's best n pays wherever it is above 0.
        n = optimal_k(self.context.keep_rate, 0.0, v, k_max=len(found))
        if n > 0:
            return list(found[:n])
        self.context.passed_over()
        return []

    def observe(self, rows: int, ms: float) -> None:
        """A round's verification of ``rows`` rows took ``ms``."""
        self.costs.observe(rows, ms)
