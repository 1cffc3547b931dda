"""``harness.decoding.generation.generate`` on tiny pairs: its timing identities, its acceptance counts, and
that every pinned setting reaches transformers (and nothing a checkpoint ships does)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch
from helpers import load_pair
from transformers import GenerationConfig
from transformers.generation import candidate_generator

from harness.base.errors import HarnessError
from harness.decoding.generation import generate
from harness.pairs import models
from harness.settings.setup import GenerationSettings
from harness.theory.analysis import count_acceptance
from harness.theory.timing import Forward, Measurement
from harness.weights import tiny

PROMPT = [tiny.BOS_ID, *range(40, 59)]  # 20 tokens


@pytest.fixture(scope="module")
def llama() -> models.LoadedPair:
    return load_pair("tiny-llama")


@pytest.fixture(scope="module")
def opt() -> models.LoadedPair:
    return load_pair("tiny-opt")


def assisted(**kw) -> GenerationSettings:
    return GenerationSettings(mode="assisted", **{"max_new_tokens": 24, "ignore_eos": True, **kw})


def plain(**kw) -> GenerationSettings:
    return GenerationSettings(mode="plain", **{"max_new_tokens": 24, "ignore_eos": True, **kw})


def candidates_per_verify(m: Measurement, prompt_len: int) -> list[int]:
    """How many draft tokens each target forward verified (the first is fed the prompt too)."""
    verifies = [f for f in m.forwards if f.role == "target"]
    return [verifies[0].input_tokens - prompt_len] + [f.input_tokens - 1 for f in verifies[1:]]


def room_per_verify(m: Measurement, prompt_len: int, k: int, budget: int) -> list[int]:
    """The most candidates each verify could hold: K, unless the token budget leaves less room
    (transformers drafts at most budget - generated - 1, keeping a slot for the target's own token)."""
    verifies = [f for f in m.forwards if f.role == "target"]
    generated = [0] + [f.cache_tokens + 1 - prompt_len for f in verifies[1:]]
    return [min(k, budget - g - 1) for g in generated]


# ------------------------------------------------------------------------------------------ timing


@pytest.mark.parametrize("pair_fixture", ["llama", "opt"])
@pytest.mark.parametrize(
    "settings", [plain(), assisted(), assisted(num_assistant_tokens=2, max_new_tokens=9)]
)
def test_timing_identities(
    request: pytest.FixtureRequest, pair_fixture: str, settings: GenerationSettings
) -> None:
    pair = request.getfixturevalue(pair_fixture)
    m = generate(pair, PROMPT, settings)
    new = m.new_tokens
    assert new == settings.max_new_tokens
    # By construction (prefill = start -> end of the first target forward, time/token = the rest over
    # new - 1 tokens) these hold to rounding; they pin down what each seed column means.
    assert m.total_s * 1000 == pytest.approx(m.prefill_ms + (new - 1) * m.time_per_token_ms, rel=1e-6)
    assert m.tokens_per_s == pytest.approx(1000 / m.time_per_token_ms, rel=1e-9)
    assert m.target_ms + m.draft_ms + m.other_ms == pytest.approx(m.total_s * 1000, rel=1e-9)
    # Not by construction: forwards lie inside the call and never overlap, so nothing is counted
    # twice and the remainder is real time outside both models.
    assert m.other_ms >= 0
    spans = sorted((f.start, f.end) for f in m.forwards)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
    assert m.target_prefill_ms <= m.prefill_ms
    assert 0 < m.prefill_ms < m.total_s * 1000


def test_acceptance_counts_plain_and_assisted(llama: models.LoadedPair) -> None:
    p = generate(llama, PROMPT, plain())
    assert (p.drafted, p.accepted, p.draft_forwards) == (0, 0, 0)
    assert p.target_forwards == p.new_tokens
    assert p.acceptance_rate is None

    for k in (1, 3, 7):
        a = generate(llama, PROMPT, assisted(num_assistant_tokens=k))
        assert 0 <= a.accepted <= a.drafted
        assert a.target_forwards <= a.new_tokens
        # Each verify yields its accepted candidates plus one token of the target's own, so the
        # independently counted acceptances and the forward count must add up to the output.
        assert a.accepted + a.target_forwards == a.new_tokens
        assert a.drafted == sum(candidates_per_verify(a, len(PROMPT)))
        assert a.output_ids == p.output_ids  # greedy assisted decoding is exact on fp32 here


def fwd(ids: tuple[int, ...], cache: int) -> Forward:
    return Forward("target", 0.0, 1.0, len(ids), cache, ids)


def test_count_acceptance_first_verify_includes_the_prompt() -> None:
    prompt = [1, 10, 11]
    # Verify 1: prompt + candidates 20 21 22; the target keeps 20 21 and writes 30 instead of 22.
    # Verify 2: its own 30, then candidates 31 32; both kept, plus its next token 33.
    forwards = [fwd((1, 10, 11, 20, 21, 22), 0), fwd((30, 31, 32), 5)]
    sequence = prompt + [20, 21, 30, 31, 32, 33]
    assert count_acceptance(forwards, len(prompt), sequence) == (5, 4)


def test_count_acceptance_stops_at_the_first_miss() -> None:
    # 21 is wrong, so 22 is not accepted even though it matches its position by chance.
    forwards = [fwd((1, 20, 21, 22), 0)]
    assert count_acceptance(forwards, 1, [1, 20, 99, 22]) == (3, 1)


def test_count_acceptance_cut_short_by_eos() -> None:
    # The target agrees with all three candidates, but the second is EOS (2): generation ends there,
    # so the third was drafted but not accepted.
    forwards = [fwd((1, 5, 20, 2, 21), 0)]
    assert count_acceptance(forwards, 2, [1, 5, 20, 2]) == (3, 2)


def test_count_acceptance_cut_short_by_the_budget() -> None:
    # Budget of 3 new tokens: the target's output stops after 3 even though candidates went further.
    forwards = [fwd((1, 20, 21), 0), fwd((22, 23, 24), 3)]
    sequence = [1, 20, 21, 22]
    assert count_acceptance(forwards, 1, sequence) == (4, 2)


def test_count_acceptance_plain_decoding_drafts_nothing() -> None:
    forwards = [fwd((1, 10, 11), 0), fwd((20,), 3), fwd((21,), 4)]
    assert count_acceptance(forwards, 3, [1, 10, 11, 20, 21, 22]) == (0, 0)


# ---------------------------------------------------------------------- settings reach transformers


@pytest.mark.parametrize("k", [1, 3, 7])
def test_constant_schedule_uses_k(llama: models.LoadedPair, k: int) -> None:
    m = generate(llama, PROMPT, assisted(num_assistant_tokens=k))
    verifies = [f for f in m.forwards if f.role == "target"]
    assert verifies[0].input_tokens == len(PROMPT) + k
    assert candidates_per_verify(m, len(PROMPT)) == room_per_verify(m, len(PROMPT), k, 24)


def test_heuristic_schedule_changes_k_and_constant_does_not(llama: models.LoadedPair) -> None:
    k = 3
    heuristic = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="heuristic"))
    counts = candidates_per_verify(heuristic, len(PROMPT))
    room = room_per_verify(heuristic, len(PROMPT), 10**6, 24)
    assert counts[0] == k
    uncapped = [c for c, r in zip(counts, room, strict=True) if c < r]
    assert len(set(uncapped)) > 1, f"heuristic K never changed: {counts}"
    assert any(c > k for c in counts), f"heuristic K never grew past {k}: {counts}"

    constant = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="constant"))
    assert candidates_per_verify(constant, len(PROMPT)) == room_per_verify(constant, len(PROMPT), k, 24)


