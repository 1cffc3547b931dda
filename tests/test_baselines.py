import json
import math
from dataclasses import replace

import numpy as np
import pytest

from harness.base.errors import HarnessError
from harness.settings.baselines import (
    ARMS,
    BaselineRecord,
    CaseKey,
    MissingBaselineError,
    compare_to_baseline,
    host_adjustment,
    list_baselines,
    load_baseline,
    make_record,
    read_storage,
    save_baseline,
    storage_file,
)
from harness.theory import analysis

CASE = CaseKey(
    model="qwen2.5-coder-1.5b",
    task="benchmark",
    prompt_tokens=256,
    max_new_tokens=64,
    target_precision="fp32",
    draft_precision="fp32",
    num_assistant_tokens=5,
    assistant_schedule="constant",
)
MACHINE = {"name": "test-box-2c", "cpu": "test cpu", "cores": 2, "accelerator": "none", "system": "Linux"}
VERSIONS = {"python": "3.11", "torch": "x"}


def record_for(case, plain, assisted, machine=MACHINE, **kw):
    return make_record(
        case,
        plain,
        assisted,
        time_per_token_ms={"plain": 1000 / np.mean(plain), "assisted": 1000 / np.mean(assisted)},
        prefill_ms={"plain": 120.0, "assisted": 130.0},
        acceptance=0.7,
        machine=machine,
        versions=VERSIONS,
        date="2025-01-01",
        **kw,
    )


def interleaved(seed, plain_rate=10.0, speedup=1.6, n=5, cv=0.04):
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(cv * cv))
    plain = plain_rate * np.exp(rng.normal(0, sigma, n))
    assisted = plain_rate * speedup * np.exp(rng.normal(0, sigma, n))
    return plain.tolist(), assisted.tolist()


def test_case_id_is_readable_and_stable():
    assert CASE.case_id == "benchmark-p256-n64-t_fp32-d_fp32-k5-constant-greedy"
    sampled = replace(CASE, do_sample=True, temperature=0.7, top_p=0.9, top_k=50)
    assert sampled.case_id == "benchmark-p256-n64-t_fp32-d_fp32-k5-constant-sample-t0.7-topp0.9-topk50"
    assert replace(CASE, target_backend="llama.cpp").case_id.endswith("-greedy-llama.cpp")
    whole_task = replace(
        CASE, prompt_tokens=None, max_new_tokens=None, num_assistant_tokens=None, assistant_schedule=None
    )
    assert whole_task.case_id == "benchmark-t_fp32-d_fp32-kdefault-greedy"


@pytest.mark.parametrize(
    "change",
    [
        {"task": "decode"},
        {"prompt_tokens": 512},
        {"max_new_tokens": 128},
        {"target_precision": "bf16"},
        {"draft_precision": "int8"},
        {"num_assistant_tokens": 6},
        {"assistant_schedule": "heuristic"},
        {"do_sample": True},
        {"target_backend": "gguf"},
        {"target_kernels": "invariant"},
        {"draft_vocab": 16384},
        {"draft_kernels": "invariant"},
        {"execution_provider": "CPUExecutionProvider"},
        {"engine": "onnxruntime-genai"},
        {"draft": "prompt-lookup"},
    ],
)
def test_every_speed_setting_changes_the_case_id(change):
    assert replace(CASE, **change).case_id != CASE.case_id


