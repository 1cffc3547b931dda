"""One row store for every kind of result (measured rows, HumanEval rows, divergence rows): each is
appended with the same fsync'd write, read with the same tolerant reader, and healed the same way
after a run killed mid-line."""

from __future__ import annotations

import json

import pytest

from harness.experiments import equivalence, humaneval
from harness.settings import results
from harness.theory.timing import Measurement


def _measurement(ids: list[int]) -> Measurement:
    return Measurement(3, ids, 0.1, 1.0, 1.0, 1.0, 10.0, len(ids), 0, 1.0, 0.0, 0.0, 0, 0)


def _torn(path, complete: dict) -> None:
    path.write_text(json.dumps(complete) + "\n" + '{"benchmark": "humaneval", "task_id": "Hum')


def test_a_humaneval_row_after_a_torn_line_is_not_glued_to_it(tmp_path):
    path = tmp_path / "he.jsonl"
    first = {"benchmark": humaneval.BENCHMARK, "task_id": "HumanEval/0", "mode": "plain"}
    _torn(path, first)
    second = {"benchmark": humaneval.BENCHMARK, "task_id": "HumanEval/1", "mode": "plain"}
    results.append_row(path, second)
    assert humaneval.read_results(path) == [first, second]


def test_divergence_rows_resume_after_a_torn_line(tmp_path):
    path = tmp_path / "div.jsonl"
    table = equivalence.DivergenceTable(rows_path=path)
    case = equivalence.CaseResult([1, 2, 3], _measurement([4, 5]), _measurement([4, 5]), None, None, 0.0)
    table.add("fp32", case, prompt="a", pair="tiny")
    with path.open("a") as fh:
        fh.write('{"precision": "fp32", "pro')  # killed mid-write
    table.add("fp32", case, prompt="b", pair="tiny")
    again = equivalence.DivergenceTable(rows_path=path)
    assert {name for name, _ in again.recorded("fp32", "tiny")} == {"a", "b"}


@pytest.mark.parametrize("line", ["[1, 2]", "null", "not json"])
def test_a_damaged_line_inside_any_store_is_named(tmp_path, line):
    path = tmp_path / "rows.jsonl"
    path.write_text(line + "\n" + json.dumps({"benchmark": humaneval.BENCHMARK}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:1: not a result row"):
        results.read_records(path)
    with pytest.raises(Exception, match="fix or remove that line"):
        humaneval.read_results(path)


def test_a_row_killed_between_its_text_and_newline_is_kept(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + json.dumps({"a": 2}))
    results.append_row(path, {"a": 3})
    assert [r["a"] for r in results.read_records(path)] == [1, 2, 3]


def test_a_row_carries_every_identity_column():
    """Rows are the store's schema: every column of ``setup.FIELDS`` is a field of ``Row``, so a
    setting added there without a column here fails now rather than vanishing from the rows."""
    import dataclasses

    from harness.settings import setup

    assert set(setup.column_names()) <= {f.name for f in dataclasses.fields(results.Row)}


@pytest.mark.parametrize(
    "settings",
    [
        dict(mode="plain"),
        dict(mode="assisted", num_assistant_tokens=5),
        dict(mode="prompt_lookup", prompt_lookup_num_tokens=7),
        dict(mode="assisted", do_sample=True, temperature=0.7, top_p=0.9, seed=3),
    ],
    ids=["plain", "assisted", "prompt_lookup", "sampled"],
)
def test_a_result_is_looked_up_before_it_runs_by_the_key_its_row_will_have(tmp_path, settings):
    """Every measurement loop resumes by ``setup.result_key`` of the run it is about to decode; the
    row it then writes, read back as a row or as a plain record (HumanEval's), has that key."""
    from harness.experiments import runner
    from harness.pairs import models
    from harness.settings import setup

    spec = models.get_pair("tiny-llama")
    run = setup.resolve(spec)
    pair = models.LoadedPair.of_engine(spec, run, None, {}, None)
    decoding = setup.GenerationSettings(max_new_tokens=4, **settings)
    where = dict(run_id="r1", task="decode", example=2, prompt_sha=setup.prompt_digest([1, 5, 7]))
    row = runner.make_row(pair, _measurement([4, 4, 4, 4]), decoding, **where)
    key = setup.result_key(pair.run_setup(decoding), **where)
    path = tmp_path / "rows.jsonl"
    results.append_row(path, row.to_dict())
    assert (
        row.key() == key == results.read_rows(path)[0].key() == setup.row_key(results.read_records(path)[0])
    )
    # Another prompt, example, run or setting is another result.
    for other in (dict(prompt_sha="x"), dict(example=3), dict(run_id="r2")):
        assert setup.result_key(pair.run_setup(decoding), **{**where, **other}) != key
    changed = setup.GenerationSettings(max_new_tokens=5, **settings)
    assert setup.result_key(pair.run_setup(changed), **where) != key


def test_rows_carry_acceptance_per_draft_position(tmp_path, capsys):
    """Each assisted row holds [drafted, accepted] per draft position, read off its verifications:
    positions drafted no more often than the one before, accepted never more than drafted, and the
    accepted total the row's own."""
    from harness import cli
    from harness.settings.results import read_rows

    path = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-llama", "--compare", "--limit", "2", "--max_new_tokens", "24",
            "--num_assistant_tokens", "4", "--no_progress", "--json", str(path)]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    rows = read_rows(path)
    assert all(r.accepted_by_position is None for r in rows if r.mode == "plain")
    for r in (r for r in rows if r.mode == "assisted"):
        counts = r.accepted_by_position
        assert counts and len(counts) <= 4
        assert all(0 <= a <= d for d, a in counts)
        assert all(later[0] <= earlier[0] for earlier, later in zip(counts, counts[1:], strict=False))
        assert sum(a for _, a in counts) == r.accepted and sum(d for d, _ in counts) == r.drafted
        # Tokens per verification, as vLLM counts it: 1 + accepted per round that drafted.
        assert r.acceptance_length == pytest.approx(1 + r.accepted / counts[0][0])
        assert 1.0 <= r.acceptance_length <= 5.0
    assert all(r.acceptance_length is None for r in rows if r.mode == "plain")
