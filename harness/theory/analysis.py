"""The theory of assisted decoding, as functions of numbers: acceptance read off a run's forwards,
alpha, the cost ratios c and v, and Leviathan et al.'s expected speedup.

Experiments measure; this module says what the measurements mean. Nothing here loads a model or
reads a clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from harness.base.errors import HarnessError
from harness.theory.timing import Forward, Measurement


def verify_steps(target_forwards: list[Forward], prompt_len: int) -> list[tuple[list[int], int]]:
    """(candidates, position of the first) per target forward of an assisted run: the first verify
    is fed prompt + candidates; later ones the previous step's bonus token + candidates, starting
    right after the cached tokens."""
    steps = []
    for i, f in enumerate(target_forwards):
        if i == 0:
            steps.append((list(f.token_ids[prompt_len:]), prompt_len))
        else:
            steps.append((list(f.token_ids[1:]), f.cache_tokens + 1))
    return steps


def count_acceptance(target_forwards: list[Forward], prompt_len: int, sequence: list[int]) -> tuple[int, int]:
    """Drafted and accepted tokens, read off the target's verify inputs (``verify_steps``).

    A candidate is accepted when it is the token the final sequence holds at its position, counting
    from the first candidate up to the first miss. Comparing with the output (rather than inferring
    from lengths) stays exact when EOS or the token budget cuts the last step short. Plain decoding
    drafts nothing by the same reading.
    """
    drafted = accepted = 0
    for candidates, start in verify_steps(target_forwards, prompt_len):
        drafted += len(candidates)
        for offset, token in enumerate(candidates):
            pos = start + offset
            if pos >= len(sequence) or sequence[pos] != token:
                break
            accepted += 1
    return drafted, accepted


def decode_forwards(forwards: Sequence[Forward]) -> list[Forward]:
    """The forwards onto a non-empty KV cache: decode steps (plain) or verify/draft steps (assisted)."""
    # A forward onto an empty KV cache is a prefill (the whole prompt): it costs far more than a
    # decode step and would inflate every per-step cost ratio.
    return [f for f in forwards if f.cache_tokens > 0]


def _judged_steps(m: Measurement) -> list[list[bool]]:
    """Per verify step of an assisted run, whether each candidate equals the token the final output
    holds at its position, read off the target's verify inputs; candidates past the token budget are
    left out (cut, not judged)."""
    if m.judged_steps is not None:
        return m.judged_steps
    target = [f for f in m.forwards if f.role == "target"]
    if not target:
        return []
    sequence = list(target[0].token_ids[: m.prompt_tokens]) + list(m.output_ids)
    steps = []
    for candidates, start in verify_steps(target, m.prompt_tokens):
        judged = candidates[: max(0, len(sequence) - start)]
        steps.append([sequence[start + offset] == token for offset, token in enumerate(judged)])
    return steps


def first_differing_token(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where both sequences hold a token and the tokens differ (None: none)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two outputs first part: a differing token, or the end of the shorter one (None: equal)."""
    i = first_differing_token(a, b)
    if i is not None or len(a) == len(b):
        return i
    return min(len(a), len(b))


def acceptance_steps(m: Measurement) -> tuple[int, int]:
    """(accepted candidates, verify steps that rejected one) over an assisted run's verify forwards.

    Reads the target's verify inputs the way ``count_acceptance`` does, but keeps what
    that total drops: whether each step ended on a rejection or ran out of candidates or budget.
    That split is what the per-token acceptance probability needs (``alpha_mle``).
    """
    if not m.forwards and m.rejected_steps is not None:  # an engine's own books (harness.decoding.genai)
        return m.accepted, m.rejected_steps
    accepted = rejected = 0
    for judged in _judged_steps(m):
        run = judged.index(False) if False in judged else len(judged)
        accepted += run
        rejected += int(run < len(judged))
    return accepted, rejected


def acceptance_by_position(m: Measurement) -> list[list[int]]:
    """[[drafted, accepted], ...] per draft position over an assisted run's verify steps: position i
    was drafted when a step proposed an i-th candidate, and accepted when candidates 0..i all were.

    Under greedy decoding on deterministic kernels these counts are a function of the code alone (no
    clock involved), so they can be held to a baseline exactly, as vLLM holds acceptance length per
    position: a change in drafting or verification moves them.
    """
    if m.position_counts is not None:
        return [list(c) for c in m.position_counts]
    counts: list[list[int]] = []
    for judged in _judged_steps(m):
        run = judged.index(False) if False in judged else len(judged)
        for offset in range(len(judged)):
            while len(counts) <= offset:
                counts.append([0, 0])
            counts[offset][0] += 1
            counts[offset][1] += int(offset < run)
    return counts


