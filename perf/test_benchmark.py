"""Speed per platform: plain vs assisted tokens/s, speedup with CI, acceptance and theory, gated in CI.

Tiny pairs check the machinery only (their timings say nothing about real models, so they are never
gated against stored baselines). The real offline pair runs the CI subset cases, each gated against
its baseline in ``baselines/<platform>/0001_baseline.json`` (pytest-benchmark's storage format);
``--update-baselines`` writes it instead. Each real case is three pytest-benchmark entries, each a
test of its own: ``-ratio`` (each interleaved round's assisted/plain time per token: the gate's
samples, which ``--benchmark-compare-fail`` gates across hosts), ``-assisted`` and ``-plain`` (each
round one decode's time per token). A session table of every measured case is printed at the end.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from pathlib import Path

import pytest

from harness import pytest_plugin as plugin
from harness import report
from harness.decoding import engines
from harness.experiments import bench
from harness.pairs import models
from harness.settings import baselines
from harness.settings.results import read_rows, runs_dir
from harness.theory import stats

pytestmark = pytest.mark.perf

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "baselines"

TINY_REPETITIONS = 3
# Load average above the run's own threads that marks the machine as busy.
BUSY_LOAD_MARGIN = 1.0
# A slowdown of this size must be caught; the gate's margin is 8%, so 15% leaves room for noise.
SLOWDOWN = 0.15

# Numbers every measurement must report, finite.
REQUIRED = (
    "plain_tokens_per_s",
    "assisted_tokens_per_s",
    "speedup",
    "speedup_low",
    "speedup_high",
    "plain_time_per_token_ms",
    "assisted_time_per_token_ms",
    "plain_prefill_ms",
    "assisted_prefill_ms",
    "acceptance_rate",
    "alpha",
    "tokens_per_target_forward",
    "target_forward_ms",
    "verify_forward_ms",
    "draft_forward_ms",
    "c",
    "v",
    "predicted_speedup",
    "predicted_speedup_verify",
    "plain_non_forward_share",
    "assisted_non_forward_share",
)
# The tiny pair the engine axis runs its tiny tiers on: the offline pair's family.
ENGINE_TINY = ("tiny-qwen2",)
# What a token tree's case leaves out: Leviathan's prediction is a chain's (a tree's is planned from
# the draft's ranks, ``python -m harness.trees``).
NOT_PREDICTED_FOR_TREES = {"predicted_speedup", "predicted_speedup_verify"}


def tiny_case(pair_name: str) -> bench.BenchCase:
    return bench.case(pair_name, 64, 32, num_assistant_tokens=5)


registered_case, ort_case = bench.registered_case, bench.ort_case


def real_case(pair_name: str, which: str) -> bench.BenchCase:
    """The CI subset cases: short, because the 1.5B fp32 target decodes only ~2 tokens/s here.

    "registered" gates the pair's default configuration; "fp32" the stock fp32 pair, the plain
    reference with no quantization or hand-written kernel involved; "tree" the registered pair with
    a token tree (``bench.REAL_TREE``) in the harness's own loop; "chain" the registered pair's draft
    chain alone, without its proposals from the context, in transformers' loop."""
    spec = models.get_pair(pair_name)
    offline = {"fp32": bench.fp32_case, "tree": bench.tree_case, "chain": bench.chain_case}
    if which in offline and spec.name == models.DEFAULT_PAIR:
        return offline[which](spec)
    if which != "registered":
        pytest.skip(f"{spec.name} runs its registered case only (the {which} case is the offline pair's)")
    return registered_case(spec)


def load(pairs, case: bench.BenchCase) -> models.LoadedPair:
    # The case's run is the cache's key: a case of the registered configuration shares its pair with
    # the other suites' tests of the pair.
    return pairs.load(models.get_pair(case.pair), case.run)


