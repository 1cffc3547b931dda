"""harness.experiments.bench: case identity, acceptance analysis, the injected slowdown, and the
measurement's wiring.

Timing-free except for lower bounds that only noise can raise (a busy-wait waits at least as long as
asked), so these run anywhere, in parallel, in seconds.
"""

from __future__ import annotations

import math
import re
import time

import pytest
import torch

from harness.base.errors import HarnessError
from harness.decoding import strategies
from harness.decoding.generation import generate
from harness.experiments import bench
from harness.pairs import models
from harness.report import bench as bench_report
from harness.settings import baselines, setup
from harness.settings.results import read_rows
from harness.settings.setup import GenerationSettings
from harness.theory import analysis, stats
from harness.theory.timing import Forward, record_forwards

SMALL = bench.case("tiny-llama", 24, 12, num_assistant_tokens=4)


@pytest.fixture(scope="module")
def tiny(pairs):
    return pairs.get("tiny-llama")


@pytest.fixture(scope="module")
def measured(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "bench.jsonl"
    m = bench.measure_case(tiny, SMALL, repetitions=2, rows_path=path, platform="test-box-2c")
    return m, path


def test_case_key_names_every_speed_setting():
    fp32 = setup.STOCK_FP32
    case = bench.case("qwen2.5-coder-1.5b", 128, 32, **fp32)
    assert case.case_id == "benchmark-p128-n32-t_fp32-d_fp32-k5-constant-greedy"
    assert case.key() == baselines.CaseKey(
        "qwen2.5-coder-1.5b", "benchmark", 128, 32, "fp32", "fp32", 5, "constant"
    )
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=50)
    sampled = bench.case("qwen2.5-coder-1.5b", 128, 32, sampling=sampling, **fp32)
    assert sampled.case_id.endswith("sample-t0.7-topp0.9-topk50")
    # Greedy cases do not vary with sampling knobs that have no effect.
    assert (
        bench.case("qwen2.5-coder-1.5b", 128, 32, sampling=dict(temperature=0.3), **fp32).case_id
        == case.case_id
    )
    # Settings left out are the pair's registered ones.
    registered = bench.case("qwen2.5-coder-1.5b", 128, 32).run
    assert (registered.target.precision, registered.draft.precision) == ("gguf", "q4k")


def test_case_settings_decode_the_whole_budget_in_both_modes():
    for mode in ("plain", "assisted"):
        s = SMALL.settings(mode)
        assert (s.mode, s.max_new_tokens, s.num_assistant_tokens, s.ignore_eos) == (mode, 12, 4, True)
    with pytest.raises(HarnessError, match="num_assistant_tokens"):
        bench.case("tiny-llama", 24, 12, num_assistant_tokens=0).settings("assisted")


def test_case_takes_every_decoding_setting_beside_the_runs_own():
    # A decoding setting given to ``case`` reaches the case's settings and its identity, beside the
    # run's own (a precision, K), which the pair's registration resolves.
    case = bench.case(
        "tiny-llama", 24, 12, context_draft=8, draft_tree="0+1", min_new_tokens=3, num_assistant_tokens=2
    )
    s = case.settings("assisted")
    assert (s.context_draft, s.draft_tree, s.min_new_tokens, s.num_assistant_tokens) == (8, "0+1", 3, 2)
    assert dict(case.key().more)["context_draft"] == 8
    assert case.run.target.precision == models.get_pair("tiny-llama").target_setup.precision
    with pytest.raises(TypeError):
        bench.case("tiny-llama", 24, 12, no_such_setting=1)


def test_alpha_mle():
    assert analysis.alpha_mle(0, 0) is None
    assert analysis.alpha_mle(9, 0) == 1.0
    assert analysis.alpha_mle(0, 4) == 0.0
    assert analysis.alpha_mle(6, 2) == pytest.approx(0.75)


def _verify(ids: list[int], cached: int) -> Forward:
    return Forward("target", 0.0, 0.001, len(ids), cached, tuple(ids))


def test_acceptance_steps_tells_rejections_from_budget_cuts():
    from harness.theory.timing import Measurement

    prompt = [1, 2, 3]
    out = [10, 11, 12, 13, 14, 15]
    forwards = [
        _verify(prompt + [10, 11, 99], 0),  # 2 accepted, then a rejection (target said 12)
        _verify([12, 13, 14], 5),  # bonus 12, candidates 13, 14 both accepted
        _verify([15, 16, 17], 8),  # bonus 15; budget ends, candidates cut, not rejected
    ]
    m = Measurement(3, out, 1.0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 7, 4, forwards)
    assert analysis.acceptance_steps(m) == (4, 1)