def chain_rounds(emitted: Sequence[int], k: int, budget_reached: bool) -> list[list[bool]]:
    """Judged candidates per round (as ``Measurement.judged_steps`` holds them) of a chain of ``k``
    from the tokens each verification emitted, an engine's own per-round books: a round that emitted
    n tokens accepted its first n - 1 candidates and, below k + 1, rejected the next. A last round
    the token budget may have cut is left out (it may have been cut, not rejected), as is a round
    that emitted more than k + 1 (not a chain of ``k``)."""
    rounds = list(emitted[:-1]) if budget_reached and emitted and emitted[-1] <= k else list(emitted)
    return [[offset < n - 1 for offset in range(k)] for n in rounds if 1 <= n <= k + 1]


def positions_of_counters(drafts: int, draft_tokens: int, accepted: Sequence[int], k: int) -> list[list[int]]:
    """[[drafted, accepted], ...] per position from a deployment's counters (vLLM's and llama.cpp's
    ``spec_decode_num_drafts``, ``_num_draft_tokens`` and ``_num_accepted_tokens_per_pos``): the
    counters hold no drafted count per position, so every draft is taken at ``k`` tokens but the
    shortfall, which the token budget takes off the ends of the last drafts (exact where one draft
    was cut, the usual case: the budget's end)."""
    width = max(k, len(accepted))
    drafted = [drafts] * width
    short = min(max(0, drafts * width - draft_tokens), drafts * width)
    while short > 0:
        for position in reversed(range(width)):
            if short and drafted[position] > 0:
                drafted[position] -= 1
                short -= 1
    counts = [[d, int(accepted[i]) if i < len(accepted) else 0] for i, d in enumerate(drafted)]
    return [c for c in counts if c[0] > 0 or c[1] > 0]


def acceptance_length(
    by_position: Sequence[Sequence[int]] | None, new_tokens: int, target_forwards: int
) -> float | None:
    """Tokens emitted per verification, vLLM's mean acceptance length: 1 + accepted / drafts, a
    draft being a round that proposed at least one token (``by_position``'s first drafted count).
    Without per-position counts, tokens per target forward (which also counts a prompt's forward
    that verified nothing). None when nothing was verified."""
    if by_position:
        drafts = int(by_position[0][0])
        return 1 + sum(int(a) for _, a in by_position) / drafts if drafts else None
    return new_tokens / target_forwards if target_forwards > 0 and new_tokens > 0 else None


def alpha_mle(accepted: int, rejected: int) -> float | None:
    """Per-token acceptance probability, the alpha of Leviathan et al.: accepted / (accepted + rejected).

    Each candidate is a Bernoulli trial that either passes (and the next one is tried) or fails (and
    the step ends); steps that accept every candidate end without a failure. This is the maximum-
    likelihood estimate under that geometric model. It differs from accepted/drafted (the rows'
    ``acceptance_rate``), which also counts the candidates after a rejection that were never tried.
    """
    trials = accepted + rejected
    return accepted / trials if trials else None


def decode_totals(m: Measurement, role: str) -> tuple[float, int]:
    """(ms, count) of ``role``'s decode-step forwards in one run: from its per-forward records, or
    from its engine's own books (``step_costs``) where it keeps no records."""
    if not m.forwards and m.step_costs:
        return m.step_costs.get(role, (0.0, 0))
    forwards = [f for f in decode_forwards(m.forwards) if f.role == role]
    return sum(f.ms for f in forwards), len(forwards)


def decode_ms(runs: Sequence[Measurement], role: str) -> float:
    """A decode-step forward of ``role`` ("target" or "draft"): each run's mean step, the median
    over runs; NaN when there is none. The median, because one run on a stalled host (steps 2.5x
    slower) would move a pooled mean, and with it c, v and the gate's host adjustment."""
    per_run = [ms / n for ms, n in (decode_totals(m, role) for m in runs) if n]
    return statistics.median(per_run) if per_run else math.nan