def test_round_trip_and_sorted_keys(tmp_path):
    plain, assisted = interleaved(0)
    rec = record_for(CASE, plain, assisted)
    path = save_baseline(tmp_path, "test-box-2c", CASE, rec)
    assert path == tmp_path / "test-box-2c" / "0001_baseline.json"  # pytest-benchmark's saved-run name
    assert path.stat().st_mode & 0o777 == 0o644  # a committed file, readable by everyone
    text = path.read_text()
    data = json.loads(text)
    assert (
        text == json.dumps(data, sort_keys=True, indent=2) + "\n"
    )  # sorted at every level, newline-terminated
    loaded = load_baseline(tmp_path, "test-box-2c", CASE)
    # The samples come back from the entries' rounds (seconds per token), the rest as stored.
    assert loaded.tokens_per_s["assisted"]["samples"] == pytest.approx(assisted, rel=1e-12)
    assert loaded.tokens_per_s["plain"]["samples"] == pytest.approx(plain, rel=1e-12)
    assert loaded.speedup == rec.speedup and loaded.extra == rec.extra and loaded.case == rec.case
    assert (
        loaded.speedup["n"] == 5
        and loaded.speedup["low"] <= loaded.speedup["value"] <= loaded.speedup["high"]
    )
    assert loaded.speedup["value"] == pytest.approx(np.mean(assisted) / np.mean(plain), rel=1e-5)
    ratios = [a / p for p, a in zip(plain, assisted, strict=True)]
    assert loaded.speedup["samples"] == pytest.approx(ratios, rel=1e-5)


def test_failed_write_leaves_old_file_intact(tmp_path):
    plain, assisted = interleaved(1)
    good = record_for(CASE, plain, assisted)
    path = save_baseline(tmp_path, "box", CASE, good)
    before = path.read_bytes()
    broken = record_for(CASE, plain, assisted, extra={"zzz_last_key": object()})  # fails mid-serialisation
    with pytest.raises(TypeError):
        save_baseline(tmp_path, "box", CASE, broken)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    nan = record_for(CASE, plain, assisted, extra={"zzz": float("nan")})  # NaN is not JSON
    with pytest.raises(ValueError):
        save_baseline(tmp_path, "box", CASE, nan)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"schema": 1}',
        '{"benchmarks": [{"extra_info": {"schema": 2, "case_id": "x"}}]}',
        '{"benchmarks": [{"extra_info": {"schema": 3, "case_id": "x", "arm": "ratio"}}]}',
    ],
)
def test_malformed_file_names_file_and_fix(tmp_path, content):
    path = storage_file(
        tmp_path,
        "box",
    )
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(HarnessError) as info:
        load_baseline(tmp_path, "box", CASE)
    assert str(path) in str(info.value) and "--update-baselines" in str(info.value)


def test_file_holding_another_case_is_rejected(tmp_path):
    plain, assisted = interleaved(2)
    other = replace(CASE, num_assistant_tokens=7)
    src = save_baseline(tmp_path, "box", other, record_for(other, plain, assisted))
    # Entries relabelled as CASE's: the record they hold is still the other case's.
    src.write_text(src.read_text().replace(f'"{other.case_id}"', f'"{CASE.case_id}"'))
    with pytest.raises(HarnessError, match=f"malformed baseline storage.*{other.case_id}"):
        load_baseline(tmp_path, "box", CASE)


def test_load_missing_and_list(tmp_path):
    assert load_baseline(tmp_path, "box", CASE) is None
    assert list_baselines(tmp_path) == []
    plain, assisted = interleaved(3)
    a = save_baseline(tmp_path, "box", CASE, record_for(CASE, plain, assisted))
    other = replace(CASE, model="other-pair")
    b = save_baseline(tmp_path, "box2", other, record_for(other, plain, assisted))
    assert list_baselines(tmp_path) == sorted([a, b])
    assert list_baselines(tmp_path, "box2") == [b]
    assert [r.case for r in read_storage(b)] == [other]
    assert isinstance(read_storage(b)[0], BaselineRecord)
    # A second case on one platform joins its storage; rewriting a case replaces its entries only.
    third = replace(CASE, num_assistant_tokens=3)
    assert save_baseline(tmp_path, "box", third, record_for(third, plain, assisted)) == a
    save_baseline(tmp_path, "box", CASE, record_for(CASE, plain, [x * 1.1 for x in assisted]))
    assert sorted(r.case.case_id for r in read_storage(a)) == sorted([CASE.case_id, third.case_id])
    assert len(json.loads(a.read_text())["benchmarks"]) == 6  # ratio, assisted and plain of each


