"""``python assisted_generation.py``: the seeds' table, JSON rows that resume, ``--compare``, and one
clear line (exit 2) for every bad flag."""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.pairs import models
from harness.settings import results

ROOT = Path(__file__).resolve().parents[1]
SEED_HEADERS = [name for name, _ in results.SEED_COLUMNS]
ACCEPTANCE_HEADERS = [name for name, _ in results.ACCEPTANCE_COLUMNS]
TINY = ["--model_name", "tiny-llama", "--limit", "2", "--max_new_tokens", "8", "--no_progress"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own errors and --help
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(out: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table printed, as (header cells, body rows of cells)."""
    lines = out.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("|--"):
            body = []
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                body.append(_cells(row))
            found.append((_cells(lines[i - 1]), body))
    return found


def table_headers(out: str) -> list[list[str]]:
    return [headers for headers, _ in tables(out)]


def read_json_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plain_table_has_the_seeds_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY, "--wide")
    assert code == 0, err
    (headers,) = table_headers(out)
    assert headers == SEED_HEADERS
    assert "python assisted_generation.py --model_name tiny-llama --task decode" in out
    assert "speedup" not in out.lower()  # nothing assisted, nothing to claim


def test_assisted_json_rows_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rows.jsonl"
    argv = [*TINY, "--compare", "--json", str(path)]
    code, out, err = run_cli(capsys, *argv, "--wide")
    assert code == 0, err

    plain_headers, assisted_headers, compare_headers = table_headers(out)
    assert plain_headers == SEED_HEADERS
    assert assisted_headers[:7] == SEED_HEADERS
    assert assisted_headers[7:] == ACCEPTANCE_HEADERS
    assert "Speedup" in compare_headers

    rows = read_json_rows(path)
    assert sorted((r["example"], r["mode"]) for r in rows) == [
        (1, "assisted"),
        (1, "plain"),
        (2, "assisted"),
        (2, "plain"),
    ]
    wanted = {
        "example", "assisted", "prompt_tokens", "new_tokens", "total_s", "prefill_ms",
        "time_per_token_ms", "tokens_per_s", "drafted", "accepted", "target_forwards", "draft_ms",
        "output_ids", "model", "target_model", "draft_model", "target_precision", "draft_precision",
        "platform", "versions", "num_assistant_tokens", "assistant_schedule", "do_sample", "seed",
        "max_new_tokens",
    }  # fmt: skip
    for row in rows:
        assert wanted <= row.keys(), wanted - row.keys()
        assert row["new_tokens"] == len(row["output_ids"]) == 8
        assert row["model"] == "tiny-llama" and row["target_precision"] == "fp32"
        assert row["versions"]["torch"] and row["versions"]["transformers"]
        assert row["platform"]
        settings = row["extra"]["settings"]
        assert settings["max_new_tokens"] == 8 and settings["ignore_eos"] is False
        if row["assisted"]:
            assert row["draft_model"] == "tiny-llama-draft" and row["num_assistant_tokens"] == 5
            assert row["accepted"] <= row["drafted"]
        else:
            assert row["draft_model"] is None and row["drafted"] == 0
    assert len({r["run_id"] for r in rows}) == 1

    # Rerunning the same command finds every row done: nothing is appended.
    before = path.read_text()
    code, out2, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert path.read_text() == before
    assert len(table_headers(out2)) == 3  # still prints the tables, from the stored rows

    # An interrupted run: the first row, then a row torn mid-write.
    lines = before.splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    after = read_json_rows(path)
    assert len(after) == 4
    assert after[0] == json.loads(lines[0])  # the finished row was kept, not measured again
    assert sorted((r["example"], r["mode"]) for r in after) == sorted((r["example"], r["mode"]) for r in rows)


def test_compare_prints_speedup_per_prompt_and_overall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *TINY, "--compare", "--wide")
    assert code == 0, err
    (_, plain), (_, assisted), (compare, body) = tables(out)
    assert compare[:3] == SEED_HEADERS[:3]
    assert {"Tokens/Sec (plain)", "Tokens/Sec (assisted)", "Speedup"} <= set(compare)
    assert [row[0] for row in body] == ["1", "2"]  # one speedup per prompt
    for row, p, a in zip(body, plain, assisted, strict=True):
        speedup = float(row[compare.index("Speedup")].rstrip("x"))
        # The speedup is the assisted row's tokens/s over the plain row's, from the tables above.
        assert speedup == pytest.approx(float(a[6]) / float(p[6]), abs=0.006)
    assert "Overall (2 prompts)" in out
    summary = out.strip().splitlines()[-1]
    # The speedup is said once, under its table; the last line gives the rates.
    assert out.count("speedup of mean time/token") == 1 and "speedup over plain" not in out
    assert summary.startswith("plain: 2 rows, ") and "assisted: 2 rows, " in summary

    # Assisted alone: no plain rows from this run, so no speedup is claimed.
    code, out, err = run_cli(capsys, *TINY, "--assisted_generation")
    assert code == 0, err
    summary = out.strip().splitlines()[-1]
    assert "no speedup claimed" in summary and "speedup over plain" not in summary


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--num_assistant_tokens", "3", "--assistant_schedule", "heuristic"],
        ["--assistant_schedule", "dynamic"],
    ],
)
def test_printed_commands_are_valid_and_show_only_what_changed(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    code, out, err = run_cli(capsys, *TINY, "--limit", "1", "--assisted_generation", *extra)
    assert code == 0, err
    (command,) = {line.strip("`") for line in out.splitlines() if line.startswith("```python")}
    argv = shlex.split(command)
    assert argv[:2] == ["python", "assisted_generation.py"]
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        assert argv[argv.index(flag) + 1] == value
    # Defaults stay out, as in the seeds' commands...
    for flag in ("--target_precision", "--seed", "--top_p"):
        assert flag not in argv
    if "dynamic" not in extra:
        assert "--assistant_confidence_threshold" not in argv
    # ...and what is printed passes this CLI's own checks, giving back the run's settings.
    parser = cli.build_parser()
    args = parser.parse_args(argv[2:])
    cli._check_flags(args)
    run = cli._run_setup(args, models.get_pair(args.model_name), cli._modes(args))
    given = parser.parse_args([*TINY, "--limit", "1", "--assisted_generation", *extra])
    assert run == cli._run_setup(given, models.get_pair("tiny-llama"), cli._modes(given))


def test_plain_and_assisted_runs_into_one_file_are_not_paired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Separate runs have separate run ids, so their rows never make a speedup together."""
    path = tmp_path / "rows.jsonl"
    assert run_cli(capsys, *TINY, "--limit", "1", "--json", str(path))[0] == 0
    assert run_cli(capsys, *TINY, "--limit", "1", "--assisted_generation", "--json", str(path))[0] == 0
    rows = results.read_rows(path)
    assert [r.mode for r in rows] == ["plain", "assisted"]
    assert rows[0].run_id != rows[1].run_id


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--model_name", "nope-7b"], "unknown model 'nope-7b'"),
        (["--num_assistant_tokens", "0"], "--num_assistant_tokens must be at least 1"),
        (["--temperature", "0", "--do_sample"], "--temperature must be a finite number > 0"),
        (["--prompt_lengths", "12,abc"], "'abc' in '12,abc' is not an integer"),
        (["--prompts", "missing.txt"], "prompts file missing.txt does not exist"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--max_new_tokens", "0"], "--max_new_tokens must be at least 1"),
        (["--prompt_lookup", "0"], "--prompt_lookup must be at least 1"),
        (["--target_device", "npu"], "no NPU backend"),
        (["--draft_device", "tpu"], "Unknown device 'tpu'"),
        (["--target_precision", "fp8"], "invalid choice: 'fp8'"),
        (["--prompt_lookup", "3", "--assisted_generation"], "alternatives"),
        (["--assistant_schedule", "fast"], "invalid choice: 'fast'"),
        (["--top_p", "1.5", "--do_sample"], "--top_p must be in"),
        (["--temperature", "inf", "--do_sample"], "--temperature must be a finite number > 0"),
        (["--temperature", "1e309", "--do_sample"], "--temperature must be a finite number > 0"),
        (["--temperature", "0.5"], "without --do_sample the run decodes greedily"),
        (["--top_k", "5"], "--top_k shapes sampling"),
        (["--num_assistant_tokens", "3"], "this run decodes plainly, without a draft"),
        (["--draft_tree", "0+1"], "--draft_tree shapes the draft's proposals"),
        (["--prompt_lengths", "64"], "--task decode does not read it"),
        (["--new_tokens", "8", "--task", "benchmark_code"], "--new_tokens sets the synthetic prompts"),
        (["--prompt_lookup", "3", "--assistant_model", "d"], "--assistant_model would not be read"),
        (["--task", "translate"], "invalid choice: 'translate'"),
        (["--min_new_tokens", "50", "--max_new_tokens", "8"], "min_new_tokens"),
        (["--weights_dir", "no/such/folder"], "--weights_dir no/such/folder is not a folder"),
        (["--limit", "two"], "invalid int value: 'two'"),
        (["--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["--seed", "-1"], "--seed must be in [0, 2**63)"),
        (["--draft_tree", "0+1", "--num_assistant_tokens", "3"], "--draft_tree proposes a tree"),
        (["--draft_tree", "0+1", "--do_sample", "--assisted_generation"], "--draft_tree decodes greedily"),
        (["--draft_vocab", "-1"], "--draft_vocab must be 0 (the whole vocabulary) or a positive count"),
        (["--synthetic_acceptance", "0.5"], "this run decodes plainly, without a draft"),
        (["--context-tokens", "10"], "--context-tokens must be at least 64"),
        (
            ["--context-tokens", "512", "--prompts", "rag"],
            "--context-tokens builds the prompts of --task dec",
        ),
        (["--context-tokens", "512", "--task", "benchmark"], "--context-tokens builds the prompts of --task"),
        (["--prompts", "chat,poems"], "unknown prompt set 'poems'"),
        (["--concurrency", "0", "--engine", "llama.cpp"], "--concurrency: 0 in '0' must be positive"),
        (["--concurrency", "2"], "--engine transformers decodes one request at a time"),
        (
            ["--concurrency", "9", "--engine", "llama.cpp"],
            "--engine llama.cpp serves at most 8 requests at once",
        ),
        (["--concurrency", "2", "--task", "benchmark", "--engine", "llama.cpp"], "use it with --task decode"),
        (["--synthetic_acceptance", "1.5", "--assisted_generation"], "a probability in [0, 1]"),
        (
            ["--synthetic_acceptance", "0.5", "--assisted_generation", "--do_sample"],
            "--synthetic_acceptance draws the verdict",
        ),
        (
            ["--synthetic_acceptance", "0.5", "--assisted_generation", "--engine", "llama.cpp"],
            "--synthetic_acceptance runs in the harness's own loop",
        ),
        (
            ["--context_draft", "8", "--assisted_generation", "--engine", "openvino"],
            "--context_draft runs in the harness's own loop",
        ),
        (["--platform", "../x"], "must be a slug"),
        (["--execution_provider", "CUDAExecutionProvider"], "applies to ONNX Runtime targets only"),
        (["--json", "/proc/version"], "is not a rows file"),
        (["--json", "/dev/full"], "not a regular file"),
        (["--json", "/etc/hostname/rows.jsonl"], "is a file, so nothing can be created under it"),
        (["--regen-tables", "--rows", "missing.jsonl"], "--rows: no such file missing.jsonl"),
        (["--regen-tables", "--rows", "/bin/true"], "is not a rows file of this harness"),
        (["--regen-tables", "--results_dir", "/etc/hostname"], "is a file, not a folder"),
        (["--task", "sweep", "--results_dir", "/etc/hostname/out"], "is a file, not a folder"),
        (["--task", "sweep", "--results_dir", "/proc/x"], "pass a folder you can write to"),
        (["--regen-tables", "--results_dir", "/proc/x"], "pass a folder you can write to"),
    ],
)
def test_bad_flags_give_one_clear_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str
) -> None:
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad flag was rejected")

    monkeypatch.setattr(models, "load_pair", no_load)
    code, out, err = run_cli(capsys, "--model_name", "tiny-llama", *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("assisted_generation.py: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err and out == ""


def test_json_path_problems_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, *TINY, "--json", str(tmp_path))
    assert code == 2 and "is a folder" in err
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"example": 1}\nnot json\n{"example": 2}\n')
    code, _, err = run_cli(capsys, *TINY, "--json", str(damaged))
    assert code == 2 and f"cannot resume from {damaged}" in err and "fix or remove that line" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "kept", "cut"),
    [
        ('{"a": 1}\n{"b": 2', '{"a": 1}\n', True),  # torn mid-row: cut
        ('{"b": 2', "", True),  # the only row torn
        ('{"a": 1}\n{"b": 2}', '{"a": 1}\n{"b": 2}\n', False),  # whole row, newline lost: kept
        ('{"a": 1}\n', '{"a": 1}\n', False),  # intact
    ],
)
def test_drop_torn_tail(tmp_path: Path, content: str, kept: str, cut: bool) -> None:

    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    assert results.drop_torn_tail(path) is cut
    assert path.read_text() == kept


