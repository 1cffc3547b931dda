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
instead of verifying guesses), and one kept in part relaxes it again. None of this touches the
output: the target verifies every proposal as it verifies the draft model's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

MIN_MATCH = 3  # tokens the latest tokens must share with an earlier place to propose from it
LONGEST_MATCH = 32  # how far back a match is compared when choosing among places
FIRST_LENGTH = 8  # a proposal's length before any has been verified


class ContextProposer:
    """The sequence's ``MIN_MATCH``-grams, indexed as tokens arrive, and the proposals they give."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.length = min(FIRST_LENGTH, limit)
        self.need = MIN_MATCH  # the match a proposal needs now
        self.seq: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = defaultdict(list)  # n-gram -> its end indices

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
        return self.seq[best + 1 : best + 1 + min(room, self.length)]

    def verified(self, proposed: int, kept: int) -> None:
        """How a proposal fared: ``kept`` of its ``proposed`` tokens were the target's."""
        if kept == proposed:
            self.length = min(self.limit, self.length * 2)
        else:
            self.length = max(2, min(self.limit, kept + 2))
        self.need = min(LONGEST_MATCH, self.need + 2) if kept == 0 else max(MIN_MATCH, self.need - 1)