def test_a_test_whose_case_changed_keeps_one_entry_per_arm(tmp_path):
    """The same test re-recorded with another configuration (its budget changed, say) replaces its
    entries: pytest-benchmark's compare reads one entry per test name, so a stale one left beside
    the new would be the one compared."""
    plain, assisted = interleaved(4)
    names = {arm: f"perf/test_x.py::test_case[{arm}]" for arm in ARMS}
    path = save_baseline(tmp_path, "box", CASE, record_for(CASE, plain, assisted), names=names)
    changed = replace(CASE, max_new_tokens=CASE.max_new_tokens // 2)
    save_baseline(tmp_path, "box", changed, record_for(changed, plain, assisted), names=names)
    entries = json.loads(path.read_text())["benchmarks"]
    assert sorted(e["fullname"] for e in entries) == sorted(names.values())
    assert {e["extra_info"]["case_id"] for e in entries} == {changed.case_id}
    assert [r.case for r in read_storage(path)] == [changed]


def test_compare_to_baseline_passes_unchanged_build(tmp_path):
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10)))
    results = compare_to_baseline(tmp_path, "box", CASE, *interleaved(11, n=10))
    assert set(results) == {"speedup", "assisted_tokens_per_s", "plain_tokens_per_s"}
    assert all(r.status == "pass" for r in results.values()), [r.message for r in results.values()]


@pytest.mark.parametrize("seed", range(5))
def test_noisy_unchanged_run_is_inconclusive_never_pass(tmp_path, seed):
    """Recorded-style samples with the spread of a loaded host (15% per round): the build is
    unchanged, but the run cannot show it, so the gate says so instead of passing."""
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10)))
    speedup = compare_to_baseline(tmp_path, "box", CASE, *interleaved(20 + seed, cv=0.15))["speedup"]
    assert speedup.status in ("inconclusive", "regression"), speedup.message
    if speedup.status == "inconclusive":
        assert "rerun on an idle machine" in speedup.message


def test_real_slowdown_is_a_regression_and_no_drop_an_improvement(tmp_path):
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10)))
    slowed = compare_to_baseline(tmp_path, "box", CASE, *interleaved(30, speedup=1.6 * 0.85, n=10))
    assert slowed["speedup"].status == "regression"
    # A host whose forward costs moved wildly (a loaded machine) cannot turn a drop into a pass or an
    # improvement: the adjustment is refused and the verdict is inconclusive.
    record = record_for(CASE, *interleaved(10, n=10), extra={"alpha": 0.8, "c": 0.3, "v": 1.1})
    save_baseline(tmp_path, "box", CASE, record)
    dropped = interleaved(31, speedup=0.07, n=10)
    loaded = [(30.0, 9.0)] * 10
    verdict = compare_to_baseline(tmp_path, "box", CASE, *dropped, forward_costs=loaded)["speedup"]
    assert verdict.status == "inconclusive", verdict.message
    assert "outside" in verdict.message


def test_compare_to_baseline_catches_slower_assisted_generation(tmp_path):
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10)))
    results = compare_to_baseline(tmp_path, "box", CASE, *interleaved(12, speedup=1.6 * 0.8))
    assert results["speedup"].status == "regression"
    assert results["assisted_tokens_per_s"].status == "regression"
    assert results["plain_tokens_per_s"].status == "pass"
    assert CASE.case_id in results["speedup"].message


def test_a_twelve_times_slower_assisted_run_is_reported_as_slower(tmp_path):
    """What pytest-benchmark's compare once called "1.52x faster": assisted decoding 12x slower
    against an unchanged plain decoding is a regression of the speedup and of assisted tokens/s."""
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10)))
    results = compare_to_baseline(tmp_path, "box", CASE, *interleaved(14, speedup=1.6 / 12, n=10))
    assert results["speedup"].status == "regression", results["speedup"].message
    assert results["assisted_tokens_per_s"].status == "regression"
    assert results["speedup"].ratio < 0.1