def round_cost(k: int, c: float, v: float) -> float | None:
    """A speculative round's cost in plain target steps: K draft steps and one verification,
    ``K c + v`` (Leviathan's denominator: two hosts' predictions at one acceptance differ by its
    ratio); ``v`` alone where ``c`` was not measured because the engine books a round whole, its
    drafting included (llama.cpp's server). None when ``v`` is not a positive number or ``c`` is
    negative."""
    if not (math.isfinite(v) and v > 0) or (math.isfinite(c) and c < 0) or math.isinf(c):
        return None
    return v if math.isnan(c) else k * c + v


def predict_speedup(alpha: float | None, k: int | None, c: float, v: float = 1.0) -> float | None:
    """Leviathan et al.'s expected speedup for measured alpha, K, cost ratio c and verify cost v.

    None when an input was not measured (no candidate was ever tried, or a mode without the forwards
    a ratio needs) or there is no chain of K (``k`` None: a token tree, whose rounds the formula does
    not describe): a missing prediction reads as "-" in tables rather than a made-up number.
    """
    if k is None or alpha is None or not (math.isfinite(c) and math.isfinite(v)) or v <= 0:
        return None
    return leviathan_speedup_verify(alpha, k, c, v)


# --- Speculative decoding theory (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
# Speculative Decoding", Theorem 3.8 and Eq. 1) ---


