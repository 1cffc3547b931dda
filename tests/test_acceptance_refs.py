"""Acceptance references: held over the prompts a run shares with its reference, with a floor on the
acceptance length and one per position; what is missing is a failure that says how to record it."""

from __future__ import annotations

import json

import pytest

from harness.base.errors import HarnessError
from harness.settings import acceptance
from harness.settings.acceptance import PromptAcceptance

KEY = "pair/acceptance-n32-k3"


def _prompt(label: str, accepted: tuple[int, int, int], rounds: int = 10) -> PromptAcceptance:
    """A chain of 3 over ``rounds`` verifications, ``accepted`` at each position; its tokens follow."""
    by_position = tuple((rounds, a) for a in accepted)
    new_tokens = 1 + rounds + sum(accepted)
    return PromptAcceptance(label, f"sha-{label}", new_tokens, 1 + rounds, by_position, f"out-{label}")


def _reference(prompts: list[PromptAcceptance]) -> acceptance.Reference:
    return acceptance.Reference(KEY, {"task": "acceptance"}, tuple(prompts), "host (family 26 model 2)")


REFERENCE = [_prompt(f"p{i}", (8, 6, 4)) for i in range(8)]


def test_the_acceptance_length_is_tokens_per_verification():
    summary = acceptance.summarize(REFERENCE)
    assert summary.acceptance_length == pytest.approx(1 + 18 / 10)
    assert summary.rates == pytest.approx((0.8, 0.6, 0.4)) and summary.drafted == (80, 80, 80)
    # Each floor: the rate less three standard errors over 80 drafted tokens, at least 5 points.
    expected = tuple(r - 3 * (r * (1 - r) / 80) ** 0.5 for r in (0.8, 0.6, 0.4))
    assert summary.floors() == pytest.approx(expected)


def test_an_unchanged_run_and_a_near_tie_or_two_pass(tmp_path):
    moved = [_prompt("p0", (7, 6, 4)), *REFERENCE[1:]]  # one round rejected a token earlier
    for run in (REFERENCE, moved, REFERENCE[:3]):
        verdict = acceptance.check(_reference(REFERENCE), run, KEY, tmp_path)
        assert verdict.passed, verdict.problems


def test_a_run_below_95_percent_of_the_acceptance_length_fails_naming_both(tmp_path):
    worse = [_prompt(f"p{i}", (7, 5, 3)) for i in range(8)]  # 2.5 against 2.8 tokens per verification
    verdict = acceptance.check(_reference(REFERENCE), worse, KEY, tmp_path)
    assert not verdict.passed
    named = [p for p in verdict.problems if "acceptance length 2.500 < 2.660" in p and "2.800" in p]
    assert named, verdict.problems


def test_a_position_below_its_floor_fails_though_the_length_holds(tmp_path):
    # Position 3 collapses while positions 1-2 gain: the length stays within 95%, the floor catches it.
    shifted = [_prompt(f"p{i}", (10, 7, 0)) for i in range(8)]
    verdict = acceptance.check(_reference(REFERENCE), shifted, KEY, tmp_path)
    assert len(verdict.problems) == 1 and "position 3 accepted 0.000" in verdict.problems[0]


def test_a_missing_reference_or_prompt_fails_saying_how_to_record_it(tmp_path):
    missing = acceptance.check(None, REFERENCE, KEY, tmp_path)
    assert not missing.passed and "--update-baselines" in missing.problems[0] and KEY in missing.problems[0]
    changed = [PromptAcceptance("p0", "another text", 31, 11, None), *REFERENCE[1:]]
    verdict = acceptance.check(_reference(REFERENCE), changed, KEY, tmp_path)
    assert not verdict.passed and "p0" in verdict.problems[0] and "--update-baselines" in verdict.problems[0]


def test_a_run_that_lost_its_positions_fails(tmp_path):
    books_only = [PromptAcceptance(p.label, p.sha, p.new_tokens, p.target_forwards) for p in REFERENCE]
    verdict = acceptance.check(_reference(REFERENCE), books_only, KEY, tmp_path)
    assert [p for p in verdict.problems if "counted none" in p]


def test_references_are_stored_per_key_and_read_back(tmp_path):
    acceptance.save(tmp_path, _reference(REFERENCE))
    other = acceptance.Reference("pair/other", {}, (REFERENCE[0],))
    acceptance.save(tmp_path, other)
    assert acceptance.load(tmp_path, KEY) == _reference(REFERENCE)
    assert acceptance.load(tmp_path, "pair/other") == other
    assert acceptance.load(tmp_path, "pair/none") is None
    doc = json.loads((tmp_path / acceptance.FILE_NAME).read_text())
    assert list(doc["references"]) == sorted(doc["references"])
    assert doc["references"][KEY]["summary"]["acceptance_length"] == 2.8
    assert not list(tmp_path.glob("*.lock"))


def test_a_damaged_reference_file_is_a_clear_error(tmp_path):
    (tmp_path / acceptance.FILE_NAME).write_text("{not json")
    with pytest.raises(HarnessError, match="git checkout"):
        acceptance.load(tmp_path, KEY)
    (tmp_path / acceptance.FILE_NAME).write_text(json.dumps({"schema": 0}))
    with pytest.raises(HarnessError, match="--update-baselines"):
        acceptance.load(tmp_path, KEY)
