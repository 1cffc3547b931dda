import math
import statistics

import numpy as np
import pytest

from harness.base.errors import HarnessError
from harness.theory import analysis
from harness.theory.analysis import (
    expected_tokens_per_forward,
    first_differing_token,
    first_divergence,
    leviathan_speedup,
    leviathan_speedup_verify,
    optimal_k,
)
from harness.theory.stats import (
    DEFAULT_ALPHA,
    DEFAULT_MARGIN,
    gate,
    mean_ci,
    settle,
    simulate_gate,
    speedup_ci,
)


def lognormal(rng, mean, cv, n):
    sigma = math.sqrt(math.log1p(cv * cv))
    return mean * np.exp(rng.normal(0.0, sigma, n))


# --- Leviathan et al. 2023 ---


@pytest.mark.parametrize("k,c", [(1, 0.0), (5, 0.1), (8, 0.5)])
def test_leviathan_alpha_zero_is_one_over_kc_plus_one(k, c):
    assert leviathan_speedup(0.0, k, c) == pytest.approx(1.0 / (k * c + 1.0))


def test_leviathan_alpha_one_limit_is_continuous():
    k, c = 5, 0.05
    at_one = leviathan_speedup(1.0, k, c)
    assert at_one == pytest.approx((k + 1) / (k * c + 1))
    assert leviathan_speedup(1.0 - 1e-9, k, c) == pytest.approx(at_one, rel=1e-6)


def test_leviathan_known_value():
    # (1 - 0.8^5) / (0.2 * (4 * 0.05 + 1)) = 0.67232 / 0.24, worked by hand
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(0.67232 / 0.24)


def test_verification_cost_variant():
    assert leviathan_speedup_verify(0.7, 5, 0.1, 1.0) == pytest.approx(leviathan_speedup(0.7, 5, 0.1))
    # A costlier verification forward can only lower the speedup.
    assert leviathan_speedup_verify(0.7, 5, 0.1, 2.0) < leviathan_speedup(0.7, 5, 0.1)
    assert leviathan_speedup_verify(0.0, 3, 0.2, 1.5) == pytest.approx(1.0 / (0.6 + 1.5))


def test_expected_tokens_per_forward():
    assert expected_tokens_per_forward(0.0, 5) == 1.0
    assert expected_tokens_per_forward(1.0, 5) == 6.0
    assert expected_tokens_per_forward(0.5, 1) == pytest.approx(1.5)


