"""Statistics for speed results: confidence intervals, the regression gate, and speculative-decoding theory.

The gate follows asv's rule (``asv compare``): a change counts only when it is both *large* (the ratio is
beyond a relative margin) and *real* (a one-sided test says the two sets of repetitions differ).
pytest-benchmark's ``--benchmark-compare-fail`` checks the threshold alone, which on a noisy 2-core machine
fails CI on noise; asv adds the Mann-Whitney U test, which we use whenever the baseline kept its samples.
With samples on both sides the ratio is the Hodges-Lehmann estimate that goes with that test (the median
of all current/baseline ratios) and its interval the test's own, inverted: one stalled round (a host
hiccup) moves neither, where it moved a ratio of means and its bootstrap interval enough to leave an
unchanged build "inconclusive".

Noise model used for calibration (``simulate_gate``): tokens/s per repetition is log-normal around the true
rate with a given coefficient of variation. Defaults were picked from that simulation; see ``simulate_gate``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from harness.base.errors import HarnessError

# Chosen with simulate_gate (log-normal noise, n=5 repetitions, 20000 trials, seed 7):
#   CV 5%: unchanged build flagged 0.19% (baseline with samples, Mann-Whitney) / 0.29% (baseline stored as one
#          number, t-test on logs); a 15% slowdown caught 92.9% / 97.0%; a 10% slowdown 53% / 65%.
#   CV 8%: false alarms 0.60% / 1.8%, a 15% slowdown caught only 54% / 71% - at that noise use 10 repetitions
#          (then 94% / 99% caught, false alarms 0.40% / 0.90%).
# Trade-off: margin 0.10 cuts false alarms to 0.02% / 0.04% but catches 15% drops 91% / 95% and 10% drops only
# 40% / 47%; margin 0.05 raises false alarms to 0.60% / 1.8% at CV 5%. alpha 0.01 is near the smallest level
# a 5-vs-5 Mann-Whitney test can reach (its smallest one-sided p-value is 1/252 = 0.004), so a stricter
# alpha would need more repetitions.
DEFAULT_MARGIN = 0.08
DEFAULT_ALPHA = 0.01
_BOOTSTRAP_SEED = 20240713  # fixed so a CI (and a baseline file holding it) is reproducible byte for byte

Status = Literal["pass", "regression", "improvement", "inconclusive", "not comparable"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval; low/high are NaN when n is too small for an interval."""

    value: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float | int | None]:
        # NaN is not valid JSON; None says "no interval" explicitly in baseline files.
        def clean(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        return {"value": clean(self.value), "low": clean(self.low), "high": clean(self.high), "n": self.n}


@dataclass(frozen=True)
class GateResult:
    status: Status
    ratio: float  # current over baseline: Hodges-Lehmann with baseline samples, else mean / the number
    p_value: float  # one-sided, in the direction the ratio points
    ci: tuple[float, float]  # confidence interval of the ratio
    message: str
    test: str = ""  # which test produced p_value

    @property
    def failed(self) -> bool:
        """A measured regression."""
        return self.status == "regression"

    @property
    def conclusive(self) -> bool:
        """False when the run's own noise could not tell pass from regression."""
        return self.status != "inconclusive"

    def as_inconclusive(self, why: str) -> GateResult:
        return dataclasses.replace(self, status="inconclusive", message=f"{self.message} INCONCLUSIVE: {why}")

    def as_not_comparable(self, metric: str, why: str) -> GateResult:
        """The same figures, judged not at all: a verdict across host kinds would be the hosts'."""
        return dataclasses.replace(
            self,
            status="not comparable",
            message=f"{metric}: ratio {self.ratio:.3f}x to the baseline, not comparable: {why}",
        )


def _as_positive_array(values: Sequence[float] | float, what: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if arr.size == 0:
        raise HarnessError(f"{what}: no samples; measure at least 2 repetitions (--repeats) before comparing")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise HarnessError(
            f"{what}: every sample must be a positive finite number, got {arr.tolist()}; "
            "a zero or NaN rate means the run produced no tokens - check the run's log"
        )
    return arr


def mean_ci(samples: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean with a Student-t interval (better coverage than a bootstrap at the 3-10 samples we take)."""
    arr = np.asarray(samples, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        raise HarnessError(f"mean_ci needs finite samples, got {list(samples)}")
    mean = float(arr.mean())
    if arr.size < 2:
        return Estimate(mean, math.nan, math.nan, int(arr.size))
    sem = float(stats.sem(arr))
    if sem == 0.0:
        return Estimate(mean, mean, mean, int(arr.size))
    low, high = stats.t.interval(confidence, df=arr.size - 1, loc=mean, scale=sem)
    return Estimate(mean, float(low), float(high), int(arr.size))


def _ratio_of_means(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def _bootstrap_ratio(
    numerator: np.ndarray, denominator: np.ndarray | None, confidence: float, paired: bool
) -> tuple[float, float]:
    """CI of mean(numerator)/mean(denominator); denominator None means "divide by a fixed 1"."""
    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    if denominator is None:
        data: tuple[np.ndarray, ...] = (numerator,)

        def statistic(x: np.ndarray, axis: int = -1) -> np.ndarray:
            return np.mean(x, axis=axis)
    else:
        data = (numerator, denominator)
        statistic = _ratio_of_means
    if np.ptp(numerator) == 0 and (denominator is None or np.ptp(denominator) == 0):
        # No spread at all: the bootstrap distribution is a point and BCa would divide by zero.
        point = float(statistic(*data))
        return point, point
    res = stats.bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=4999,
        method="BCa",
        rng=rng,
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):
        # BCa fails on some tiny, lumpy samples; the percentile interval is still meaningful there.
        res = stats.bootstrap(
            data,
            statistic,
            paired=paired,
            vectorized=True,
            confidence_level=confidence,
            n_resamples=4999,
            method="percentile",
            rng=np.random.default_rng(_BOOTSTRAP_SEED),
        )
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return low, high


def speedup_ci(
    plain_tps: Sequence[float],
    assisted_tps: Sequence[float],
    confidence: float = 0.95,
    *,
    paired: bool = True,
) -> Estimate:
    """Speedup = mean(assisted tokens/s) / mean(plain tokens/s), with a bootstrap CI.

    ``paired=True`` (the suite's default) means index i of both lists is one interleaved repetition, so
    the bootstrap resamples repetitions and slow phases of the machine cancel within each pair. Pass
    ``paired=False`` for independently measured lists (they may then differ in length).
    """
    plain = _as_positive_array(plain_tps, "plain tokens/s")
    assisted = _as_positive_array(assisted_tps, "assisted tokens/s")
    if paired and plain.size != assisted.size:
        raise HarnessError(
            f"paired speedup needs one plain and one assisted sample per repetition, got {plain.size} plain "
            f"and {assisted.size} assisted; pass paired=False if the runs were not interleaved"
        )
    value = float(assisted.mean() / plain.mean())
    n = int(min(plain.size, assisted.size))
    if n < 2:
        return Estimate(value, math.nan, math.nan, n)
    low, high = _bootstrap_ratio(assisted, plain, confidence, paired)
    return Estimate(value, low, high, n)


def _mwu_can_reach(n_current: int, n_baseline: int, alpha: float) -> bool:
    # The smallest one-sided p-value of an exact Mann-Whitney test is 1 / C(n+m, n) (as asv checks);
    # with fewer samples the test can never flag anything, so another test must be used.
    return 1.0 / math.comb(n_current + n_baseline, n_current) < alpha


def _one_sided_pvalues(
    current: np.ndarray, baseline: np.ndarray, alpha: float, higher_is_better: bool
) -> tuple[np.ndarray, np.ndarray, str]:
    """Row-wise (p that current is worse, p that current is better, test name) for 2-D inputs.

    Rows are independent comparisons; the gate passes one row, ``simulate_gate`` thousands, so both
    run exactly the same rule (and the simulation stays fast because scipy's tests take ``axis``).
    """
    lower, upper = ("less", "greater") if higher_is_better else ("greater", "less")
    log_cur = np.log(current)
    n_cur, n_base = current.shape[1], baseline.shape[1]
    if n_base >= 2 and _mwu_can_reach(n_cur, n_base, alpha):
        p_worse = stats.mannwhitneyu(current, baseline, alternative=lower, axis=1).pvalue
        p_better = stats.mannwhitneyu(current, baseline, alternative=upper, axis=1).pvalue
        return np.asarray(p_worse, float), np.asarray(p_better, float), "Mann-Whitney U"
    if n_base >= 2:
        log_base = np.log(baseline)
        no_spread = (np.ptp(log_cur, axis=1) == 0) & (np.ptp(log_base, axis=1) == 0)
        shift = log_cur.mean(axis=1) - log_base.mean(axis=1)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # zero-variance rows are handled below
            p_worse = stats.ttest_ind(log_cur, log_base, equal_var=False, alternative=lower, axis=1).pvalue
            p_better = stats.ttest_ind(log_cur, log_base, equal_var=False, alternative=upper, axis=1).pvalue
        test = "Welch t-test on log values"
    else:
        if n_cur < 2:
            raise HarnessError(
                "a single current sample against a single baseline number cannot be tested for significance;"
                " measure at least 2 repetitions (--repeats 5 is the calibrated setting)"
            )
        diff = log_cur - np.log(baseline)
        no_spread = np.ptp(diff, axis=1) == 0
        shift = diff.mean(axis=1)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p_worse = stats.ttest_1samp(diff, 0.0, alternative=lower, axis=1).pvalue
            p_better = stats.ttest_1samp(diff, 0.0, alternative=upper, axis=1).pvalue
        test = "one-sample t-test on log values"
    # Identical repeated values (e.g. a deterministic counter): a difference is certain, no difference is
    # certainly none; the t statistic would be 0/0 there.
    worse = shift < 0 if higher_is_better else shift > 0
    better = shift > 0 if higher_is_better else shift < 0
    p_worse = np.where(no_spread, np.where(worse, 0.0, 1.0), p_worse)
    p_better = np.where(no_spread, np.where(better, 0.0, 1.0), p_better)
    return p_worse, p_better, test


_REGRESSION, _PASS, _IMPROVEMENT = -1, 0, 1
_STATUS_NAMES: dict[int, Status] = {_REGRESSION: "regression", _PASS: "pass", _IMPROVEMENT: "improvement"}


def _decide(
    current: np.ndarray, baseline: np.ndarray, margin: float, alpha: float, higher_is_better: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The gate's rule, row-wise, without its interval: (status code, ratio, p_value, test)."""
    if baseline.shape[1] >= 2:
        ratio = _hodges_lehmann_ratio(current, baseline)
    else:
        ratio = current.mean(axis=1) / baseline.mean(axis=1)
    goodness = ratio if higher_is_better else 1.0 / ratio
    p_worse, p_better, test = _one_sided_pvalues(current, baseline, alpha, higher_is_better)
    status = np.where(
        (goodness < 1.0 - margin) & (p_worse < alpha),
        _REGRESSION,
        np.where((goodness > 1.0 + margin) & (p_better < alpha), _IMPROVEMENT, _PASS),
    )
    p_value = np.where(goodness < 1.0, p_worse, p_better)
    return status, ratio, p_value, test


def _hodges_lehmann_ratio(current: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """Row-wise median of every current/baseline ratio (on logs: the Hodges-Lehmann shift)."""
    diffs = np.log(current)[:, :, None] - np.log(baseline)[:, None, :]
    return np.exp(np.median(diffs.reshape(diffs.shape[0], -1), axis=1))


def _hodges_lehmann_interval(
    current: np.ndarray, baseline: np.ndarray, confidence: float
) -> tuple[float, float]:
    """The interval of the Hodges-Lehmann ratio that inverts the Mann-Whitney test: the k-th smallest
    and largest of the n*m pairwise log differences, k from the test's normal approximation
    (Hollander & Wolfe). No library offers this interval; scipy has the test, not its inversion."""
    diffs = np.sort(np.subtract.outer(np.log(current), np.log(baseline)).ravel())
    n, m = current.size, baseline.size
    z = stats.norm.ppf(0.5 + confidence / 2.0)
    k = int(math.floor(n * m / 2.0 - z * math.sqrt(n * m * (n + m + 1) / 12.0)))
    k = min(max(k, 0), diffs.size - 1)
    return float(np.exp(diffs[k])), float(np.exp(diffs[diffs.size - 1 - k]))


def _check_gate_params(margin: float, alpha: float) -> None:
    if not 0.0 <= margin < 1.0:
        raise HarnessError(f"gate margin must be in [0, 1), got {margin}; 0.08 means 8%")
    if not 0.0 < alpha < 1.0:
        raise HarnessError(f"gate alpha must be in (0, 1), got {alpha}; 0.01 is the calibrated default")


def gate(
    current: Sequence[float],
    baseline: float | Sequence[float],
    *,
    margin: float = DEFAULT_MARGIN,
    alpha: float = DEFAULT_ALPHA,
    higher_is_better: bool = True,
    metric: str = "tokens/s",
    confidence: float = 0.95,
    gated: bool = True,
) -> GateResult:
    """Compare repeated measurements with a baseline; "regression" only if large AND significant.
    ``gated=False``: a figure reported beside a gate, never failing a run; its drop is said as one,
    not as a REGRESSION verdict, whose word is kept for what fails CI.

    Large: the ratio is worse than ``1 - margin`` (better than ``1 + margin`` for improvement); with
    baseline samples it is the median of all current/baseline ratios, with one stored number the
    ratio of the current mean to it.
    Significant: a one-sided test at level ``alpha`` - Mann-Whitney U against the baseline's samples when
    it kept enough of them (as asv does), a Welch t-test on logs for too few, and a one-sample t-test on
    log values when the baseline is a single stored number.
    """
    _check_gate_params(margin, alpha)
    cur = _as_positive_array(current, f"current {metric}")
    base = _as_positive_array(baseline, f"baseline {metric}")
    codes, ratios, p_values, test = _decide(cur[None, :], base[None, :], margin, alpha, higher_is_better)
    status, ratio, p_value = _STATUS_NAMES[int(codes[0])], float(ratios[0]), float(p_values[0])
    if base.size >= 2:
        ci = _hodges_lehmann_interval(cur, base, confidence)
    elif cur.size >= 2:
        ci = _bootstrap_ratio(cur, None, confidence, paired=False)
        ci = (ci[0] / float(base[0]), ci[1] / float(base[0]))
    else:
        ci = (math.nan, math.nan)
    base_mean = float(base.mean())
    # Pass needs evidence: the worst ratio the interval allows must be within the margin. A run whose
    # spread reaches past it, with no significant drop either, cannot tell unchanged from regressed.
    worst = ci[0] if higher_is_better else (1.0 / ci[1] if ci[1] > 0 else math.nan)
    if status == "pass" and not (math.isfinite(worst) and worst >= 1.0 - margin):
        status = "inconclusive"
    what = {
        "pass": f"within the {margin:.0%} margin or not significant at alpha={alpha:g}: pass",
        "regression": (
            f"REGRESSION: worse than the {margin:.0%} margin and significant at alpha={alpha:g}"
            if gated
            else f"slower than the baseline: worse than the {margin:.0%} margin and significant at "
            f"alpha={alpha:g} (not gated: an absolute figure moves with the host)"
        ),
        "improvement": f"improvement beyond the {margin:.0%} margin, significant at alpha={alpha:g}",
        "inconclusive": f"INCONCLUSIVE: the {confidence:.0%} CI reaches below {1.0 - margin:.2f}x without a "
        "significant drop, so this run's spread cannot tell an unchanged build from a regression; rerun on "
        "an idle machine or with more repetitions (--perf-repetitions)",
    }[status]
    how = " (median of current/baseline pairs)" if base.size >= 2 else ""
    message = (
        f"{metric}: current {float(cur.mean()):.4g} (n={cur.size}, median {float(np.median(cur)):.4g}) vs "
        f"baseline {base_mean:.4g} (n={base.size}); ratio {ratio:.3f}x{how}, {confidence:.0%} CI "
        f"{ci[0]:.3f}-{ci[1]:.3f}; p={p_value:.3g} ({test}); {what}."
    )
    if status == "regression":
        message += (
            " If the slowdown is intended (e.g. a deliberate precision change), rerun with"
            " --update-baselines;"
            " otherwise bisect the change that caused it."
        )
    elif status == "improvement":
        message += " Rerun with --update-baselines to lock the gain in, so a later loss of it is caught."
    return GateResult(status, ratio, p_value, ci, message, test)


def settle(
    result: GateResult, *, margin: float = DEFAULT_MARGIN, higher_is_better: bool = True
) -> GateResult:
    """The final answer of a gate still inconclusive after every round a run may measure: the
    estimate decides - a regression when the ratio itself lies beyond the margin, a pass otherwise.

    Failing on "inconclusive" instead turned a noisy host into a red CI for an unchanged build (the
    speedup's ratio 0.988x, its interval 0.904-1.046 after 15 rounds against a 5-round baseline).
    Settled after three batches (15 current rounds against 5 baseline rounds; 20000 simulated runs,
    log-normal noise, seed 7): an unchanged build fails 0.12% of runs at CV 5% and 2.7% at CV 8%; a 15%
    slowdown is caught in 99.8% / 97%, a 10% one in 80% / 70% (the test alone: 77% / 45%).
    """
    if result.conclusive:
        return result
    _check_gate_params(margin, DEFAULT_ALPHA)
    worse = result.ratio < 1.0 - margin if higher_is_better else result.ratio > 1.0 / (1.0 - margin)
    status: Status = "regression" if worse else "pass"
    verdict = (
        f"SETTLED AS A REGRESSION: out of rounds, and the estimate itself ({result.ratio:.3f}x) lies beyond "
        f"the {margin:.0%} margin"
        if worse
        else f"SETTLED AS A PASS: out of rounds, and the estimate itself ({result.ratio:.3f}x) lies within "
        f"the {margin:.0%} margin"
    )
    return dataclasses.replace(result, status=status, message=f"{result.message} {verdict}.")


def simulate_gate(
    cv: float,
    n: int,
    slowdown: float,
    trials: int,
    seed: int,
    *,
    margin: float = DEFAULT_MARGIN,
    alpha: float = DEFAULT_ALPHA,
    baseline: Literal["samples", "mean"] = "samples",
    n_current: int | None = None,
    settled: bool = False,
) -> float:
    """Fraction of simulated runs that ``gate`` flags as a regression.

    Each trial draws a baseline of ``n`` log-normal repetitions (true rate 1, coefficient of variation
    ``cv``) and a current run of ``n_current`` (default ``n``) repetitions at true rate
    ``1 - slowdown``. With slowdown 0 this is the false-alarm rate; otherwise the detection rate.
    ``baseline="mean"`` stores only the baseline's mean, as a baseline file without samples would.
    Uses the gate's own decision rule; ``settled`` adds ``settle``'s for what it leaves inconclusive.
    """
    _check_gate_params(margin, alpha)
    if baseline not in ("samples", "mean"):
        raise HarnessError(f"baseline must be 'samples' or 'mean', got {baseline!r}")
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(cv * cv))  # log-normal sigma that gives this coefficient of variation
    base = np.exp(rng.normal(0.0, sigma, (trials, n)))
    cur = (1.0 - slowdown) * np.exp(rng.normal(0.0, sigma, (trials, n_current or n)))
    if baseline == "mean":
        base = base.mean(axis=1, keepdims=True)
    codes, ratios, *_ = _decide(cur, base, margin, alpha, True)
    flagged = codes == _REGRESSION
    if settled:
        # A pass or an improvement cannot have its estimate beyond the margin, so this is settle's rule.
        flagged |= ratios < 1.0 - margin
    return float(np.mean(flagged))