def test_dynamic_schedule_stops_drafting_early(llama: models.LoadedPair) -> None:
    k = 7
    m = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="dynamic"))
    counts = candidates_per_verify(m, len(PROMPT))
    room = room_per_verify(m, len(PROMPT), k, 24)
    assert any(c < r for c, r in zip(counts, room, strict=True)), (
        f"dynamic never stopped early: {counts} vs {room}"
    )
    assert all(1 <= c <= r for c, r in zip(counts, room, strict=True) if r > 0)
    # The stop is the draft's confidence against the threshold: a tiny threshold lets it run to K,
    # also where transformers would re-fit the threshold between rounds (where scikit-learn is
    # importable: a dev dependency, so that every run of this test has the condition).
    assert candidate_generator.is_sklearn_available(), "install the dev extra: scikit-learn"
    low = generate(
        llama,
        PROMPT,
        assisted(num_assistant_tokens=k, assistant_schedule="dynamic", assistant_confidence_threshold=1e-6),
    )
    assert candidates_per_verify(low, len(PROMPT)) == room_per_verify(low, len(PROMPT), k, 24)
    assert candidate_generator.is_sklearn_available()  # switched off for the call only


def test_k_does_not_leak_between_calls(llama: models.LoadedPair) -> None:
    k = 3
    first = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="heuristic"))
    again = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="heuristic"))
    assert candidates_per_verify(again, len(PROMPT)) == candidates_per_verify(first, len(PROMPT))
    after = generate(llama, PROMPT, assisted(num_assistant_tokens=k))
    assert candidates_per_verify(after, len(PROMPT)) == room_per_verify(after, len(PROMPT), k, 24)
    dynamic = generate(llama, PROMPT, assisted(num_assistant_tokens=k, assistant_schedule="dynamic"))
    assert any(c < k for c in candidates_per_verify(dynamic, len(PROMPT))[:-2])
    # ...and the dynamic threshold does not linger into a constant call either.
    after = generate(llama, PROMPT, assisted(num_assistant_tokens=k))
    assert candidates_per_verify(after, len(PROMPT)) == room_per_verify(after, len(PROMPT), k, 24)