def _check_alpha_k(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise HarnessError(f"acceptance rate alpha must be in [0, 1], got {alpha}")
    if k < 0 or int(k) != k:
        raise HarnessError(f"K (draft tokens per step) must be a non-negative integer, got {k}")


def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """Expected tokens per target forward: (1 - alpha^(k+1)) / (1 - alpha); k + 1 when alpha = 1."""
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _expected_tokens_at(alpha: float, d: float) -> float:
    """``expected_tokens_per_forward`` at a mean number of drafts that need not be whole."""
    return d + 1.0 if alpha == 1.0 else (1.0 - alpha ** (d + 1.0)) / (1.0 - alpha)


def leviathan_speedup_verify(alpha: float, k: int, c: float, v: float) -> float:
    """Expected walltime speedup when a K+1-token verification forward costs ``v`` one-token forwards.

    (1 - alpha^(k+1)) / ((1 - alpha) (k c + v)). On a compute-bound CPU, v grows with K (the paper's
    v = 1 assumes memory-bound decoding, where K+1 tokens cost as much as one).
    """
    _check_alpha_k(alpha, k)
    if c < 0:
        raise HarnessError(f"draft/target cost ratio c must be >= 0, got {c}")
    if v <= 0:
        raise HarnessError(f"verification cost ratio v must be > 0, got {v}")
    return expected_tokens_per_forward(alpha, k) / (k * c + v)


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Expected speedup (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)) for acceptance alpha, K drafts, cost c."""
    return leviathan_speedup_verify(alpha, k, c, 1.0)


def optimal_k(alpha: float, c: float, v_of_k: Callable[[int], float] | None = None, k_max: int = 16) -> int:
    """K in 0..k_max maximising the expected speedup; 0 means drafting does not pay at all."""
    if k_max < 0:
        raise HarnessError(f"k_max must be >= 0, got {k_max}")
    best_k, best = 0, -math.inf
    for k in range(k_max + 1):
        v = 1.0 if v_of_k is None or k == 0 else float(v_of_k(k))
        s = leviathan_speedup_verify(alpha, k, c, v)
        if s > best + 1e-12:  # strict, so ties go to the smaller (cheaper) K
            best_k, best = k, s
    return best_k


# --------------------------------------------------------------------------- an engine's own books

# The engine reports its acceptance rate as a float32.
ENGINE_STATS_TOLERANCE = 1e-6


def engine_stats_problems(s: dict[str, Any], n: int, k: int) -> list[str]:
    """Disagreements between onnxruntime-genai's own statistics ``s`` (``get_speculative_stats``)
    and what its ``n`` output tokens and this theory show (empty: none).

    The tokens it emitted are the output; each round proposes at most K drafts and ends with one
    correction or bonus token; every completed round accepted all, some or none of its drafts; the
    tokens it committed are the accepted drafts plus those closing tokens, less what the budget
    discarded; its acceptance rate is accepted / evaluated; its tokens per round are emitted /
    rounds; its expected tokens per round are ``expected_tokens_per_forward`` at its acceptance
    rate and K; and, where it timed plain steps of its own (cooldown, adaptive K), its observed and
    estimated speedups are what its own times and counts give. (Without such steps it reports no
    speedup; the suite's comes from its own interleaved plain runs.)"""
    get = lambda key: s.get(key, 0)  # noqa: E731
    # Steps where nothing was proposed (an n-gram lookup that missed) decode one token the plain way.
    fallback = get("standard_fallback_steps")
    checks = [
        (
            get("tokens_emitted") + fallback == n,
            f"engine emitted {get('tokens_emitted')} tokens in rounds and {fallback} in plain steps, "
            f"the output holds {n}",
        ),
        (get("draft_tokens_proposed") <= k * get("rounds"), f"more than K = {k} drafts in a round"),
        (
            get("draft_tokens_accepted") <= get("draft_tokens_evaluated"),
            "more drafts accepted than evaluated",
        ),
        (
            get("correction_tokens") + get("bonus_tokens") == get("rounds"),
            f"{get('rounds')} rounds closed by {get('correction_tokens')} corrections and "
            f"{get('bonus_tokens')} bonus tokens (one each expected)",
        ),
        (
            get("full_accept_rounds") + get("partial_accept_rounds") + get("zero_accept_rounds")
            == get("completed_rounds"),
            "completed rounds are not full + partial + zero accepts",
        ),
        (
            get("draft_tokens_accepted") + get("correction_tokens") + get("bonus_tokens")
            == n - fallback + get("tokens_discarded"),
            "accepted + closing tokens differ from emitted + discarded",
        ),
    ]
    problems = [why for ok, why in checks if not ok]
    if get("draft_tokens_evaluated"):
        rate = get("draft_tokens_accepted") / get("draft_tokens_evaluated")
        if abs(rate - s.get("acceptance_rate", -1.0)) > ENGINE_STATS_TOLERANCE:
            problems.append(f"acceptance_rate {s.get('acceptance_rate')} but accepted / evaluated is {rate}")
    # The engine reports these as float32: agreement to its precision, relative.
    if get("rounds"):
        per_round = get("tokens_emitted") / get("rounds")
        if not math.isclose(per_round, s.get("mean_emitted_tokens_per_round", -1.0), rel_tol=1e-5):
            problems.append(
                f"mean_emitted_tokens_per_round {s.get('mean_emitted_tokens_per_round')} but emitted / "
                f"rounds is {per_round}"
            )
    if get("draft_tokens_evaluated") and get("rounds") and "expected_tokens_per_round" in s:
        # Per round (1 - a^(d+1)) / (1 - a) for the d drafts it proposed: at K when every round
        # proposed K, and never above the formula at the mean d (concave in d) when the budget or
        # a lookup cut some rounds short.
        rate, said = min(1.0, max(0.0, s["acceptance_rate"])), s["expected_tokens_per_round"]
        mean_d = get("draft_tokens_proposed") / get("rounds")
        full = mean_d == k
        bound = expected_tokens_per_forward(rate, k) if full else _expected_tokens_at(rate, mean_d)
        if (full and not math.isclose(said, bound, rel_tol=1e-4)) or said > bound * (1 + 1e-4) or said < 1:
            problems.append(
                f"expected_tokens_per_round {said} but (1 - a^(d+1)) / (1 - a) at its acceptance rate "
                f"and {mean_d:g} drafts a round is {'' if full else 'at most '}{bound}"
            )
    # Its speedup figures exist once it has timed plain steps of its own (cooldown, adaptive K):
    # the observed one is that per-token time over what its forwards cost per emitted token, the
    # estimated one the same from its expected tokens and its per-round costs.
    baseline = s.get("target_baseline_ms_per_token", 0.0)
    forwards_ms = get("total_target_ms") + get("total_draft_ms")
    if baseline > 0 and forwards_ms > 0 and get("rounds"):
        observed = baseline * get("tokens_emitted") / forwards_ms
        if not math.isclose(observed, s.get("observed_speedup", -1.0), rel_tol=1e-4):
            problems.append(
                f"observed_speedup {s.get('observed_speedup')} but its plain-step time x emitted tokens "
                f"over its forwards' time is {observed}"
            )
        per_round = get("avg_target_ms_per_round") + get("avg_draft_ms_per_token") * get(
            "avg_draft_tokens_per_round"
        )
        if per_round > 0:
            estimated = get("expected_tokens_per_round") * baseline / per_round
            if not math.isclose(estimated, s.get("estimated_speedup", -1.0), rel_tol=1e-4):
                problems.append(
                    f"estimated_speedup {s.get('estimated_speedup')} but its expected tokens per round x "
                    f"plain-step time over its per-round cost is {estimated}"
                )
    return problems