def test_compare_to_baseline_catches_slower_target(tmp_path):
    # A slower target slows both modes alike: the speedup holds, the tokens/s gates catch it.
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10)))
    results = compare_to_baseline(tmp_path, "box", CASE, *interleaved(13, plain_rate=8.0, n=10))
    assert results["speedup"].status == "pass"
    assert results["plain_tokens_per_s"].status == "regression"
    assert results["assisted_tokens_per_s"].status == "regression"
    # Reported, not gated: the drop is said as one, never with the word a failed gate uses.
    for name in ("plain_tokens_per_s", "assisted_tokens_per_s"):
        message = results[name].message
        assert "REGRESSION" not in message
        assert "slower than the baseline" in message and "not gated" in message


def test_tokens_per_s_of_another_cpu_kind_is_not_comparable_never_a_regression(tmp_path):
    zen4 = {**MACHINE, "cpu_id": "family 25 model 17 stepping 1"}
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(10, n=10), machine=zen4))
    slower = interleaved(13, plain_rate=8.0, n=10)
    same_kind = compare_to_baseline(tmp_path, "box", CASE, *slower, cpu_id="family 25 model 17 stepping 2")
    assert same_kind["plain_tokens_per_s"].status == "regression"
    other = compare_to_baseline(tmp_path, "box", CASE, *slower, cpu_id="family 26 model 2 stepping 1")
    for name in ("plain_tokens_per_s", "assisted_tokens_per_s"):
        assert other[name].status == "not comparable" and not other[name].failed
        assert "REGRESSION" not in other[name].message and "family 26 model 2" in other[name].message
    assert other["speedup"].status == "pass"  # host-independent: still gated


# A baseline that kept its cost model inputs (as every measured one does since they were added).
COSTS = {"alpha": 0.63, "c": 0.39, "v": 1.13}


def test_host_adjustment_follows_the_cost_model():
    record = record_for(CASE, *interleaved(20), extra=COSTS)
    same = host_adjustment(record, 5, 0.39, 1.13)
    assert same.factor == pytest.approx(1.0)
    # A host whose target is relatively faster (higher c and v) is expected to speed up less.
    faster_target = host_adjustment(record, 5, 0.47, 1.23)
    expected = analysis.leviathan_speedup_verify(0.63, 5, 0.47, 1.23) / analysis.leviathan_speedup_verify(
        0.63, 5, 0.39, 1.13
    )
    assert faster_target.factor == pytest.approx(expected) and faster_target.factor < 0.9
    assert "c 0.39 -> 0.47" in faster_target.describe()
    # Without its own c and v (published tables), a baseline cannot be adjusted; nor a run that did
    # not measure c against a baseline that did.
    assert host_adjustment(record_for(CASE, *interleaved(20)), 5, 0.47, 1.23) is None
    assert host_adjustment(record, 5, float("nan"), 1.2) is None
    assert host_adjustment(record, 5, -0.1, 1.2) is None  # outside the model's domain
    # Every draft accepted (a self-draft baseline) is inside it: (K + 1) / (K c + v).
    all_accepted = record_for(CASE, *interleaved(20), extra={**COSTS, "alpha": 1.0})
    assert host_adjustment(all_accepted, 5, 0.47, 1.23).factor == pytest.approx(
        (5 * 0.39 + 1.13) / (5 * 0.47 + 1.23)
    )


def test_an_engine_that_books_its_rounds_whole_is_adjusted_by_its_round_cost(tmp_path):
    """llama.cpp's server books a speculative round whole, drafting included: c is not measured
    (null in its record, NaN in a run) and v is the round in plain steps. The adjustment is then
    the rounds' cost ratio, which is what Leviathan's ratio is at any acceptance."""
    booked = {"alpha": None, "c": None, "v": 6.0}
    record = record_for(CASE, *interleaved(30, n=8), extra=booked)
    adjusted = host_adjustment(record, 3, float("nan"), 5.0)
    assert adjusted.factor == pytest.approx(6.0 / 5.0)
    assert "a round 6 -> 5 plain steps" in adjusted.describe()
    assert host_adjustment(record, 3, 0.3, 5.0) is None  # booked otherwise than its baseline
    # Through the gate: a host whose rounds cost 20% fewer plain steps runs 1.2x the speedup, and
    # passes; the same speedup at the baseline's round cost is an improvement, not a pass.
    save_baseline(tmp_path, "box", CASE, record)
    faster = interleaved(31, speedup=1.6 * 1.2, n=8)
    on_host = compare_to_baseline(tmp_path, "box", CASE, *faster, forward_costs=[(math.nan, 5.0)] * 8)
    assert on_host["speedup"].status == "pass", on_host["speedup"].message
    assert "plain steps" in on_host["speedup"].message
    same_costs = compare_to_baseline(tmp_path, "box", CASE, *faster, forward_costs=[(math.nan, 6.0)] * 8)
    assert same_costs["speedup"].status == "improvement", same_costs["speedup"].message