@pytest.mark.parametrize(
    ("schedule", "transformers_name", "threshold"),
    [("constant", "constant", 0.0), ("heuristic", "heuristic_transient", 0.0), ("dynamic", "constant", 0.4)],
)
def test_draft_generation_config_holds_what_was_pinned(
    llama: models.LoadedPair, schedule: str, transformers_name: str, threshold: float
) -> None:
    generate(llama, PROMPT, assisted(num_assistant_tokens=4, assistant_schedule=schedule))
    config = llama.draft.generation_config
    assert config.num_assistant_tokens == 4
    assert config.num_assistant_tokens_schedule == transformers_name
    assert config.assistant_confidence_threshold == pytest.approx(threshold)


def _save_with_shipped_defaults(root: Path, eos: int, suppressed: int) -> None:
    """The tiny llama pair saved as two local folders, each with a generation_config.json of the kind real
    checkpoints ship: sampling and penalties (Qwen, Llama chat), an EOS, suppressed tokens, and
    assistant settings. Transformers fills every field a call leaves unset from these."""
    target = tiny.build_target("tiny-llama")
    draft = tiny.build_draft("tiny-llama", target)
    target.save_pretrained(root / "llama-2-7b")
    tiny.build_tokenizer().save_pretrained(root / "llama-2-7b")
    draft.save_pretrained(root / "llama-160m")
    shipped = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=3,
        top_p=0.8,
        repetition_penalty=1.5,
        no_repeat_ngram_size=2,
        eos_token_id=eos,
        suppress_tokens=[suppressed],
    )
    shipped.save_pretrained(root / "llama-2-7b")
    draft_shipped = GenerationConfig(
        num_assistant_tokens=20, num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0.9
    )
    draft_shipped.save_pretrained(root / "llama-160m")
    on_disk = json.loads((root / "llama-2-7b" / "generation_config.json").read_text())
    assert on_disk["repetition_penalty"] == 1.5 and on_disk["suppress_tokens"] == [suppressed]


def test_checkpoint_shipped_generation_defaults_do_not_change_output(
    tmp_path: Path, llama: models.LoadedPair
) -> None:
    clean_plain = generate(llama, PROMPT, plain())
    clean_assisted = generate(llama, PROMPT, assisted(num_assistant_tokens=3))
    # Shipped defaults chosen to bite: an EOS the output reaches, a suppressed first token.
    _save_with_shipped_defaults(tmp_path, eos=clean_plain.output_ids[3], suppressed=clean_plain.output_ids[0])
    shipped = load_pair(models.local_pair(tmp_path / "llama-2-7b", tmp_path / "llama-160m"))
    assert generate(shipped, PROMPT, plain()).output_ids == clean_plain.output_ids
    got = generate(shipped, PROMPT, assisted(num_assistant_tokens=3))
    assert got.output_ids == clean_assisted.output_ids
    assert candidates_per_verify(got, len(PROMPT)) == candidates_per_verify(clean_assisted, len(PROMPT))

    # Control: left in place, those defaults do change the output, so the comparison above could fail.
    from transformers import AutoModelForCausalLM

    raw = AutoModelForCausalLM.from_pretrained(tmp_path / "llama-2-7b", dtype=torch.float32).eval()
    assert raw.generation_config.repetition_penalty == 1.5
    ids = torch.tensor([PROMPT])
    torch.manual_seed(0)
    with torch.inference_mode():
        out = raw.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24)
    assert out[0, len(PROMPT) :].tolist() != clean_plain.output_ids


def test_ignore_eos_decodes_the_whole_budget(llama: models.LoadedPair) -> None:
    reference = generate(llama, PROMPT, plain(max_new_tokens=12)).output_ids
    eos = reference[4]
    for settings in (
        plain(max_new_tokens=12, eos_token_id=eos),
        assisted(max_new_tokens=12, eos_token_id=eos),
    ):
        m = generate(llama, PROMPT, settings)  # ignore_eos=True in both helpers
        assert m.output_ids == reference


