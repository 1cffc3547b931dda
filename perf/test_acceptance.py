"""Acceptance held on every host: each engine's drafting over a real prompt set, against its reference.

Speed gates hold a platform to its own baselines; acceptance holds on any host kind. Each engine
(transformers' loop as the pair is registered, and every engine of ``--engines`` with its own loop)
runs ``--acceptance-prompts`` prompts to the whole budget, and the run is held to the reference in
``baselines/acceptance.json`` over the prompts it ran: acceptance length at least 95% of the
reference's, each position's acceptance at least its floor (``harness.settings.acceptance``).
``--update-baselines`` records the references instead. A dead draft fails the tier on acceptance
alone, its output unchanged, and no platform's baseline is consulted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.decoding import strategies
from harness.experiments import acceptance as tier
from harness.pairs.models import LoadedPair
from harness.settings import acceptance
from harness.settings.results import runs_dir

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "baselines"
# Prompts the dead-draft test runs, with the dead draft and with the unchanged one: a few suffice,
# as a dead draft falls far below any floor.
DEAD_DRAFT_PROMPTS = 6


def _measure(pair: LoadedPair, n: int, platform_name: str) -> list[acceptance.PromptAcceptance]:
    rows = tier.rows_path(platform_name, runs_dir())
    settings = tier.tier_settings(pair)
    return tier.measure(pair, tier.tier_prompts(n), settings, rows=rows, platform=platform_name)


@pytest.mark.pairs(tiny=False)
@pytest.mark.engines(built_in=True)
def test_acceptance_tier(pairs, pair_name, engine, pytestconfig, platform_name, record_property):
    pair = pairs.get(pair_name, engine=engine)
    settings = tier.tier_settings(pair)
    key = tier.reference_key(pair, settings)
    measured = _measure(pair, pytestconfig.getoption("--acceptance-prompts"), platform_name)
    if pytestconfig.getoption("--update-baselines"):
        path = acceptance.save(BASELINES, tier.reference(pair, settings, measured, platform_name))
        record_property("acceptance", f"reference written: {path.relative_to(ROOT)} ({key})")
        return
    verdict = acceptance.check(acceptance.load(BASELINES, key), measured, key, BASELINES)
    record_property("acceptance", verdict.describe())
    assert verdict.passed, "\n".join(verdict.problems)


@pytest.mark.pairs(tiny=False)
def test_acceptance_tier_dead_draft_is_caught_on_acceptance_alone(pairs, pair_name, platform_name):
    """A draft of fresh random weights (agreeing with the target by chance only) decodes the same
    tokens, so no equality test can see it; held to the registered draft's reference it fails, and
    the registered draft on the same prompts passes. Neither consults a platform's baseline: the
    reference holds on any host kind."""
    pairs.require_weights(pair_name)
    pair = pairs.get(pair_name)
    key = tier.reference_key(pair, tier.tier_settings(pair))
    reference = acceptance.load(BASELINES, key)
    assert reference is not None, f"no acceptance reference for {key}: record it with --update-baselines"
    unchanged = _measure(pair, DEAD_DRAFT_PROMPTS, platform_name)
    dead = _measure(strategies.get("random").draft(pair), DEAD_DRAFT_PROMPTS, platform_name)
    assert [p.output_sha for p in dead] == [p.output_sha for p in unchanged]  # the same tokens
    passed = acceptance.check(reference, unchanged, key, BASELINES)
    assert passed.passed, "\n".join(passed.problems)
    caught = acceptance.check(reference, dead, key, BASELINES)
    assert not caught.passed
    assert any("REGRESSION: acceptance length" in problem for problem in caught.problems), caught.problems
    assert caught.measured.acceptance_length is not None and caught.measured.acceptance_length < 1.1