def test_speedup_gate_forgives_the_host_but_not_the_code(tmp_path):
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(21, n=8), extra=COSTS))
    host = host_adjustment(load_baseline(tmp_path, "box", CASE), 5, 0.47, 1.23)
    # Another host of the same slug: the speedup fell exactly as its forward costs predict.
    moved = interleaved(22, plain_rate=13.0, speedup=1.6 * host.factor, n=8)
    on_host = compare_to_baseline(tmp_path, "box", CASE, *moved, forward_costs=[(0.47, 1.23)] * 8)
    assert on_host["speedup"].status == "pass", on_host["speedup"].message
    assert on_host["speedup_unadjusted"].status == "regression"  # what the unadjusted gate would say
    assert "adjusted" in on_host["speedup"].message
    # Same forward costs as the baseline, but 20% of the speedup lost outside them: a regression.
    lost = interleaved(23, speedup=1.6 * 0.8, n=8)
    slower = compare_to_baseline(tmp_path, "box", CASE, *lost, forward_costs=[(0.39, 1.13)] * 8)
    assert slower["speedup"].status == "regression", slower["speedup"].message
    # Both together: the host explains 13%, not the other 20%.
    both = interleaved(24, plain_rate=13.0, speedup=1.6 * host.factor * 0.8, n=8)
    moved_costs = [(0.47, 1.23)] * 8
    assert compare_to_baseline(tmp_path, "box", CASE, *both, forward_costs=moved_costs)["speedup"].failed


def test_each_pair_is_adjusted_by_its_own_forward_costs(tmp_path):
    """A host phase that frees memory bandwidth for a few pairs speeds plain decoding up, not the
    compute-bound verification: those pairs' v rises and their speedup falls as the cost model says.
    Each pair adjusted by its own costs passes; against one pooled adjustment the same ratios spread
    too wide to pass."""
    save_baseline(tmp_path, "box", CASE, record_for(CASE, *interleaved(40, n=8), extra=COSTS))
    record = load_baseline(tmp_path, "box", CASE)
    fast_phase = (0.47, 1.43)
    factor = host_adjustment(record, 5, *fast_phase).factor
    plain, assisted = interleaved(41, n=12, cv=0.01)
    costs = [(0.39, 1.13)] * 6 + [fast_phase] * 6
    assisted = [a * (factor if i >= 6 else 1.0) for i, a in enumerate(assisted)]
    per_pair = compare_to_baseline(tmp_path, "box", CASE, plain, assisted, forward_costs=costs)["speedup"]
    assert per_pair.status == "pass", per_pair.message
    pooled = [(0.43, 1.28)] * 12  # the same run read as one pooled (c, v)
    pooled_verdict = compare_to_baseline(tmp_path, "box", CASE, plain, assisted, forward_costs=pooled)
    pooled_verdict = pooled_verdict["speedup"]
    assert pooled_verdict.status != "pass", pooled_verdict.message
    # A drop the costs do not explain still fails, pair by pair.
    lost = [a * 0.8 for a in assisted]
    assert compare_to_baseline(tmp_path, "box", CASE, plain, lost, forward_costs=costs)["speedup"].failed
    with pytest.raises(HarnessError, match="one \\(c, v\\) per interleaved pair"):
        compare_to_baseline(tmp_path, "box", CASE, plain, assisted, forward_costs=costs[:3])