def test_acceptance_steps_agrees_with_the_runs_own_counts(tiny):
    ids = list(range(5, 40))
    m = generate(tiny, ids, GenerationSettings(mode="assisted", max_new_tokens=20, ignore_eos=True))
    accepted, rejected = analysis.acceptance_steps(m)
    assert accepted == m.accepted and m.drafted > 0
    assert 0 <= rejected <= m.target_forwards


@pytest.mark.parametrize("strategy,alpha", [("self", 1.0), ("random", 0.0)])
def test_alpha_is_one_for_the_target_itself_and_chance_for_noise(tiny, strategy, alpha):
    pair = strategies.get(strategy).draft(tiny)
    m = bench.measure_case(pair, SMALL, repetitions=2, write_rows=False, platform="test-box-2c")
    assert m.alpha == pytest.approx(alpha, abs=0.05)  # 512-token vocab: chance is a few percent
    assert m.identical_outputs
    if strategy == "self":
        # Every candidate accepted: each verify yields K+1 tokens, as the theory's best case.
        k = SMALL.num_assistant_tokens
        assert m.predicted_speedup == pytest.approx(analysis.leviathan_speedup(1.0, k, m.c))
        assert analysis.expected_tokens_per_forward(m.alpha, k) == k + 1


class _Spin(torch.nn.Module):
    """Takes a fixed 2 ms per forward (spinning), so a slowed run's extra time is known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return x


def test_slowed_stretches_wall_time_by_the_asked_fraction():
    module, x, calls = _Spin(), torch.zeros(1, 1, dtype=torch.long), 20
    with bench.slowed(module, 0.5), record_forwards({"target": module}) as log:
        # lose half the speed: every interval between forwards' starts takes twice as long
        start = time.perf_counter()
        for _ in range(calls):
            module(x)
        elapsed = time.perf_counter() - start
    # Lower bounds only: noise can add time, never remove the spin the hook added.
    assert elapsed >= 0.002 * calls + 0.002 * (calls - 1)
    # The spin is outside the forwards' own timing (it is loop time, not forward cost): the timed
    # forwards add up to far less than the wall time.
    assert log.total_ms("target") < 0.75 * elapsed * 1000
    assert not module._forward_hooks and not module._forward_pre_hooks, "hooks left behind"
    with bench.slowed(module, 0.0):
        assert not module._forward_hooks  # no slowdown, no hook
    for bad in (-0.1, 1.0):
        with pytest.raises(HarnessError, match="inject_slowdown"), bench.slowed(module, bad):
            pass


def test_measure_case_rejects_bad_input_before_decoding(tiny):
    with pytest.raises(HarnessError, match="repetitions"):
        bench.measure_case(tiny, SMALL, repetitions=1, write_rows=False)
    with pytest.raises(HarnessError, match="tiny-opt"):
        bench.measure_case(tiny, bench.case("tiny-opt", 24, 12), 2, write_rows=False)
    with pytest.raises(HarnessError, match="bf16"):
        bench.measure_case(
            tiny, bench.case("tiny-llama", 24, 12, target_precision="bf16"), 2, write_rows=False
        )
    with pytest.raises(HarnessError, match="inject_slowdown"):
        bench.measure_case(tiny, SMALL, 2, inject_slowdown=1.5, write_rows=False)


def test_measurement_holds_paired_rounds(measured):
    m, _ = measured
    s = m.summary()
    assert m.repetitions == 2 and len(m.plain_tps) == len(m.assisted_tps) == 2
    assert s["speedup"] == pytest.approx(sum(m.assisted_tps) / sum(m.plain_tps))
    assert s["c"] == pytest.approx(s["draft_forward_ms"] / s["target_forward_ms"])
    assert s["v"] == pytest.approx(s["verify_forward_ms"] / s["target_forward_ms"])
    assert s["predicted_speedup_verify"] == pytest.approx(
        analysis.leviathan_speedup_verify(s["alpha"], SMALL.num_assistant_tokens, s["c"], s["v"])
    )
    assert all(math.isfinite(s[k]) for k in ("plain_non_forward_share", "assisted_non_forward_share"))


def test_rows_record_each_round_in_order(measured):
    m, path = measured
    rows = read_rows(path)
    assert [(r.example, r.mode) for r in rows] == [
        (1, "plain"),
        (1, "assisted"),
        (2, "assisted"),  # the order alternates from round to round
        (2, "plain"),
    ]
    assert {r.run_id for r in rows} == {m.run_id} and {r.task for r in rows} == {"benchmark"}
    assert [r.tokens_per_s for r in rows if r.mode == "plain"] == m.plain_tps
    assert all(r.extra["bench"]["case_id"] == SMALL.case_id for r in rows)
    assert all(r.platform == "test-box-2c" and r.prompt_tokens == 24 for r in rows)


def test_record_round_trips_and_gates_itself(measured, tmp_path):
    m, _ = measured
    with pytest.raises(baselines.MissingBaselineError, match="update-baselines"):
        m.gate(tmp_path)
    baselines.save_baseline(tmp_path, m.platform, SMALL.key(), m.record())
    stored = baselines.load_baseline(tmp_path, m.platform, SMALL.key())
    assert stored.tokens_per_s["plain"]["samples"] == pytest.approx(m.plain_tps, rel=1e-12)
    assert stored.extra["threads"] == m.threads and stored.acceptance == pytest.approx(m.acceptance_rate)
    gates = m.gate(tmp_path)
    # The record keeps alpha, c and v, so the speedup gate is host-adjusted (by x1 against itself,
    # up to the 6 significant digits a record keeps).
    assert set(gates) == {
        "speedup",
        "speedup_unadjusted",
        "assisted_tokens_per_s",
        "plain_tokens_per_s",
        "acceptance_by_position",
    }
    assert all(g.ratio == pytest.approx(1.0, rel=1e-5) for g in gates.values())
    # Two rounds of a tiny model: its own spread may keep the interval from excluding the 8% margin,
    # and then (only then) the gate must say inconclusive, never regression or improvement.
    for name, g in gates.items():
        noisy = g.status == "inconclusive" and min(g.ci) < 1 - stats.DEFAULT_MARGIN
        assert g.status == "pass" or noisy, (name, g)
    # Each pair is adjusted by its own costs against the record's pooled ones, so the factor the
    # message reports (the pairs' median) moves with how far this run's two pairs were apart; the
    # ratio above is what must be 1 against itself.
    factor = re.search(r"adjusted x([0-9.]+)", gates["speedup"].message)
    lo, hi = baselines.ADJUSTMENT_RANGE
    assert factor and lo <= float(factor.group(1)) <= hi, gates["speedup"].message


def test_arms_share_rounds_but_not_runs(tiny):
    arms = bench.measure_arms(tiny, SMALL, {"a": 0.0, "b": 0.0}, 2, warmup=0, write_rows=False)
    assert set(arms) == {"a", "b"} and arms["a"].run_id != arms["b"].run_id
    assert all(len(m.plain) == len(m.assisted) == 2 for m in arms.values())


def test_summary_table_has_one_line_per_case(measured):
    m, _ = measured
    wide = bench_report.summary_table([(m, "tiny: not gated"), (m, "pass")], wide=True)
    lines = wide.splitlines()
    assert len(lines) == 4 and "Speedup [95% CI]" in lines[0] and "Predicted (v=1)" in lines[0]
    assert SMALL.case_id in lines[2] and lines[3].rstrip("| ").endswith("pass")
    # the terminal's form: numbered rows within 120 columns, each case named with its verdict below
    verdict = "speedup: pass (1.23x against 1.20x [1.10-1.30]); " * 4
    short = bench_report.summary_table([(m, "tiny: not gated"), (m, verdict)])
    assert max(len(line) for line in short.splitlines()) <= 120, short
    table = [line for line in short.splitlines() if line.startswith("|")]
    assert len(table) == 4 and "Speedup [95% CI]" in table[0]
    assert f"2: {m.summary()['pair']} {SMALL.case_id}" in short and "gate: speedup: pass" in short


def test_acceptance_by_position_counts_each_draft_position(measured):
    m, _ = measured
    counts = m.acceptance_by_position
    assert 0 < len(counts) <= SMALL.num_assistant_tokens
    assert all(d >= a >= 0 for d, a in counts)
    # a later position is accepted only when every earlier one was
    assert all(counts[i][1] >= counts[i + 1][1] for i in range(len(counts) - 1))
    assert sum(a for _, a in counts) == sum(x.accepted for x in m.assisted)


def test_acceptance_gate_catches_a_changed_draft_without_timing(tiny, tmp_path, monkeypatch):
    """Greedy on deterministic kernels repeats drafted/accepted per position exactly: an unchanged
    rerun equals the baseline, and a draft with one token per step replaced does not, whatever the
    clock said."""
    from transformers.generation import candidate_generator as cg

    m = bench.measure_case(tiny, SMALL, repetitions=2, write_rows=False, platform="box")
    assert m.deterministic
    baselines.save_baseline(tmp_path, "box", SMALL.key(), m.record())
    again = bench.measure_case(tiny, SMALL, repetitions=3, write_rows=False, platform="box")
    assert again.gate(tmp_path)["acceptance_by_position"].status == "pass"

    real = cg.AssistedCandidateGenerator.get_candidates

    def one_token_replaced(self, input_ids, **kwargs):
        ids, logits = real(self, input_ids, **kwargs)
        if ids.shape[1] > input_ids.shape[1]:
            ids = ids.clone()
            ids[:, input_ids.shape[1]] = (ids[:, input_ids.shape[1]] + 1) % tiny.target.config.vocab_size
        return ids, logits

    monkeypatch.setattr(cg.AssistedCandidateGenerator, "get_candidates", one_token_replaced)
    changed = bench.measure_case(tiny, SMALL, repetitions=2, write_rows=False, platform="box")
    gate = changed.gate(tmp_path)["acceptance_by_position"]
    assert gate.status == "regression" and gate.failed and "drafting or verification changed" in gate.message


def test_more_rounds_extend_a_measurement(tiny):
    """An inconclusive gate measures more rounds and answers on all of them: the rounds pool, and
    only rounds of the same case, arm and machine may."""
    m, more = (bench.measure_case(tiny, SMALL, 2, write_rows=False, platform="test-box-2c") for _ in range(2))
    both = m.extended(more)
    assert both.repetitions == 4 and both.plain_tps == m.plain_tps + more.plain_tps
    pairs = zip(m.acceptance_by_position, more.acceptance_by_position, strict=True)
    assert both.acceptance_by_position == [[a[0] + b[0], a[1] + b[1]] for a, b in pairs]
    other = bench.measure_case(tiny, SMALL, 2, write_rows=False, platform="other-box-2c")
    with pytest.raises(HarnessError, match="same case, arm and machine"):
        m.extended(other)


def test_an_inconclusive_gate_measures_more_rounds_until_it_can_answer(tiny):
    """The loop around the gate (the gate itself is tested in test_stats/test_baselines): more
    batches while the answer is inconclusive, none after a pass or a regression, never more than
    allowed; the answer given is the one on all the rounds."""
    first = bench.measure_case(tiny, SMALL, 2, write_rows=False, platform="test-box-2c")
    calls = []

    def more():
        calls.append(1)
        return bench.measure_case(tiny, SMALL, 2, write_rows=False, platform="test-box-2c")

    def answer(status):
        return {"speedup": stats.GateResult(status, 1.0, 0.5, (0.9, 1.1), status)}

    # Inconclusive until six rounds are in: two more batches, then a pass on all six.
    m, gates = bench.gate_with_more_rounds(
        first, lambda x: answer("pass" if x.repetitions >= 6 else "inconclusive"), more, batches=5
    )
    assert (m.repetitions, len(calls), gates["speedup"].status) == (6, 2, "pass")
    # A regression is an answer: nothing more is measured.
    calls.clear()
    m, gates = bench.gate_with_more_rounds(first, lambda x: answer("regression"), more, batches=5)
    assert (m.repetitions, len(calls), gates["speedup"].status) == (2, 0, "regression")
    # Still inconclusive after the allowed batches: that answer stands.
    m, gates = bench.gate_with_more_rounds(first, lambda x: answer("inconclusive"), more, batches=1)
    assert (m.repetitions, gates["speedup"].status) == (4, "inconclusive")


def test_a_stalled_round_does_not_move_the_forward_costs():
    """c and v (and so the gate's host adjustment) read each round's mean step and take the median
    over rounds: one round on a stalled host, its steps 2.6x slower, leaves them where they were."""
    from harness.theory.timing import Measurement

    def run(step_ms: float) -> Measurement:
        return Measurement(
            1, [], 1.0, 0.0, 0.0, 0.0, 0.0, 32, 0, 31 * step_ms, 0.0, 0.0, 0, 0,
            step_costs={"target": (31 * step_ms, 31)},
        )  # fmt: skip

    steady = [run(20.0), run(20.2), run(19.8), run(20.1)]
    assert analysis.decode_ms(steady, "target") == pytest.approx(20.05)
    # A pooled mean would read 26.4 ms here.
    assert analysis.decode_ms([run(52.0), *steady], "target") == pytest.approx(20.1)
    assert math.isnan(analysis.decode_ms([], "draft"))