def test_min_new_tokens_above_a_prompts_budget_is_rejected_before_decoding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Decode prompts of this pair have a 30-token budget; the error names the prompt and the fix.
    code, _, err = run_cli(capsys, "--model_name", "tiny-llama", "--no_progress", "--min_new_tokens", "40")
    assert code == 2
    assert "--min_new_tokens 40 exceeds the 30-token budget" in err and "--max_new_tokens" in err


def test_fast_attention_is_accepted_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY, "--limit", "1", "--fast_attention", "--wide")
    assert code == 0
    assert "--fast_attention" in err and "ignored" in err
    assert table_headers(out)[0] == SEED_HEADERS


def test_tables_fit_120_columns_unless_wide(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY, "--compare")
    assert code == 0, err
    table_lines = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table_lines) == 12 and max(len(line) for line in table_lines) <= 120
    (plain, plain_body), (assisted, _), (compare, _) = tables(out)
    assert plain[:7] == ["#", "Prompt", "New", "Total s", "Prefill ms", "ms/tok", "tok/s"]
    assert "Speedup" in compare and "Draft ms" in assisted
    assert all(len(cell.split(".")[-1]) <= 2 for row in plain_body for cell in row[3:])  # rounded


def test_benchmark_task_on_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys,
        "--model_name", "tiny-llama", "--task", "benchmark", "--prompt_lengths", "32", "--new_tokens", "4",
        "--no_progress", "--compare",
    )  # fmt: skip
    assert code == 0, err
    # plain row, assisted row, compare row: each a 32-token prompt decoding 4 new tokens
    bodies = [body for _, body in tables(out)]
    assert [len(b) for b in bodies] == [1, 1, 1]
    for (row,) in bodies:
        assert row[1:3] == ["32", "4"]


