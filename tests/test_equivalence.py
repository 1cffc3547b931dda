"""The divergence table keeps each finished prompt on disk as it is counted."""

from __future__ import annotations

import json

from harness import equivalence, models
from harness.setup import GenerationSettings


def test_divergence_rows_are_written_as_cases_finish(tmp_path):
    pair = models.load_pair("tiny-llama")
    settings = GenerationSettings(mode="assisted", num_assistant_tokens=3, max_new_tokens=6, ignore_eos=True)
    path = tmp_path / "out" / "divergence.jsonl"
    table = equivalence.DivergenceTable(rows_path=path)
    for n, ids in enumerate(([5, 6, 7], [9, 10, 11, 12]), start=1):
        table.add("fp32 / stock", equivalence.check_case(pair, ids, settings), f"p{n}", "tiny-llama")
        # On disk before the next case starts: an interrupted run loses nothing it finished.
        assert len(path.read_text().splitlines()) == n
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["prompt_tokens"] for r in rows] == [3, 4]
    assert all(r["identical"] and r["tokens"] == 6 and r["precision"] == "fp32 / stock" for r in rows)
    assert table.counts["fp32 / stock"] == {"prompts": 2, "tokens": 12, "exact": 2, "near_tie": 0, "other": 0}

    # A rerun with the same file finds both prompts done and counts them without decoding.
    again = equivalence.DivergenceTable(rows_path=path)
    done = again.recorded("fp32 / stock", "tiny-llama")
    assert sorted(done) == ["p1", "p2"]
    assert again.recorded("bf16 / stock", "tiny-llama") == again.recorded("fp32 / stock", "tiny-opt") == {}
    for row in done.values():
        again.add_recorded("fp32 / stock", row)
    assert again.counts == table.counts