def check_machinery(m: bench.CaseMeasurement, exact_outputs: bool) -> None:
    s = m.summary()
    # What an engine's own books do not hold (``Engine.unbooked``) is absent, never made up.
    absent = set(engines.engine_class(m.case.run.target.engine).unbooked)
    if m.case.run.decoding.draft_tree:
        absent = absent | NOT_PREDICTED_FOR_TREES
    missing = [
        k for k in REQUIRED if k not in absent and (not isinstance(s[k], float) or not math.isfinite(s[k]))
    ]
    assert not missing, f"{m.case.case_id}: missing or non-finite {missing} in {s}"
    # What the engine does not book is said as absent, never as a number made up in its place.
    assert all(s[k] is None or not math.isfinite(s[k]) for k in absent), {k: s[k] for k in absent}
    assert s["repetitions"] == len(s["plain_tokens_per_s_samples"]) == len(s["assisted_tokens_per_s_samples"])
    assert all(x > 0 for x in s["plain_tokens_per_s_samples"] + s["assisted_tokens_per_s_samples"])
    assert s["speedup_low"] <= s["speedup"] <= s["speedup_high"], s
    assert 0.0 < s["acceptance_rate"] <= 1.0
    if "alpha" not in absent:
        assert s["acceptance_rate"] <= s["alpha"] <= 1.0  # the per-token rate never undercounts
        assert s["c"] > 0
    if "predicted_speedup" not in absent:
        assert s["predicted_speedup"] > 0 and s["predicted_speedup_verify"] > 0
    # A round emits at most one token per draft step (K, or a tree's depth; a proposal from the
    # context, up to its length) and the target's own.
    steps = max(m.case.key().draft_steps, m.case.run.decoding.context_draft)
    assert 1.0 <= s["tokens_per_target_forward"] <= steps + 1
    assert s["v"] > 0
    for mode in ("plain", "assisted"):
        assert 0.0 <= s[f"{mode}_non_forward_share"] < 1.0
        assert all(x.new_tokens == m.case.new_tokens for x in getattr(m, mode))
    assert all(x.drafted > 0 for x in m.assisted), "an assisted run drafted nothing"
    assert all(x.drafted == 0 and x.draft_forwards == 0 for x in m.plain), "a plain run used the draft"
    if exact_outputs:
        assert m.identical_outputs, f"{m.case.case_id}: assisted output differs from plain at fp32 greedy"


@pytest.mark.pairs(real=False)
def test_benchmark_machinery_tiny(pairs, pair_name, tmp_path, platform_name, bench_results):
    case = tiny_case(pair_name)
    rows_path = tmp_path / "rows" / "bench.jsonl"
    m = bench.measure_case(
        load(pairs, case), case, TINY_REPETITIONS, rows_path=rows_path, platform=platform_name
    )
    bench_results.append((m, "tiny: not gated"))
    check_machinery(m, exact_outputs=True)

    # Every round is a row pair in the JSONL, and the report rebuilds the same speedups from them.
    rows = read_rows(rows_path)
    assert sorted((r.example, r.mode) for r in rows) == sorted(
        (i, mode) for i in range(1, TINY_REPETITIONS + 1) for mode in ("plain", "assisted")
    )
    assert {r.run_id for r in rows} == {m.run_id}
    paired = sorted(report.compare_rows(rows), key=lambda p: p["example"])
    assert [p["speedup"] for p in paired] == pytest.approx(
        [a / p for p, a in zip(m.plain_tps, m.assisted_tps, strict=True)]
    )
    assert all(p["identical"] for p in paired)
    written = report.regen_results(rows, tmp_path / "results")
    md = next(p for p in written if p.suffix == ".md")
    assert md == tmp_path / "results" / platform_name / f"{pair_name}.md"
    assert "Plain vs assisted" in md.read_text() and all(p.stat().st_size > 0 for p in written)


# Each real case is three pytest-benchmark entries, one test each: the gating ratio and the two arms
# (``-k plain`` / ``-k assisted`` / ``-k ratio`` select them); the case is measured once, by the
# first of them to run.
ARMS = pytest.mark.parametrize("arm", baselines.ARMS)


@pytest.mark.pairs(tiny=False)
@ARMS
@pytest.mark.parametrize("which", ["registered", "fp32", "tree", "chain"])
def test_benchmark_real(
    pairs, pair_name, which, arm, benchmark, request, platform_name, bench_results, cases
):
    run_real_case(
        real_case(pair_name, which), arm, pairs, benchmark, request, platform_name, bench_results, cases
    )


@pytest.mark.pairs(tiny=False)
@pytest.mark.backends("onnxruntime")
@ARMS
def test_benchmark_real_onnxruntime(
    pairs, pair_name, target_backend, arm, benchmark, request, platform_name, bench_results, cases
):
    """The registered case with an ONNX Runtime target, gated like the torch one; its table row sits
    beside the torch target's in the session summary and in results/."""
    case = ort_case(models.get_pair(pair_name), target_backend[1])
    run_real_case(case, arm, pairs, benchmark, request, platform_name, bench_results, cases)