def test_prompts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('"def add(a, b):\\n"\n"hello"\n"x = 1"\n')
    code, out, err = run_cli(
        capsys,
        "--model_name",
        "tiny-qwen2",
        "--prompts",
        str(prompts),
        "--max_new_tokens",
        "3",
        "--no_progress",
    )
    assert code == 0, err
    ((_, body),) = tables(out)
    assert [row[0] for row in body] == ["1", "2", "3"]
    assert body[1][1:3] == ["5", "3"]  # "hello": 5 byte tokens, 3 new tokens


def test_default_model_is_the_offline_pair() -> None:
    default = cli.build_parser().get_default("model_name")
    assert default == models.DEFAULT_PAIR
    spec = models.get_pair(default)
    # Offline: both models come from PyPI packages, not a hub.
    assert spec.target.packaged_key and spec.draft.packaged_key


def test_console_script_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["assisted-generation"] == "harness.cli:main"
    assert callable(cli.main)


def test_help_lists_every_flag_with_help_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The root script itself, run as __main__ (in-process: a subprocess would re-import torch and
    # transformers, which costs more than the rest of this file).
    monkeypatch.setattr(sys, "argv", ["assisted_generation.py", "--help"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(ROOT / "assisted_generation.py"), run_name="__main__")
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: assisted_generation.py")
    for action in cli.build_parser()._actions:
        if not action.option_strings:
            continue
        assert action.help, f"{action.option_strings} has no help text"
        for option in action.option_strings:
            assert option in text, option
    for seed_flag in (
        "--model_name",
        "--task",
        "--assisted_generation",
        "--draft_precision",
        "--fast_attention",
    ):
        assert seed_flag in text


def test_invariant_kernels_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--target_kernels invariant reaches the model, the rows and the printed reproduce command, and
    assisted output equals plain output."""
    path = tmp_path / "rows.jsonl"
    code, out, err = run_cli(
        capsys,
        *TINY,
        "--compare",
        "--target_precision",
        "bf16",
        "--target_kernels",
        "invariant",
        "--json",
        str(path),
    )
    assert code == 0, err
    rows = read_json_rows(path)
    assert {r["target_kernels"] for r in rows} == {"invariant"}
    by_mode = {(r["example"], r["mode"]): r["output_ids"] for r in rows}
    for example in (1, 2):
        assert by_mode[(example, "plain")] == by_mode[(example, "assisted")]
    assert "--target_kernels invariant" in out
    code, _, err = run_cli(capsys, *TINY, "--target_kernels", "fastest")
    assert code == 2 and "--target_kernels" in err


def test_json_refuses_a_file_that_is_not_rows_and_leaves_it_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my own line, no trailing newline")
    code, _, err = run_cli(capsys, *TINY, "--json", str(notes))
    assert code == 2 and "is not a rows file" in err
    assert notes.read_text() == "my own line, no trailing newline"


def test_prompt_past_the_context_is_refused_and_a_budget_past_it_is_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.experiments import runner

    long = tmp_path / "long.txt"
    long.write_text("def f(): return 1 " * 3000 + "\n")
    code, out, err = run_cli(capsys, *TINY, "--prompts", str(long))
    assert code == 2 and "context of 4096 tokens" in err and "Traceback" not in err
    # A tiny context, so the cut is quick to see: prompt + budget may not pass it.
    monkeypatch.setattr(runner, "context_length", lambda pair: 48)
    rows = tmp_path / "rows.jsonl"
    code, out, err = run_cli(
        capsys,
        *TINY[:2],
        "--limit",
        "1",
        "--max_new_tokens",
        "1000000000",
        "--ignore_eos",
        "--json",
        str(rows),
    )
    assert code == 0, err
    assert "new tokens are cut to" in err
    (row,) = results.read_rows(rows)
    assert row.prompt_tokens + row.new_tokens <= 48


@pytest.mark.parametrize("line", ["[1, 2, 3]", "null", '{"example": "1", "mode": "plain"}'])
def test_a_rows_line_of_the_wrong_shape_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(line + "\n" + '{"example": 2}\n')
    code, _, err = run_cli(capsys, *TINY, "--json", str(path))
    assert code == 2 and "Traceback" not in err
    # named by line when it looks like a row, refused whole when it does not start like one
    assert (f"{path}:1" in err and "fix or remove that line" in err) or "is not a rows file" in err


def test_two_runs_on_one_rows_file_never_write_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rows.jsonl"
    with results.exclusive(path):
        code, _, err = run_cli(capsys, *TINY, "--json", str(path))
    assert code == 2 and "another run is writing" in err
    assert not path.exists() or results.read_rows(path) == []
    code, _, err = run_cli(capsys, *TINY, "--json", str(path))
    assert code == 0, err
    assert len(results.read_rows(path)) == 2


def test_every_run_setting_flag_is_built_from_the_fields():
    """The run settings' flags come from ``setup.FIELDS`` (the columns rows carry and the reproduce
    command spells): one option entry per field with a flag, and the parser offers each of them in
    both spellings."""
    from harness.cli import parser
    from harness.settings import setup

    flagged = [f for f in setup.FIELDS if f.flag is not None]
    assert set(parser.setting_flags()) == {f.column for f in flagged}
    offered = {name for action in parser.build_parser()._actions for name in action.option_strings}
    for f in flagged:
        assert f.flag in offered and "--" + f.flag[2:].replace("_", "-") in offered, f.flag


@pytest.mark.parametrize(
    "extra",
    [
        ["--compare", "--limit", "2", "--max_new_tokens", "8"],
        ["--assisted_generation", "--limit", "1", "--max_new_tokens", "6", "--ignore_eos"],
        ["--compare", "--prompt_lookup", "3", "--limit", "1", "--max_new_tokens", "8"],
        ["--task", "benchmark", "--compare", "--prompt_lengths", "24", "--new_tokens", "6"],
        ["--prompts", "PROMPTS", "--max_new_tokens", "6"],
    ],
    ids=["compare", "assisted", "prompt-lookup", "benchmark", "prompts-file"],
)
def test_a_printed_command_reruns_what_made_the_rows(tmp_path, capsys, extra) -> None:
    """Every command the run prints, run again, resumes every row it printed beside (same keys):
    nothing it depends on (modes, limit, budget, prompts, rows file) is left out."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n")
    rows = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-llama", "--no_progress", "--json", str(rows)]
    argv += [str(prompts) if word == "PROMPTS" else word for word in extra]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    commands = set(re.findall(r"```(python assisted_generation\.py [^`]*)```", out))
    assert commands
    keys = {r.key() for r in results.read_rows(rows)}
    for command in commands:
        words = shlex.split(command)[2:]
        code, _, err = run_cli(capsys, *words, "--no_progress")
        assert code == 0, err
        assert f"resumed {len(keys)} of {len(keys)} runs" in err, (command, err)
    assert {r.key() for r in results.read_rows(rows)} == keys  # nothing decoded again


@pytest.mark.real
@pytest.mark.slow
def test_a_category_and_a_long_context_decode_on_the_offline_pair(pairs, tmp_path, capsys):
    """``--prompts summarization`` and ``--context-tokens 1024`` on the default pair: plain and
    assisted rows of each prompt, the long one exactly 1024 tokens, every output the plain one."""
    pairs.require_weights(models.DEFAULT_PAIR)
    rows_path = tmp_path / "rows.jsonl"
    common = ["--compare", "--max_new_tokens", "16", "--no_progress", "--json", str(rows_path)]
    code, _, err = run_cli(capsys, "--prompts", "summarization", "--limit", "2", *common)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--context-tokens", "1024", "--limit", "1", *common)
    assert code == 0, err
    assert "--context-tokens 1024" in out
    rows = read_json_rows(rows_path)
    labels = sorted({r["prompt_label"] for r in rows})
    assert labels == ["ctx1024-difflib-summarize", "summarization-library", "summarization-reef"]
    assert all(r["prompt_tokens"] == 1024 for r in rows if r["prompt_label"].startswith("ctx"))
    by = {(r["prompt_label"], r["mode"]): r["output_ids"] for r in rows}
    assert all(by[label, "plain"] == by[label, "assisted"] for label in labels)