def test_a_baselines_pairs_are_brought_to_its_own_costs(tmp_path):
    """A baseline that kept its pairs' costs has each sample brought to its pooled c and v, so a
    phase during the baseline's own run does not widen what the current run is held to."""
    plain, assisted = interleaved(42, n=8, cv=0.01)
    fast_phase = (0.47, 1.43)
    bare = record_for(CASE, plain, assisted, extra=COSTS)
    factor = host_adjustment(bare, 5, *fast_phase).factor
    assisted = [a * (factor if i % 2 else 1.0) for i, a in enumerate(assisted)]
    kept = [list(fast_phase) if i % 2 else [0.39, 1.13] for i in range(8)]
    with_pairs = record_for(CASE, plain, assisted, extra={**COSTS, "pair_costs": kept})
    save_baseline(tmp_path, "box", CASE, with_pairs)
    current = interleaved(43, n=8, cv=0.01)
    same = compare_to_baseline(tmp_path, "box", CASE, *current, forward_costs=[(0.39, 1.13)] * 8)["speedup"]
    assert same.status == "pass" and same.ratio == pytest.approx(1.0, abs=0.03), same.message
    # Without the kept costs, the phase's pairs read as a slower baseline: the run looks faster.
    save_baseline(tmp_path, "box", CASE, record_for(CASE, plain, assisted, extra=COSTS))
    unnormalised = compare_to_baseline(tmp_path, "box", CASE, *current, forward_costs=[(0.39, 1.13)] * 8)
    assert unnormalised["speedup"].ratio > 1.05


def test_compare_without_baseline_says_how_to_create_one(tmp_path):
    with pytest.raises(MissingBaselineError, match="--update-baselines"):
        compare_to_baseline(tmp_path, "box", CASE, [1.0, 1.1], [2.0, 2.1])


def test_bad_platform_name(tmp_path):
    with pytest.raises(HarnessError, match="platform"):
        storage_file(tmp_path, "../x")


def test_a_schema_1_baseline_loads_unchanged(tmp_path):
    """Baselines written before the case fields took the run settings' column names load unchanged
    (same case id, same numbers)."""
    record = record_for(CASE, [10.0, 10.2, 9.9], [14.0, 14.3, 13.8])
    path = save_baseline(tmp_path, "box", CASE, record)
    doc = json.loads(path.read_text())
    (data,) = [e["extra_info"]["baseline"] for e in doc["benchmarks"] if "baseline" in e["extra_info"]]
    renamed = {"max_new_tokens": "new_tokens", "assistant_schedule": "schedule", "target_backend": "backend",
               "target_kernels": "kernels", "execution_provider": "provider"}  # fmt: skip
    data["case"] = {renamed.get(k, k): v for k, v in data["case"].items()}
    data["schema"] = 1
    path.write_text(json.dumps(doc))
    old = load_baseline(tmp_path, "box", CASE)
    assert old is not None and old.case == CASE and old.speedup == record.speedup


def test_the_case_fields_are_run_setting_columns():
    from harness.settings import baselines, setup

    # The case's fields are settings marked as part of a result's identity; a setting added later
    # reaches the key through ``CaseKey.more`` (tests/test_one_setting.py), as proposals from the
    # context do.
    identity = {f.column for f in setup.FIELDS if f.identity}
    assert set(baselines.CASE_COLUMNS) <= identity
    assert identity - set(baselines.CASE_COLUMNS) == {
        "context_draft",
        "synthetic_acceptance",
        "target_device",
        "draft_device",
    }
    from harness.pairs import models

    run = setup.resolve(
        models.get_pair("tiny-llama"), decoding=setup.GenerationSettings(mode="assisted", context_draft=16)
    )
    key = baselines.case_key(run.columns(), "benchmark", 64)
    assert key.more == (("context_draft", 16),) and key.case_id.endswith("-context-draft_16")
    # A GPU host runs CPU targets too, under the same platform name: the device keeps them apart,
    # and the CPU's cases (every stored baseline) keep the keys they had.
    on_gpu = replace(run, target=replace(run.target, device="cuda"))
    gpu_key = baselines.case_key(on_gpu.columns(), "benchmark", 64)
    assert gpu_key != key and ("target_device", "cuda") in gpu_key.more