@pytest.mark.pairs(tiny=False)
@ARMS
def test_benchmark_real_engine(
    pairs, pair_name, engine, arm, benchmark, request, platform_name, bench_results, cases
):
    """An engine's own speculative decoding (its own draft, its constant K) against its own plain
    decoding, gated like the transformers loop's cases against this platform's baseline."""
    provider = request.config.getoption("--execution-provider")
    case = bench.engine_case(models.get_pair(pair_name), engine, provider)
    run_real_case(case, arm, pairs, benchmark, request, platform_name, bench_results, cases)


@pytest.mark.pairs(tiny=ENGINE_TINY, real=False)
def test_benchmark_machinery_tiny_engine(pairs, pair_name, engine, tmp_path, platform_name, bench_results):
    """The benchmark's measurement, summary and rows on an engine's loop: every number the gate reads
    is finite and consistent, and the rows and the case id say the engine."""
    case = bench.engine_case(models.get_pair(pair_name), engine, prompt_tokens=64, k=4)
    rows_path = tmp_path / "rows" / "bench.jsonl"
    m = bench.measure_case(
        load(pairs, case), case, TINY_REPETITIONS, rows_path=rows_path, platform=platform_name
    )
    bench_results.append((m, "tiny: not gated"))
    check_machinery(m, exact_outputs=False)
    assert {r.engine for r in read_rows(rows_path)} == {engine}
    assert m.case.case_id.endswith(f"-{engine}")


# How many more batches of --perf-repetitions rounds an inconclusive speedup gate measures before
# it answers (so at most three times the rounds).
EXTRA_BATCHES = 2


def _gates(m: bench.CaseMeasurement, platform_name: str, load_before: float) -> dict:
    """The gates' answers for ``m``; other work on the machine (a load average above this run's own
    threads) makes the timings unreliable whatever their spread says, so the speedup is then at best
    inconclusive."""
    gates = m.gate(BASELINES, platform_name)
    busy = max(load_before, os.getloadavg()[0])
    if busy > m.threads + BUSY_LOAD_MARGIN and gates["speedup"].status != "regression":
        gates["speedup"] = gates["speedup"].as_inconclusive(
            f"the machine was busy (load average {busy:.1f} on {m.threads} threads); rerun on an idle machine"
        )
    return gates


@dataclasses.dataclass
class CaseOutcome:
    """A real case measured (and gated, or its baseline written) once, for its three entries."""

    m: bench.CaseMeasurement | None = None
    gates: dict | None = None
    held_to: str | None = None
    not_gated: str | None = None
    failure: str | None = None


@pytest.fixture(scope="module")
def cases() -> dict[str, CaseOutcome]:
    return {}


def arm_nodeid(nodeid: str, arm: str, other: str) -> str:
    """The node id of the case's ``other`` entry, from one of its entries' (the arm is the id's last part)."""
    suffix = f"-{arm}]"
    assert nodeid.endswith(suffix), nodeid
    return nodeid[: -len(suffix)] + f"-{other}]"


