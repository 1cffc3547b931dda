"""Equivalence plumbing: the divergence table keeps each finished prompt on disk as it is counted;
each draft strategy states the acceptance it implies."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import load_pair

from harness.experiments import equivalence
from harness.settings import setup
from harness.settings.setup import GenerationSettings
from harness.theory.timing import Measurement


def test_divergence_rows_are_written_as_cases_finish(tmp_path):
    pair = load_pair("tiny-llama")
    settings = GenerationSettings(mode="assisted", num_assistant_tokens=3, max_new_tokens=6, ignore_eos=True)
    path = tmp_path / "out" / "divergence.jsonl"
    table = equivalence.DivergenceTable(rows_path=path)
    for n, ids in enumerate(([5, 6, 7], [9, 10, 11, 12]), start=1):
        case = equivalence.check_case(pair, ids, settings)
        table.add("fp32 / stock", case, f"p{n}", "tiny-llama", setup.prompt_digest(ids))
        # On disk before the next case starts: an interrupted run loses nothing it finished.
        assert len(path.read_text().splitlines()) == n
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["prompt_tokens"] for r in rows] == [3, 4]
    assert all(r["identical"] and r["tokens"] == 6 and r["precision"] == "fp32 / stock" for r in rows)
    assert all(r["versions"]["torch"] == torch.__version__ for r in rows)  # what measured them
    assert table.counts["fp32 / stock"] == {"prompts": 2, "tokens": 12, "exact": 2, "near_tie": 0, "other": 0}

    # A rerun with the same file finds both prompts done and counts them without decoding.
    again = equivalence.DivergenceTable(rows_path=path)
    done = again.recorded("fp32 / stock", "tiny-llama")
    assert sorted(done) == [
        ("p1", setup.prompt_digest([5, 6, 7])),
        ("p2", setup.prompt_digest([9, 10, 11, 12])),
    ]
    # ...and an edited prompt under the same name is not among them (its digest differs).
    assert ("p1", setup.prompt_digest([5, 6, 8])) not in done
    assert again.recorded("bf16 / stock", "tiny-llama") == again.recorded("fp32 / stock", "tiny-opt") == {}
    for row in done.values():
        again.add_recorded("fp32 / stock", row)
    assert again.counts == table.counts


def test_each_strategy_states_the_acceptance_it_implies() -> None:
    """What a test's summed acceptance must be, per strategy, stated once (transformers' test_utils
    states the same expectations: the same model accepts all, a random one none)."""
    from harness.decoding import strategies

    def ok(name: str, drafted: int, accepted: int, vocab: int = 151936, whole: bool = True) -> bool:
        return strategies.get(name).acceptance_problem(drafted, accepted, vocab, whole) is None

    assert ok("self", 20, 20) and not ok("self", 20, 19)
    assert ok("random", 20, 0) and not ok("random", 20, 1)
    assert ok("random", 20, 1, vocab=512) and not ok("random", 20, 5, vocab=512)  # chance on a tiny vocab
    assert ok("partial", 20, 7) and not ok("partial", 20, 0) and not ok("partial", 20, 20)
    assert ok("partial", 20, 20, whole=False)  # an EOS inside the budget can end it before a miss
    assert ok("draft", 20, 1) and not ok("draft", 20, 0)
    assert ok("prompt_lookup", 20, 0)
    assert strategies.get("prompt_lookup").settings(4, "constant", 16).mode == "prompt_lookup"
    assert strategies.get("self").settings(4, "dynamic", 16).assistant_schedule == "dynamic"
    with pytest.raises(ValueError, match="draft, self, random, partial, prompt_lookup"):
        strategies.get("medusa")


@pytest.mark.parametrize(
    ("gap", "exact_judge", "near_tie"),
    [
        (0.2, True, True),
        (-0.2, True, False),  # plain decoding's own logits put the other token ahead: a fault
        (-0.2, False, True),  # a one-prompt replay's rounding put it ahead: a near tie all the same
        (0.7, False, False),
        (-0.7, False, False),
        (None, False, False),
    ],
)
def test_a_flip_is_a_near_tie_by_its_judge(gap, exact_judge, near_tie):
    m = Measurement(3, [1, 2], 0.1, 1.0, 1.0, 1.0, 1.0, 2, 0, 1.0, 0.0, 0.0, 0, 0)
    case = equivalence.CaseResult([1], m, m, 1, gap, 0.5, 10, exact_judge)
    assert case.near_tie is near_tie and case.acceptable is near_tie


def test_engines_say_whether_their_judge_replays_plain_decoding_step_for_step():
    from harness.decoding import genai, llama_server, openvino, served

    assert genai.GenaiEngine.exact_judge
    assert not any(
        e.exact_judge for e in (llama_server.LlamaCppEngine, openvino.OpenVinoEngine, served.ServedEngine)
    )