def test_optimal_k_is_sensible():
    assert optimal_k(0.0, 0.1) == 0  # a draft that is never right never pays
    assert optimal_k(0.95, 0.0, k_max=16) == 16  # free, near-perfect drafts: draft as far as allowed
    ks = [optimal_k(a, 0.05) for a in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert ks == sorted(ks) and ks[-1] > ks[0]
    assert optimal_k(0.8, 0.02) >= optimal_k(0.8, 0.2)
    # On a compute-bound CPU the verify forward grows with K, which favours shorter drafts.
    assert optimal_k(0.8, 0.05, v_of_k=lambda k: 1 + 0.2 * k) < optimal_k(0.8, 0.05)


def test_optimal_k_is_a_local_maximum():
    alpha, c = 0.75, 0.08
    k = optimal_k(alpha, c)
    assert 1 <= k < 16
    best = leviathan_speedup(alpha, k, c)
    assert best >= leviathan_speedup(alpha, k - 1, c)
    assert best >= leviathan_speedup(alpha, k + 1, c)


def test_theory_rejects_bad_input():
    with pytest.raises(HarnessError):
        leviathan_speedup(1.2, 3, 0.1)
    with pytest.raises(HarnessError):
        leviathan_speedup(0.5, -1, 0.1)
    with pytest.raises(HarnessError):
        leviathan_speedup_verify(0.5, 2, 0.1, 0.0)


def test_speedup_ci_covers_the_true_speedup():
    true = 2.0
    covered = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        plain = lognormal(rng, 10.0, 0.05, 8)
        assisted = true * lognormal(rng, 10.0, 0.05, 8)
        est = speedup_ci(plain, assisted, paired=False)
        assert est.low <= est.value <= est.high
        covered += est.low <= true <= est.high
    assert covered >= 34  # nominal 95%; a bootstrap on 8 samples under-covers a little


def test_paired_speedup_ci_cancels_shared_drift():
    rng = np.random.default_rng(3)
    drift = lognormal(rng, 1.0, 0.15, 8)  # the machine slows down and recovers between repetitions
    plain = 10.0 * drift * lognormal(rng, 1.0, 0.01, 8)
    assisted = 15.0 * drift * lognormal(rng, 1.0, 0.01, 8)
    paired = speedup_ci(plain, assisted, paired=True)
    unpaired = speedup_ci(plain, assisted, paired=False)
    assert paired.low <= 1.5 <= paired.high
    assert (paired.high - paired.low) < 0.5 * (unpaired.high - unpaired.low)


def test_speedup_ci_is_reproducible_and_validates():
    plain, assisted = [5.0, 5.2, 4.9, 5.1], [9.0, 9.5, 9.1, 9.8]
    assert speedup_ci(plain, assisted) == speedup_ci(plain, assisted)
    with pytest.raises(HarnessError, match="paired=False"):
        speedup_ci([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(HarnessError, match="positive"):
        speedup_ci([1.0, 0.0], [1.0, 2.0])
    single = speedup_ci([4.0], [8.0])
    assert single.value == 2.0 and math.isnan(single.low)


def test_mean_ci():
    est = mean_ci([9.0, 10.0, 11.0])
    assert est.value == 10.0 and est.low < 10.0 < est.high
    assert est.high - est.low == pytest.approx(2 * 4.302653 * 1 / math.sqrt(3), rel=1e-5)  # t(0.975, 2)
    assert math.isnan(mean_ci([3.0]).low)
    assert mean_ci([3.0]).to_dict()["low"] is None


# --- The gate ---


def test_gate_pass_for_same_distribution():
    res = gate([10.0, 10.2, 9.9, 10.1, 10.3], [10.1, 10.0, 10.2, 9.8, 10.0])
    assert res.status == "pass" and not res.failed
    assert res.ci[0] <= 1.0 <= res.ci[1]


def test_gate_flags_regression_with_advice():
    current, baseline = [8.5, 8.6, 8.4, 8.7, 8.5], [10.1, 10.0, 10.2, 9.8, 10.0]
    res = gate(current, baseline, metric="assisted tokens/s")
    assert res.status == "regression" and res.failed
    # The Hodges-Lehmann ratio: the median of all 25 current/baseline ratios.
    assert res.ratio == pytest.approx(statistics.median(c / b for c in current for b in baseline))
    assert res.ci[0] <= res.ratio <= res.ci[1] < 1.0 - DEFAULT_MARGIN
    assert res.p_value < DEFAULT_ALPHA
    assert res.test == "Mann-Whitney U"
    assert "--update-baselines" in res.message and "assisted tokens/s" in res.message
    assert "8.54" in res.message and "10.02" in res.message


def test_one_stalled_round_does_not_make_an_unchanged_build_inconclusive():
    """A host hiccup in one plain round (its tokens/s halved, so that round's speedup ~2.6x) moved a
    ratio of means and its bootstrap interval enough to leave an unchanged build inconclusive; the
    median of pairwise ratios and the Mann-Whitney interval do not move."""
    baseline = [1.37, 1.35, 1.40, 1.36, 1.42]
    steady = [1.36, 1.34, 1.38, 1.33, 1.35, 1.37, 1.36, 1.34, 1.39, 1.35]
    stalled = [2.6, *steady[1:]]
    assert gate(steady, baseline).status == "pass"
    res = gate(stalled, baseline)
    assert res.status == "pass", res.message
    assert res.ratio == pytest.approx(gate(steady, baseline).ratio, rel=0.01)
    # A real drop is still caught, hiccup or not.
    slower = [x * 0.85 for x in steady]
    assert gate([2.6, *slower[1:]], baseline).status == "regression"


def test_gate_against_a_single_stored_number():
    reg = gate([8.5, 8.6, 8.4, 8.7, 8.5], 10.0)
    assert reg.status == "regression" and reg.test == "one-sample t-test on log values"
    imp = gate([12.5, 12.6, 12.4, 12.7, 12.5], 10.0)
    assert imp.status == "improvement" and "--update-baselines" in imp.message


def test_gate_needs_both_size_and_significance():
    # Significant but small (3% slower, almost no noise): within the margin, so it passes.
    small = gate([9.70, 9.71, 9.69, 9.70, 9.70], [10.0, 10.01, 9.99, 10.0, 10.0])
    assert small.status == "pass" and small.p_value < DEFAULT_ALPHA
    # Large but noisy (ratio ~0.85 with samples all over the place): not significant, and not a pass
    # either: the run cannot tell, and says so.
    noisy = gate([5.0, 12.0, 7.0, 11.0, 7.5], [10.0, 6.0, 13.0, 9.0, 12.0])
    assert noisy.ratio < 1.0 - DEFAULT_MARGIN and noisy.status == "inconclusive"
    assert not noisy.conclusive and not noisy.failed and "--perf-repetitions" in noisy.message


def test_settle_decides_an_inconclusive_gate_on_its_estimate():
    """Out of rounds, the estimate decides: an unchanged build whose spread reaches past the margin
    passes (with the verdict in the message); a large drop the test could not confirm fails; a
    conclusive answer is left as it is."""
    baseline = [1.37, 1.52, 1.33, 1.27, 1.55]
    unchanged = [1.38, 1.46, 1.25, 1.49, 1.31, 1.36, 1.51, 1.27, 1.40, 1.39, 1.24, 1.47, 1.33, 1.37, 1.44]
    wide = gate(unchanged, baseline)
    assert wide.status == "inconclusive" and 1.0 - DEFAULT_MARGIN < wide.ratio, wide.message
    passed = settle(wide)
    assert passed.status == "pass" and "SETTLED AS A PASS" in passed.message
    assert (passed.ratio, passed.ci, passed.p_value) == (wide.ratio, wide.ci, wide.p_value)
    noisy = gate([5.0, 12.0, 7.0, 11.0, 7.5], [10.0, 6.0, 13.0, 9.0, 12.0])
    failed = settle(noisy)
    assert failed.failed and "SETTLED AS A REGRESSION" in failed.message
    clear = gate([1.36, 1.34, 1.38, 1.33, 1.35], [1.37, 1.35, 1.40, 1.36, 1.42])
    assert settle(clear) == clear
    slower = gate([8.5, 8.6, 8.4, 8.7, 8.5], [10.0, 10.1, 9.9, 10.0, 10.0])
    assert settle(slower) == slower and slower.failed


def test_settled_gate_keeps_false_alarms_rare_and_catches_more():
    """The figures quoted in settle's docstring: 15 current rounds against a 5-round baseline."""
    kw = dict(n=5, n_current=15, trials=4000, seed=7, settled=True)
    assert simulate_gate(0.05, slowdown=0.0, **kw) < 0.005
    assert simulate_gate(0.05, slowdown=0.15, **kw) > 0.99
    assert simulate_gate(0.08, slowdown=0.0, **kw) < 0.04
    test_only = simulate_gate(0.08, 5, 0.10, 4000, 7, n_current=15)
    assert simulate_gate(0.08, slowdown=0.10, **kw) > test_only + 0.15


def test_gate_lower_is_better():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    slower = gate([120.0, 121.0, 119.0, 120.5, 119.5], base, higher_is_better=False, metric="ms/token")
    assert slower.status == "regression"
    faster = gate([80.0, 81.0, 79.0, 80.5, 79.5], base, higher_is_better=False, metric="ms/token")
    assert faster.status == "improvement"


def test_gate_with_too_few_baseline_samples_for_mann_whitney():
    res = gate([8.5, 8.6, 8.4], [10.0, 10.1])  # 3-vs-2 Mann-Whitney cannot reach alpha=0.01
    assert res.test == "Welch t-test on log values"
    assert res.status == "regression"


def test_gate_identical_values():
    assert gate([10.0] * 5, [10.0] * 5).status == "pass"
    assert gate([5.0] * 5, 10.0).status == "regression"


def test_gate_rejects_bad_input():
    with pytest.raises(HarnessError, match="--repeats"):
        gate([9.0], 10.0)
    with pytest.raises(HarnessError, match="no samples"):
        gate([], [10.0, 10.0])
    with pytest.raises(HarnessError, match="positive"):
        gate([1.0, float("nan")], 10.0)
    with pytest.raises(HarnessError, match="margin"):
        gate([1.0, 2.0], 10.0, margin=1.5)


# --- Calibration: the numbers quoted in harness/theory/stats.py and the README ---


@pytest.mark.parametrize("baseline", ["samples", "mean"])
def test_false_alarm_rate_below_one_percent(baseline):
    rate = simulate_gate(cv=0.05, n=5, slowdown=0.0, trials=2000, seed=0, baseline=baseline)
    assert rate < 0.01


@pytest.mark.parametrize("baseline", ["samples", "mean"])
def test_fifteen_percent_slowdown_caught(baseline):
    rate = simulate_gate(cv=0.05, n=5, slowdown=0.15, trials=2000, seed=1, baseline=baseline)
    assert rate > 0.90


def test_simulation_behaves_like_a_power_curve():
    rates = [simulate_gate(0.05, 5, s, 2000, 2) for s in (0.0, 0.05, 0.10, 0.15, 0.25)]
    assert rates == sorted(rates)
    assert rates[0] < 0.01 and rates[-1] > 0.99
    # More repetitions buy power at high noise.
    assert simulate_gate(0.08, 10, 0.15, 2000, 3) > simulate_gate(0.08, 5, 0.15, 2000, 3) + 0.2


@pytest.mark.parametrize(
    ("a", "b", "differing", "divergence"),
    [
        ([1, 2, 3], [1, 2, 3], None, None),
        ([1, 2, 3], [1, 5, 3], 1, 1),
        ([1, 2], [1, 2, 3], None, 2),  # one stopped early: they part where it ended
        ([], [4], None, 0),
    ],
)
def test_where_two_outputs_part(a, b, differing, divergence):
    assert first_differing_token(a, b) == differing
    assert first_divergence(a, b) == divergence == first_divergence(b, a)


@pytest.mark.parametrize(
    ("emitted", "budget_reached", "expected"),
    [
        ([4, 2, 1], False, [[True] * 3, [True, False, False], [False] * 3]),
        ([4, 4, 2], True, [[True] * 3, [True] * 3]),  # the last round the budget may have cut: left out
        ([4, 4], True, [[True] * 3, [True] * 3]),  # a whole last round is judged
        ([5, 4], False, [[True] * 3]),  # more than K + 1 tokens: not a chain of K
    ],
)
def test_an_engines_rounds_are_judged_as_a_chain_of_k(emitted, budget_reached, expected):
    assert analysis.chain_rounds(emitted, 3, budget_reached) == expected


@pytest.mark.parametrize(
    ("drafts", "draft_tokens", "accepted", "expected"),
    [
        (8, 24, [8, 8, 7], [[8, 8], [8, 8], [8, 7]]),
        (8, 23, [8, 8, 7], [[8, 8], [8, 8], [7, 7]]),  # the last draft cut to two by the budget
        (4, 10, [3, 1, 0], [[4, 3], [3, 1], [3, 0]]),  # one draft of one token
        (0, 0, [], []),
    ],
)
def test_a_deployments_counters_give_drafted_and_accepted_per_position(
    drafts, draft_tokens, accepted, expected
):
    counts = analysis.positions_of_counters(drafts, draft_tokens, accepted, 3)
    assert counts == expected
    assert sum(d for d, _ in counts) == draft_tokens


def test_acceptance_length_counts_tokens_per_verification():
    # vLLM's: 1 + accepted / drafts, a draft being a round that proposed (position 1's drafted count).
    assert analysis.acceptance_length([[8, 6], [8, 4], [7, 2]], 40, 9) == pytest.approx(1 + 12 / 8)
    assert analysis.acceptance_length([[8, 0], [8, 0]], 9, 9) == pytest.approx(1.0)  # nothing accepted
    assert analysis.acceptance_length(None, 32, 8) == pytest.approx(4.0)  # no positions: per forward
    assert analysis.acceptance_length([[0, 0]], 1, 1) is None