def measure_and_gate(
    case: bench.BenchCase, request, pairs, platform_name, bench_results, names: dict[str, str]
) -> CaseOutcome:
    """Measure a real case, check it, and gate it or write its baseline (the three entries' names)."""
    pytestconfig = request.config
    pair = load(pairs, case)
    repetitions = pytestconfig.getoption("--perf-repetitions")
    load_before = os.getloadavg()[0]

    def measure() -> bench.CaseMeasurement:
        return bench.measure_case(
            pair, case, repetitions, rows_path=bench.default_rows_path(platform_name, runs_dir()),
            platform=platform_name,
        )  # fmt: skip

    m = measure()
    target, draft = case.run.target, case.run.draft
    exact = target.kernels == "invariant" or target.precision == draft.precision == "fp32"
    check_machinery(m, exact_outputs=exact)

    if pytestconfig.getoption("--update-baselines"):
        hook = pytestconfig.hook
        machine_info = hook.pytest_benchmark_generate_machine_info(config=pytestconfig)
        hook.pytest_benchmark_update_machine_info(config=pytestconfig, machine_info=machine_info)
        commit_info = hook.pytest_benchmark_generate_commit_info(config=pytestconfig)
        path = baselines.save_baseline(
            BASELINES, platform_name, case.key(), m.record(), names=names,
            machine_info=machine_info, commit_info=commit_info,
        )  # fmt: skip
        bench_results.append((m, f"baseline written: {path.relative_to(ROOT)}"))
        return CaseOutcome(m)

    try:
        held_to = baselines.baseline_platform(BASELINES, platform_name, case.key())
    except baselines.MissingBaselineError as exc:
        bench_results.append((m, "no baseline on any platform"))
        warnings.warn(f"NOT GATED: {exc}", stacklevel=1)
        return CaseOutcome(m, not_gated=f"NOT GATED: {exc}")
    foreign = held_to != platform_name
    if foreign:
        # A host kind without a baseline of its own is held to the nearest platform's: the speedup
        # gate adjusts each round pair by its own forward costs, so it does not depend on the host.
        warnings.warn(
            f"{case.case_id}: no baseline on {platform_name!r}; held to {held_to!r}'s (speedup adjusted "
            "for this host's forward costs; its absolute tokens/s are not comparable). Record this "
            "platform's with --update-baselines on an idle machine",
            stacklevel=1,
        )
    # An inconclusive speedup is measured further (EXTRA_BATCHES more batches at most) before the
    # gate answers; the load average then covers the batches measured.
    m, gates = bench.gate_with_more_rounds(
        m, lambda x: _gates(x, held_to, load_before), measure, EXTRA_BATCHES
    )
    check_machinery(m, exact_outputs=exact)
    where = (
        f" (held to {held_to}'s baseline: none of its own)" if foreign else f" (held to {held_to}'s baseline)"
    )
    bench_results.append((m, ", ".join(f"{name}: {g.status}" for name, g in gates.items()) + where))
    return CaseOutcome(m, gates, held_to)


def run_real_case(
    case: bench.BenchCase, arm: str, pairs, benchmark, request, platform_name, bench_results, cases
) -> None:
    """Record one entry of a real case in pytest-benchmark (its rounds), and on the ratio entry,
    which gates, assert the gate's verdict; the case is measured once, by its first entry."""
    pytestconfig = request.config
    # A compare never reads another case's numbers as this one's: the entry of this test in the
    # compared run must have measured this case. Checked before measuring (pytest-benchmark loads
    # the compared runs at configure time), so a stale baseline costs no decoding.
    for path, entry in plugin.compared_entries(pytestconfig, request.node.nodeid):
        theirs = (entry.get("extra_info") or {}).get("case_id")
        if theirs is not None and theirs != case.case_id:
            pytest.fail(
                f"--benchmark-compare: {path} holds case {theirs} under this test's name, but this run "
                f"measures {case.case_id} (the configuration changed): re-record the baseline with "
                "--update-baselines, or compare against a run of this configuration"
            )
    outcome = cases.get(case.case_id)
    if outcome is None:
        names = {a: arm_nodeid(request.node.nodeid, arm, a) for a in baselines.ARMS}
        # Set first: a measurement that raises fails the case's other entries with where it failed.
        cases[case.case_id] = CaseOutcome(failure=f"its measurement failed in {request.node.nodeid}")
        outcome = cases[case.case_id] = measure_and_gate(
            case, request, pairs, platform_name, bench_results, names
        )
    if outcome.failure:
        pytest.fail(f"{case.case_id}: {outcome.failure}")
    m = outcome.m
    rounds = baselines.arm_rounds(m.plain_tps, m.assisted_tps)[arm]
    summary = m.summary()
    info = baselines.entry_info(case.case_id, arm)
    info.update(summary)
    if outcome.gates is not None:
        info["gate"] = {name: g.status for name, g in outcome.gates.items()}
        info["baseline_platform"] = outcome.held_to
    plugin.record_rounds(benchmark, rounds, baselines.entry_group(case.case_id, arm), info)
    if arm != "ratio" or outcome.gates is None:
        if outcome.not_gated and arm == "ratio":
            pytest.skip(outcome.not_gated)
        return
    gates = outcome.gates
    assert "speedup" in gates and "assisted_tokens_per_s" in gates, f"baseline lacks samples: {gates}"
    # CI fails on the speedup: assisted against plain, both measured in this run, so the host's overall
    # speed cancels out, and the baseline adjusted for this host's forward cost ratios c and v, which
    # do not (two VMs of one slug ran the same commit at 1.15x and 1.04x; HostAdjustment). Absolute
    # tokens/s and the unadjusted speedup depend on the host: reported, and warned about, not gated.
    for name, g in gates.items():
        if (g.failed or not g.conclusive) and name not in ("speedup", "acceptance_by_position"):
            warnings.warn(f"{name}: {g.message}", stacklevel=1)
    # Noise-free: drafted/accepted per position repeat exactly under greedy decoding, on the
    # platform that recorded them (another host kind's arithmetic may differ: reported there).
    exact = gates.get("acceptance_by_position")
    if outcome.held_to != platform_name and exact is not None and exact.failed:
        warnings.warn(f"{exact.message} (against {outcome.held_to}'s baseline)", stacklevel=1)
    else:
        assert exact is None or not exact.failed, exact.message
    speedup = gates["speedup"]
    assert not speedup.failed, speedup.message
    if not speedup.conclusive:
        # Out of rounds (gate_with_more_rounds measured them): the estimate decides, unless the user
        # accepts whatever an inconclusive run says.
        if not pytestconfig.getoption("--allow-inconclusive"):
            speedup = stats.settle(speedup)
            assert not speedup.failed, f"{speedup.message} (--allow-inconclusive accepts it with a warning)"
        warnings.warn(speedup.message, stacklevel=1)


