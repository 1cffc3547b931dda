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
draft model's chain runs, unless (on a prompt longer than the draft's window, which the loop in
``trees`` knows) its own rounds have emitted fewer tokens than plain steps would have in their time
(``ChainRecord``): then plain steps, with a chain round now and then to see whether that changed.
On such a prompt the chain's depth is chosen by the same measure (``RoundPlan.chain_depth``): the
depth up to K with the most expected tokens per ms at the rate its tokens are kept. While a request
copies its context (a recent round kept two or more of its tokens) the chain proposes one token a
round, so that the context, not the draft, proposes the copy's continuation as soon as it matches
again.
A draft model's chain is itself continued from the context where the sequence with the chain's
tokens matches a copy (a match running ``RUNS[0]`` tokens or more back): a copy whose first tokens
only the draft foresaw goes on in the same verification, its rows cut by the same expected gain per
ms, counted only as often as recent chains were kept whole. (Phrases are left out: continuing from
them gained no more on copying prompts, and made the exact acceptance gate's rounds depend on the
host's timing.)

None of this touches the output: the target verifies every proposal as it verifies the draft
model's, and a plain step is plain decoding's.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict, deque
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
# for both would cut a copy's proposals short or verify a phrase's guesses at length. A longer match
# is judged at no less than a shorter one has earned (``ContextProposer.keep_rate``).
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

    def propose(self, room: int, after: Sequence[int] = ()) -> list[int]:
        """Up to ``min(room, length)`` tokens that followed the best earlier place the sequence's
        last tokens occurred (none: the context holds no continuation); with ``after``, the place of
        the sequence followed by those tokens (a draft's chain, not yet verified)."""
        n = len(self.seq) + len(after)
        if n < MIN_MATCH + 1 or room < 1:
            return []
        # The sequence's last tokens, as far back as a match is compared (the index holds the rest).
        recent = [*self.seq[-LONGEST_MATCH:], *after]
        last = len(recent) - 1
        best, best_run = None, 0
        for end in reversed(self.ends.get(tuple(recent[-MIN_MATCH:]), ())):
            if end >= n - 1:
                continue  # the sequence's own end
            run = MIN_MATCH
            while run < LONGEST_MATCH and end - run >= 0 and self.seq[end - run] == recent[last - run]:
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
        ``PRIOR_KEPT``, ``PRIOR_MISSED``), or that those from a shorter match did where that is
        higher.

        Why the shorter kinds': a longer match predicts at least as well, and a copy that starts
        after an edit (a renamed name) reaches each longer kind as it goes on, where that kind's
        record may still be its prior. With each kind on its own, a rename's copy on a 705-token
        prompt fell from proposals of eight to one at the step to the longest kind."""
        return max(self._rate(i) for i in range(_kind(self.run) + 1))

    def _rate(self, i: int) -> float:
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


class ChainRecord:
    """Whether the draft model's chain emits more tokens in its time than plain steps would: the
    tokens its recent rounds emitted over their time, against the time of a plain step, both as this
    loop's rounds take them (wall time, bookkeeping included: a round's cache crops and Python cost
    a chain round a few ms that the forwards' own times leave out).

    A plain step is timed after ``SAMPLE_GAPS`` chain rounds (4, then 8, 16, 32 and every 48): where
    the chain pays, a handful of a request's rounds are taken at plain decoding's pace. The step's
    time is the median of the last ``SAMPLES`` timed: the first plain step after chain rounds read
    1.25x the next ones on AMD EPYC Zen 4 (37-38 against 29-30 ms at a 1K-token cache), and that
    alone made a losing chain look like a winning one.

    A chain round emits 1 to K+1 tokens, so a few rounds say little: the record starts from
    ``PRIOR_ROUNDS`` rounds of ``PRIOR_STEPS`` plain steps' time at ``PRIOR_RATE`` tokens a step (the
    chain pays, as on most prompts), fades by ``KEEP`` a round (about seven rounds' memory), and turns
    to plain steps once it reads below one token a step. Then it waits ``FIRST_WAIT`` plain steps
    before trying the chain again, twice as many after each try that did not pay (up to
    ``LONGEST_WAIT``) and ``FIRST_WAIT`` again after one that did, as the text the draft foresees may
    begin or end anywhere in an answer.

    Why: on questions about a 1K-token document, whose answers the draft's short window rarely
    foresees (under two tokens a round), the chain ran at 0.79-0.83x plain decoding in decoding
    (interleaved, one process, AMD EPYC Zen 4), and such requests were slower than plain end to
    end."""

    KEEP = 0.85
    PRIOR_ROUNDS, PRIOR_STEPS, PRIOR_RATE = 3.0, 2.0, 1.25
    SAMPLE_GAPS = (4, 8, 16, 32, 48)  # chain rounds before each timed plain step; the last repeats
    SAMPLES = 5
    FIRST_WAIT, LONGEST_WAIT = 4, 32

    def __init__(self) -> None:
        self.tokens = self.ms = 0.0
        # The prior's weight in plain steps, faded with the rounds: held whole, it kept a chain that
        # emitted 0.83 tokens a step running 98% of its rounds.
        self.prior = self.PRIOR_ROUNDS * self.PRIOR_STEPS
        self.samples: deque[float] = deque(maxlen=self.SAMPLES)  # plain steps' times, latest last
        self.timed = 0  # plain steps timed so far
        self.since = 0  # chain rounds since the last
        self.wait = 0  # plain steps before the chain is tried again
        self.backoff = 0  # the wait after the next round that leaves the record below one

    @property
    def plain_ms(self) -> float | None:
        """A plain step's time now (None: none timed yet)."""
        return statistics.median(self.samples) if self.samples else None

    @property
    def rate(self) -> float | None:
        """Tokens the chain emits in a plain step's time, as the record reads now (None: no plain step
        timed yet)."""
        plain = self.plain_ms
        if plain is None:
            return None
        return (self.tokens + self.prior * self.PRIOR_RATE) / (self.ms / plain + self.prior)

    def runs(self) -> bool:
        """Whether this round runs the chain (else a plain step)."""
        if self.wait > 0:
            self.wait -= 1
            return False
        return self.since < self.SAMPLE_GAPS[min(self.timed, len(self.SAMPLE_GAPS) - 1)]

    def plain_step(self, ms: float) -> None:
        """A plain step took ``ms``."""
        self.samples.append(ms)
        self.timed += 1
        self.since = 0

    def chain_round(self, tokens: int, ms: float) -> None:
        """A chain round emitted ``tokens`` in ``ms``."""
        self.since += 1
        self.tokens = self.KEEP * self.tokens + tokens
        self.ms = self.KEEP * self.ms + ms
        self.prior *= self.KEEP
        rate, plain = self.rate, self.plain_ms
        if rate is None or plain is None or rate >= 1.0:
            self.backoff = 0
            return
        if tokens * plain >= ms:  # this round paid: the record is on its way back, try again soon
            self.backoff = self.FIRST_WAIT
        else:
            self.backoff = min(self.LONGEST_WAIT, max(self.FIRST_WAIT, 2 * self.backoff))
        self.wait = self.backoff


class RoundPlan:
    """Whether a round verifies the context's proposal, cut to the length expected to gain most per
    ms on this host, or runs the draft model's chain, or takes a plain step.

    The proposal is held to a plain step's rate, not the chain's: a chain round emits 1 to K+1
    tokens, so its rate over a few rounds swings widely, and a plan that weighed proposals against it
    took plain steps on the speed gate's prompt where the chain pays over a whole request. Measured,
    the proposals that beat a plain step are the copies', which beat the chain too. The chain itself
    gives way to plain steps only on its own long record (``ChainRecord``)."""

    WHOLE_KEEP = 0.8  # weight the share of chains kept whole keeps a round
    # The chain's depth on a long prompt: the draft's tokens kept and missed, each round's weighing
    # CHAIN_KEEP of the last (about ten rounds' memory), from a prior of CHAIN_PRIOR (kept, missed).
    CHAIN_KEEP = 0.9
    CHAIN_PRIOR = (2.0, 1.0)
    # A request copies its context for COPY_ROUNDS rounds after one that kept COPY_TOKENS or more of
    # the context's tokens; meanwhile the draft's chain proposes a single token (``depth``). One token
    # kept is often a coincidence (the mixed prompts keep one now and then), a copy keeps more.
    COPY_ROUNDS = 16
    COPY_TOKENS = 2

    def __init__(self, context: ContextProposer) -> None:
        self.context = context
        self.costs = RowCosts()
        self.chain = ChainRecord()
        self.whole = 0.5  # the share of recent draft chains kept whole
        self.chain_hits, self.chain_misses = self.CHAIN_PRIOR
        self.draft_ms: float | None = None  # a draft step's time now (None: none timed yet)
        self.since_copy = self.COPY_ROUNDS + 1  # rounds since one kept a copy (``round_kept``)

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

    def extension(self, chain: Sequence[int], room: int) -> list[int]:
        """What the context continues a draft's ``chain`` with, cut to the length expected to gain
        most (none: nothing that pays): its tokens count only where the whole chain is kept, at the
        rate recent chains were (``whole``), and each costs its row of the verification."""
        found = self.context.propose(room, after=chain)
        one = self.costs.ms(1)
        if not found or one is None or self.context.run < RUNS[0]:
            return []
        rate, base = self.context.keep_rate, self.costs.ms(1 + len(chain))
        best, best_gain, expected = 0, 0.0, 0.0
        for n in range(1, len(found) + 1):
            expected += rate**n
            gain = self.whole * expected * one - (self.costs.ms(1 + len(chain) + n) - base)
            if gain > best_gain:
                best, best_gain = n, gain
        if best == 0:
            self.context.passed_over()
        return list(found[:best])

    def chain_kept(self, proposed: int, kept: int) -> None:
        """A draft's chain of ``proposed`` tokens had ``kept`` kept."""
        self.whole = self.WHOLE_KEEP * self.whole + (1 - self.WHOLE_KEEP) * (kept == proposed)
        # Each token up to the first miss was judged: ``kept`` hits, then a miss unless all were kept.
        self.chain_hits = self.CHAIN_KEEP * self.chain_hits + kept
        self.chain_misses = self.CHAIN_KEEP * self.chain_misses + (kept < proposed)

    def draft_step(self, ms: float) -> None:
        """A draft forward of one token took ``ms`` (the latest weigh as a row cost's do)."""
        keep = RowCosts.KEEP
        self.draft_ms = ms if self.draft_ms is None else keep * self.draft_ms + (1 - keep) * ms

    def round_kept(self, from_context: int) -> None:
        """A round ended with ``from_context`` of its emitted tokens proposed by the context."""
        self.since_copy = 0 if from_context >= self.COPY_TOKENS else self.since_copy + 1

    def depth(self, k: int, windowed: bool) -> int:
        """How many of up to ``k`` tokens the draft's chain proposes this round: one while the
        request copies its context (``COPY_ROUNDS``, ``COPY_TOKENS``), else ``chain_depth`` on a
        prompt longer than the draft's window and ``k`` on one it reads whole.

        Why one while copying: a chain of one leaves the next round to the context, which proposes
        a copy's continuation as soon as the latest tokens match it again, with no draft step, where
        a chain of K spends K draft steps and a K+1-row verification on tokens the context would
        have given. It is decided by the tokens alone, not by timings, so a prompt that copies
        nothing (the exact acceptance gate's) drafts as it did. Interleaved with the chain of K = 3
        over the 36 copying prompts (AMD EPYC Zen 3, one process, every output identical) it
        decoded at 1.64x plain against 1.51x, as fast as a chain of one throughout (1.65x); on the
        mixed prompts, where K = 3 is registered, it is level (docs/FINDINGS.md)."""
        if self.since_copy <= self.COPY_ROUNDS:
            return 1
        return self.chain_depth(k) if windowed else k

    def chain_depth(self, k: int) -> int:
        """How many of up to ``k`` tokens the draft's chain proposes: the depth with the most
        expected tokens per ms (Leviathan's speedup at the rate the chain's tokens are kept, a draft
        step's measured cost and the verification's fitted cost), at least one (whether a chain runs
        at all is ``ChainRecord``'s to say). ``k`` until a draft step and a verification are timed.

        Why: on long prompts a row of the verification costs more (each attends to the whole cache)
        and the draft, reading a window, foresees less. On a question about a 1K-token document
        (AMD EPYC Zen 3, interleaved, one process) the chain of up to 3 ran at 1.03x plain decoding
        after the prefill over ten runs, the chosen depth (mostly one) at 1.12x over seven
        (docs/FINDINGS.md)."""
        one = self.costs.ms(1)
        if self.draft_ms is None or one is None or k <= 1:
            return k
        alpha = self.chain_hits / (self.chain_hits + self.chain_misses)
        costs = self.costs
        return max(1, optimal_k(alpha, self.draft_ms / one, lambda n: costs.ms(1 + n) / one, k_max=k))

    def observe(self, rows: int, ms: float) -> None:
        """A round's verification of ``rows`` rows took ``ms``."""
        self.costs.observe(rows, ms)