@pytest.mark.parametrize("mode", ["plain", "assisted"])
def test_eos_override_stops_at_that_token(llama: models.LoadedPair, mode: str) -> None:
    reference = generate(llama, PROMPT, plain(max_new_tokens=16)).output_ids
    eos = reference[5]
    stop = reference.index(eos)  # the first time it appears
    settings = GenerationSettings(mode=mode, max_new_tokens=16, eos_token_id=eos)
    m = generate(llama, PROMPT, settings)
    assert m.output_ids == reference[: stop + 1]
    assert m.new_tokens < 16


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_assistant_tokens": 0}, "num_assistant_tokens must be at least 1"),
        ({"assistant_schedule": "fast"}, "assistant_schedule 'fast'"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"do_sample": True, "top_p": 1.5}, "top_p must be in"),
        ({"do_sample": True, "top_k": -1}, "top_k must be >= 0"),
        # Out of range is a typo whether or not sampling is on.
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_k": -2}, "top_k must be >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
        ({"min_new_tokens": 30}, "min_new_tokens must be between"),
        ({"mode": "speculative"}, "mode 'speculative'"),
        ({"assistant_confidence_threshold": 1.5}, "confidence threshold"),
    ],
)
def test_bad_settings_are_rejected_with_a_clear_message(
    llama: models.LoadedPair, change: dict, message: str
) -> None:
    settings = dataclasses.replace(assisted(), **change)
    with pytest.raises(HarnessError, match=message) as info:
        generate(llama, PROMPT, settings)
    assert "invalid generation setting" in str(info.value)


def test_assisting_without_a_draft_or_a_prompt_is_rejected(llama: models.LoadedPair) -> None:
    no_draft = load_pair("tiny-llama", with_draft=False)
    with pytest.raises(HarnessError, match="without a draft"):
        generate(no_draft, PROMPT, assisted())
    with pytest.raises(HarnessError, match="empty prompt"):
        generate(llama, [], plain())


def test_stop_in_new_text_sees_a_stop_string_inside_a_multi_token_step(llama: models.LoadedPair) -> None:
    from harness.decoding.generation import StopInNewText

    tok = llama.tokenizer
    stop = tok.decode([45, 46])  # printable bytes in the tiny tokenizer ("KL")
    criteria = StopInNewText(tok, (stop,), len(PROMPT))
    # In the middle of a block of new tokens (as after an assisted step), not at its end: found.
    assert bool(criteria(torch.tensor([PROMPT + [41, 45, 46, 47, 48]])).all())
    # Before the tokens that spell it: not found; and the prompt (which spells it) never counts.
    assert not bool(criteria(torch.tensor([PROMPT + [41, 45]])).any())
    assert not bool(criteria(torch.tensor([PROMPT])).any())
    with pytest.raises(HarnessError, match="stop strings"):
        StopInNewText(tok, ("",), 0)


def _first_new_printable(tok, ids: list[int], start: int) -> tuple[int, str]:
    """A position >= start whose token decodes to printable text not seen before it."""
    for i in range(start, len(ids)):
        text = tok.decode(ids[i : i + 1])
        if text.isprintable() and text.strip() and "\ufffd" not in text and text not in tok.decode(ids[:i]):
            return i, text
    pytest.skip("no usable stop string in this output")


@pytest.mark.parametrize("k", [2, 5])
def test_assisted_stops_within_one_step_of_plain_at_a_stop_string(llama: models.LoadedPair, k: int) -> None:
    from harness.decoding import strategies

    # The target as its own draft accepts every proposal, so the stop string lands inside a
    # (K+1)-token step rather than at its end: the case a suffix-only check misses.
    pair = strategies.get("self").draft(llama)
    reference = generate(pair, PROMPT, plain(max_new_tokens=24)).output_ids
    at, stop = _first_new_printable(pair.tokenizer, reference, 2 + k // 2)
    p = generate(pair, PROMPT, plain(max_new_tokens=24, stop_strings=(stop,)))
    a = generate(pair, PROMPT, assisted(max_new_tokens=24, stop_strings=(stop,), num_assistant_tokens=k))
    assert p.output_ids == reference[: at + 1], "plain must stop at the token completing the stop string"
    # Assisted decodes the same tokens and stops at the end of the step that completed the stop string.
    assert a.output_ids[: p.new_tokens] == p.output_ids
    assert p.new_tokens <= a.new_tokens <= p.new_tokens + k