# Opt-in for the real-pair variant: it decodes the real pair three times over (about 9 minutes on
# 2 cores), more than the CI budget for this file; the tiny variant runs the same code every time.
REAL_SLOWDOWN_ENV = "ASSISTED_GENERATION_REAL_SLOWDOWN"

SLOWDOWN_CASES = [
    # Tiny: cheap rounds, so 45 of them average out a shared machine's noise. At 30 rounds, 8 of 8
    # trials caught the slowdown at p < 0.001 and 0 of 8 unchanged reruns flagged (load average
    # 1-3), but on a host whose speed moves 15-33% within minutes 30 rounds can read p = 0.011 for
    # the slowed arm, short of alpha = 0.01.
    pytest.param("tiny-llama", 64, 32, 45, id="tiny-llama"),
    # Real: a short case measured in 8 rounds, as real runs vary by ~9% from round to round on an
    # idle machine. It needs that idle machine: with another model running beside it, 2-thread runs
    # slow down erratically (speedup 0.44-0.56 across arms of one run, seen here) and the check fails.
    pytest.param(
        models.DEFAULT_PAIR, 32, 16, 8, id=models.DEFAULT_PAIR, marks=[pytest.mark.real, pytest.mark.slow]
    ),
]


@pytest.mark.parametrize("name,prompt_tokens,new_tokens,repetitions", SLOWDOWN_CASES)
def test_gate_catches_injected_slowdown(
    pairs, name, prompt_tokens, new_tokens, repetitions, tmp_path, platform_name, bench_results
):
    """An unchanged rerun passes the gate; assisted decoding made 15% slower is a regression.

    The three measurements share their rounds (``measure_arms``), so a change in the machine's load
    during the test hits all three alike; only the injected busy-wait tells them apart.
    """
    if not models.get_pair(name).target.is_tiny and not os.environ.get(REAL_SLOWDOWN_ENV):
        pytest.skip(
            f"the real-pair slowdown check takes ~9 minutes here; set {REAL_SLOWDOWN_ENV}=1 to run it "
            "(the tiny-pair variant checks the same gate every run)"
        )
    case = bench.case(name, prompt_tokens, new_tokens, num_assistant_tokens=5)
    pair = load(pairs, case)
    arms = bench.measure_arms(
        pair,
        case,
        {"baseline": 0.0, "unchanged": 0.0, "slowed": SLOWDOWN},
        repetitions,
        write_rows=False,
        platform=platform_name,
    )
    root = tmp_path / "baselines"
    baselines.save_baseline(root, platform_name, case.key(), arms["baseline"].record())
    unchanged = arms["unchanged"].gate(root)
    slowed = arms["slowed"].gate(root)
    bench_results.append((arms["baseline"], "baseline arm"))
    for arm, gates in (("unchanged", unchanged), ("slowed", slowed)):
        bench_results.append((arms[arm], f"{arm}: speedup gate {gates['speedup'].status}"))

    # The gate fails CI only on a regression; an unchanged rerun may be reported as an improvement
    # when the machine got quieter between arms (seen once here: 1.13x on tiny), which is not a failure.
    assert not any(g.failed for g in unchanged.values()), [g.message for g in unchanged.values()]
    assert unchanged["speedup"].conclusive, unchanged["speedup"].message
    # The slowed arm must never pass. The host-adjusted gate may call it a regression or, where the
    # busy-wait also moved the measured draft/target cost ratio (seen on a Xeon host: c 0.69 -> 0.86,
    # adjustment x0.85), inconclusive; CI fails on both. The raw speedup drop is a regression.
    assert slowed["speedup"].status in ("regression", "inconclusive"), slowed["speedup"].message
    assert slowed["speedup_unadjusted"].status == "regression", slowed["speedup_unadjusted"].message
    assert slowed["assisted_tokens_per_s"].status == "regression", slowed["assisted_tokens_per_s"].message
    # The slowdown is where it was injected: the plain runs of the slowed arm are untouched.
    assert slowed["plain_tokens_per_s"].status != "regression", slowed["plain_tokens_per_s"].message
    check_benchmark_compare_fail(arms, case, platform_name, tmp_path)


# A host of the same kind that runs everything this much slower (both arms alike): the baseline arm's
# own rounds at this fraction less of their rates. Made so, not measured with a busy-wait: on a loaded
# runner a measured fourth arm's ratio drifted 20% from the others' (its median past the 10% check).
# Far enough below this host that the unchanged arm, measured minutes after the baseline arm, still
# reads faster than it: a shared runner's plain rounds drifted 1.24x between those two arms.
SLOWER_HOST = 0.4
# The threshold the README gives for --benchmark-compare-fail on the gating (ratio) entry.
COMPARE_FAIL = "median:10%"


def check_benchmark_compare_fail(arms: dict, case: bench.BenchCase, platform_name: str, tmp_path) -> None:
    """pytest-benchmark's own comparison, as ``--benchmark-compare-fail=median:10%`` runs it, on the
    gating ratio entry of the shared rounds: against a baseline stored in its format, the unchanged
    build passes and the 15% slower assisted arm fails, also when the baseline was taken on a host
    40% slower in absolute terms (where comparing the arms' own times would fail the unchanged
    build and pass the slowed one: why the ratio is the entry that gates across hosts)."""
    from pytest_benchmark.storage.file import FileStorage
    from pytest_benchmark.utils import get_machine_id, parse_compare_fail

    check = parse_compare_fail(COMPARE_FAIL)

    def slower(m):
        return dataclasses.replace(
            m,
            tokens_per_s=m.tokens_per_s * (1 - SLOWER_HOST),
            time_per_token_ms=m.time_per_token_ms / (1 - SLOWER_HOST),
        )

    here = arms["baseline"]
    arms = {
        **arms,
        "slower_host": dataclasses.replace(
            here, plain=[slower(m) for m in here.plain], assisted=[slower(m) for m in here.assisted]
        ),
    }

    def entries(name: str) -> dict[str, dict]:
        rounds = baselines.arm_rounds(arms[name].plain_tps, arms[name].assisted_tps)
        return {arm: baselines.round_stats(r) for arm, r in rounds.items()}

    for base in ("baseline", "slower_host"):
        root = tmp_path / f"storage-{base}"
        written = baselines.save_baseline(root, platform_name, case.key(), arms[base].record())
        assert baselines.check_compare(str(written.parent), True) == [written]
        # Read back through pytest-benchmark's storage, as its --benchmark-compare does.
        stored = {
            b["extra_info"]["arm"]: b
            for b in FileStorage(
                written.parent, logger=None, default_machine_id=get_machine_id()
            ).load_benchmarks()
        }
        assert stored["ratio"]["rounds"] == stored["plain"]["rounds"] == arms[base].repetitions
        unchanged, slowed = entries("unchanged"), entries("slowed")
        assert not check.fails(unchanged["ratio"], stored["ratio"]), (base, unchanged["ratio"]["median"])
        assert check.fails(slowed["ratio"], stored["ratio"]), (base, slowed["ratio"]["median"])
    # The arms' own times hold a host's absolute speed: the slower host's baseline reads the unchanged
    # build's assisted arm as faster, and the one of this host reads the slowed arm as slower.
    slower = {
        arm: baselines.round_stats(r)
        for arm, r in baselines.arm_rounds(
            arms["slower_host"].plain_tps, arms["slower_host"].assisted_tps
        ).items()
    }
    assert entries("unchanged")["plain"]["median"] < 0.9 * slower["plain"]["median"]
    assert check.fails(entries("slowed")["assisted"], entries("baseline")["assisted"])
