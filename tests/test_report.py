"""Published tables and figures: seed format, honest speedup claims, reproducible commands, regen."""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path
from typing import Any

import pytest

from harness.report import (
    MIN_TIMED_TOKENS,
    chosen_run,
    compare_rows,
    compare_table,
    regen_results,
    seed_table,
    summary_line,
)
from harness.settings import setup
from harness.settings.results import ACCEPTANCE_COLUMNS, SEED_COLUMNS, Row

SEED_HEADER = (
    "|   Example# |   Prompt Length (tokens) |   New Tokens Generated |   Total Time (s) "
    "|   Prefill Phase (ms) |   Time/Token (ms) |   Tokens/Sec |"
)


def make_row(**overrides: Any) -> Row:
    """A complete row; timings follow the row's own definitions so derived numbers are consistent."""
    mode = overrides.pop("mode", "plain")
    assisted = mode != "plain"
    new_tokens = overrides.pop("new_tokens", 30)
    time_per_token_ms = overrides.pop("time_per_token_ms", 150.0)
    prefill_ms = overrides.pop("prefill_ms", 400.0)
    drafted = 60 if mode == "assisted" else (40 if mode == "prompt_lookup" else 0)
    accepted = 45 if assisted else 0
    fields: dict[str, Any] = dict(
        example=1,
        mode=mode,
        assisted=assisted,
        task="decode",
        model="qwen2.5-coder-1.5b",
        target_model="Qwen2.5-Coder-1.5B-Instruct",
        draft_model="Qwen2.5-Coder-0.5B-Instruct" if mode == "assisted" else None,
        target_precision="bf16",
        draft_precision="int8" if mode == "assisted" else None,
        target_device="cpu",
        draft_device="cpu" if mode == "assisted" else None,
        num_assistant_tokens=6 if mode == "assisted" else None,
        assistant_schedule="constant" if mode == "assisted" else None,
        assistant_confidence_threshold=None,
        prompt_lookup_num_tokens=10 if mode == "prompt_lookup" else None,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        seed=None,
        max_new_tokens=30,
        min_new_tokens=None,
        prompt_tokens=8,
        new_tokens=new_tokens,
        total_s=(prefill_ms + time_per_token_ms * (new_tokens - 1)) / 1000,
        prefill_ms=prefill_ms,
        target_prefill_ms=prefill_ms * 0.9,
        time_per_token_ms=time_per_token_ms,
        tokens_per_s=1000 / time_per_token_ms if time_per_token_ms else math.inf,
        target_forwards=12 if assisted else new_tokens,
        draft_forwards=60 if mode == "assisted" else 0,
        target_ms=1000.0,
        draft_ms=300.0 if mode == "assisted" else 0.0,
        other_ms=20.0,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        tokens_per_target_forward=new_tokens / (12 if assisted else new_tokens),
        output_ids=list(range(new_tokens)),
        platform="amd-epyc-2c",
        prompt_label="general-capital",
        versions={"torch": "2.13.0", "transformers": "5.23.0"},
        run_id="run-a",
        timestamp="2025-01-01T00:00:00",
        extra={},
    )
    fields.update(overrides)
    return Row(**fields)


def _run(run_id: str = "run-a", speedups: tuple[float, ...] = (1.5, 2.0, 0.8)) -> list[Row]:
    """Plain and assisted rows of the same prompts in one run; assisted is ``speedups[i]`` faster."""
    rows = []
    for i, s in enumerate(speedups, 1):
        plain_tpt = 100.0 + 10 * i
        rows.append(make_row(example=i, prompt_tokens=5 + i, time_per_token_ms=plain_tpt, run_id=run_id))
        rows.append(
            make_row(
                example=i,
                prompt_tokens=5 + i,
                mode="assisted",
                time_per_token_ms=plain_tpt / s,
                run_id=run_id,
            )
        )
    return rows


def test_seed_table_header_and_numbers() -> None:
    rows = [make_row(example=1, time_per_token_ms=132.503), make_row(example=2, mode="assisted")]
    table = seed_table(rows).splitlines()
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[:7] == [name for name, _ in SEED_COLUMNS]
    assert cells[7:] == [name for name, _ in ACCEPTANCE_COLUMNS]
    assert table[0].startswith(SEED_HEADER[:-1])
    assert len(table) == 4  # header, rule, two rows
    plain_cells = [c.strip() for c in table[2].strip("|").split("|")]
    # tabulate's default "g" format (six significant digits), as the seeds print: 4.33197, 132.503.
    assert plain_cells[:7] == ["1", "8", "30", "4.24259", "400", "132.503", f"{1000 / 132.503:g}"]
    assert plain_cells[7:10] == ["0", "0", "-"]  # a plain row drafted nothing: no acceptance rate
    assisted_cells = [c.strip() for c in table[3].strip("|").split("|")]
    assert assisted_cells[7:10] == ["60", "45", "0.75"]


def test_seed_table_without_acceptance_matches_seed_header_exactly() -> None:
    table = seed_table([make_row()], acceptance=False).splitlines()
    assert table[0] == SEED_HEADER
    assert table[1] == (
        "|------------|--------------------------|------------------------|------------------"
        "|----------------------|-------------------|--------------|"
    )


def test_summary_claims_no_speedup_without_plain_rows() -> None:
    assisted_only = [r for r in _run() if r.mode == "assisted"]
    line = summary_line(assisted_only)
    assert "no speedup claimed" in line and "speedup over plain" not in line
    assert "mean acceptance 0.75" in line
    # Plain rows from a different run are not a baseline either.
    other_run_plain = [r for r in _run("run-b") if r.mode == "plain"]
    assert "no speedup claimed" in summary_line(assisted_only + other_run_plain)
    # Only plain rows: nothing assisted, so neither a claim nor a disclaimer.
    assert "speedup" not in summary_line(other_run_plain)


def test_summary_claims_speedup_with_paired_plain_rows() -> None:
    rows = _run(speedups=(2.0, 2.0, 2.0))
    line = summary_line(rows)
    assert "speedup over plain 2.00x" in line and "3 prompts paired" in line
    assert "no speedup claimed" not in line
    # Pooled: every row's tokens after the first over the time they took, not a mean of rates.
    tokens = [r.new_tokens - 1 for r in rows if r.mode == "plain"]
    times = [(r.new_tokens - 1) * r.time_per_token_ms for r in rows if r.mode == "plain"]
    assert f"plain: 3 rows, {1000 * sum(tokens) / sum(times):.2f} tokens/s" in line


def test_compare_pairs_same_prompt_same_run() -> None:
    rows = _run("run-a", (1.5, 2.0, 0.8)) + _run("run-b", (3.0, 3.0, 3.0))
    # An unpaired assisted row (no plain row for example 9) must be left out.
    rows.append(make_row(example=9, mode="assisted", run_id="run-a"))
    # A plain row of the same example but another prompt length is not its baseline.
    rows.append(make_row(example=1, prompt_tokens=99, run_id="run-a", time_per_token_ms=1.0))
    pairs = compare_rows(rows)
    assert [(p["run_id"], p["example"]) for p in pairs] == [
        ("run-a", 1),
        ("run-a", 2),
        ("run-a", 3),
        ("run-b", 1),
        ("run-b", 2),
        ("run-b", 3),
    ]
    for pair, expected in zip(pairs, (1.5, 2.0, 0.8, 3.0, 3.0, 3.0), strict=True):
        assert pair["speedup"] == pytest.approx(pair["assisted_tokens_per_s"] / pair["plain_tokens_per_s"])
        assert pair["speedup"] == pytest.approx(expected)
        assert pair["acceptance_rate"] == 0.75
        assert pair["identical"] is True


def test_compare_does_not_pair_across_target_precision_or_sampling() -> None:
    plain = make_row(target_precision="fp32")
    assisted = make_row(mode="assisted", target_precision="bf16")
    assert compare_rows([plain, assisted]) == []
    sampled = make_row(mode="assisted", do_sample=True, temperature=1.0)
    assert compare_rows([make_row(), sampled]) == []


def test_compare_flags_different_outputs() -> None:
    plain = make_row()
    assisted = make_row(mode="assisted", output_ids=[0, 1, 2, 99])
    (pair,) = compare_rows([plain, assisted])
    assert pair["identical"] is False
    text = compare_table([plain, assisted])
    assert "| no " in text and "Same = no: the assisted output left plain greedy decoding's" in text
    assert "Same = no" not in compare_table([plain, make_row(mode="assisted")])  # said only where it shows


def test_compare_table_overall_line() -> None:
    rows = _run(speedups=(1.5, 2.0, 0.8))
    text = compare_table(rows)
    plain = [110.0, 120.0, 130.0]
    assisted = [110 / 1.5, 120 / 2.0, 130 / 0.8]
    of_means = (sum(plain) / 3) / (sum(assisted) / 3)
    geo = (1.5 * 2.0 * 0.8) ** (1 / 3)
    assert f"speedup of mean time/token {of_means:.2f}x" in text
    assert f"geometric mean of per-prompt speedups {geo:.2f}x" in text
    assert "1.50x" in text and "0.80x" in text
    assert text.splitlines()[0].startswith("```python assisted_generation.py")
    assert "no speedup to report" in compare_table([r for r in rows if r.mode == "plain"])


def test_compare_table_reads_end_to_end_beside_decoding() -> None:
    """A request's whole time counts its prefill: an assisted request twice as fast in decoding behind
    a slower prefill gains less end to end, and the table says so per prompt and overall."""
    common = dict(new_tokens=101, prompt_tokens=2048)
    plain = make_row(mode="plain", time_per_token_ms=40.0, prefill_ms=10_000.0, **common)
    assisted = make_row(mode="assisted", time_per_token_ms=20.0, prefill_ms=11_000.0, **common)
    text = compare_table([plain, assisted])
    # Decoding 40 against 20 ms a token: 2.00x. End to end 14 s against 13 s: 1.08x.
    line = next(row for row in text.splitlines() if row.startswith("|          1 |"))
    assert "2.00x" in line and "1.08x" in line
    assert "end to end, prefill included, 1.08x" in text


def _cli_parser() -> argparse.ArgumentParser:
    """The flags the seeds' assisted_generation.py takes, as a reader of the command would parse them."""
    p = argparse.ArgumentParser()
    p.add_argument("--model_name", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--assisted_generation", action="store_true")
    p.add_argument("--draft_precision", default="bf16")
    p.add_argument("--target_precision", default="bf16")
    p.add_argument("--do_sample", action="store_true")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top_p", type=float)
    p.add_argument("--top_k", type=int)
    p.add_argument("--num_assistant_tokens", type=int, default=6)
    p.add_argument("--assistant_schedule", default="constant")
    p.add_argument("--assistant_confidence_threshold", type=float)
    p.add_argument("--prompt_lookup", type=int)
    p.add_argument("--seed", type=int)
    return p


DEFAULTS = {"draft_precision": "bf16", "target_precision": "bf16", "num_assistant_tokens": 6}
DEFAULTS["assistant_schedule"] = "constant"


@pytest.mark.parametrize(
    "row",
    [
        make_row(),
        make_row(mode="assisted"),
        make_row(mode="assisted", draft_precision="bf16", num_assistant_tokens=6),
        make_row(mode="assisted", target_precision="int4", assistant_schedule="heuristic", seed=3),
        make_row(mode="assisted", do_sample=True, temperature=0.1, top_p=0.95, top_k=50, seed=42),
        make_row(mode="assisted", assistant_schedule="dynamic", assistant_confidence_threshold=0.4),
        make_row(mode="prompt_lookup", task="benchmark", model="facebook/opt 6.7b"),
    ],
)
def test_reproduce_command_round_trips(row: Row) -> None:
    command = setup.command(row, DEFAULTS)
    argv = shlex.split(command)
    assert argv[:2] == ["python", "assisted_generation.py"]
    args = _cli_parser().parse_args(argv[2:])
    assert (args.model_name, args.task) == (row.model, row.task)
    assert args.assisted_generation == (row.mode == "assisted")
    assert args.target_precision == row.target_precision
    assert args.do_sample == row.do_sample
    assert (args.temperature, args.top_p, args.top_k) == (row.temperature, row.top_p, row.top_k)
    assert args.seed == row.seed
    if row.mode == "assisted":
        assert args.draft_precision == row.draft_precision
        assert args.num_assistant_tokens == row.num_assistant_tokens
        assert args.assistant_schedule == row.assistant_schedule
        assert args.assistant_confidence_threshold == row.assistant_confidence_threshold
    assert args.prompt_lookup == row.prompt_lookup_num_tokens


def test_reproduce_command_matches_seed_spelling() -> None:
    assert (
        setup.command(make_row(), DEFAULTS)
        == "python assisted_generation.py --model_name qwen2.5-coder-1.5b --task decode"
    )
    assisted = make_row(mode="assisted", draft_precision="w8af32", do_sample=True, temperature=1.0)
    assert setup.command(assisted, DEFAULTS) == (
        "python assisted_generation.py --model_name qwen2.5-coder-1.5b --task decode --assisted_generation "
        "--draft_precision w8af32 --do_sample --temperature 1.0"
    )
    # Without defaults every setting is spelled out, so the command reproduces the row on its own.
    assert "--num_assistant_tokens 6 --assistant_schedule constant" in setup.command(
        make_row(mode="assisted")
    )


def _regen_rows() -> list[Row]:
    rows = _run("run-a", (1.5, 2.0, 0.8))
    rows += [make_row(example=i, mode="assisted", do_sample=True, temperature=1.0, seed=1) for i in (1, 2)]
    rows += [make_row(task="benchmark", example=1, prompt_tokens=256, max_new_tokens=64, new_tokens=64)]
    rows += [make_row(model="other-model", platform="h100-x1", example=1)]
    # An older measurement of example 1 plain that the newer one must replace in the published table.
    rows.insert(
        0, make_row(example=1, prompt_tokens=6, time_per_token_ms=999.0, timestamp="2024-01-01", run_id="old")
    )
    return rows


def test_regen_results_writes_md_and_png_deterministically(tmp_path: Path) -> None:
    rows = _regen_rows()
    paths = regen_results(rows, tmp_path, DEFAULTS)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "amd-epyc-2c/qwen2.5-coder-1.5b-speedup.png",
        "amd-epyc-2c/qwen2.5-coder-1.5b.md",
        "h100-x1/other-model-speedup.png",
        "h100-x1/other-model.md",
    ]
    md_path = tmp_path / "amd-epyc-2c" / "qwen2.5-coder-1.5b.md"
    md = md_path.read_text()
    first = md_path.read_bytes()
    png = (tmp_path / "amd-epyc-2c" / "qwen2.5-coder-1.5b-speedup.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000

    # One section per distinct command, in sorted order, each a fenced command then a seed table.
    commands = [line.strip("`") for line in md.splitlines() if line.startswith("```python")]
    expected = sorted({setup.command(r, DEFAULTS) for r in rows if r.model == "qwen2.5-coder-1.5b"})
    assert commands[: len(expected)] == expected
    assert md.count(SEED_HEADER[:-1]) == len(expected)
    assert "999" not in md  # the older row was superseded by the newer one of the same prompt
    assert "![Speed up summary](./qwen2.5-coder-1.5b-speedup.png)" in md
    assert "speedup of mean time/token" in md
    assert not list(tmp_path.rglob("*.tmp"))

    # Same rows in another order: same markdown bytes.
    again = regen_results(list(reversed(rows)), tmp_path, DEFAULTS)
    assert again == paths
    assert md_path.read_bytes() == first
    assert (tmp_path / "amd-epyc-2c" / "qwen2.5-coder-1.5b-speedup.png").read_bytes() == png


def test_compare_handles_degenerate_speeds() -> None:
    plain = make_row(tokens_per_s=math.inf, time_per_token_ms=0.0)
    (pair,) = compare_rows([plain, make_row(mode="assisted")])
    assert pair["speedup"] is None
    assert "-" in compare_table([plain, make_row(mode="assisted")])


def test_regen_files_are_world_readable(tmp_path: Path) -> None:
    for path in regen_results([make_row()], tmp_path):
        assert path.stat().st_mode & 0o444 == 0o444


def _ort_row(**overrides: Any) -> Row:
    fields: dict[str, Any] = dict(
        mode="assisted",
        model="tiny-qwen2",
        target_precision="ort-int4-b64-afp32",
        draft_precision="fp32",
        target_backend="onnxruntime",
        execution_provider="CPUExecutionProvider",
    )
    return make_row(**(fields | overrides))


def test_reproduce_command_of_an_onnxruntime_row_parses_back_to_its_settings():
    from harness import cli
    from harness.base.backends import OrtSettings
    from harness.pairs import models

    row = _ort_row()
    command = setup.command(row, setup.defaults(models.get_pair("tiny-qwen2")))
    assert "--target_backend onnxruntime" in command and "--target_kernels" not in command
    args = cli.build_parser().parse_args(command.split()[2:])
    settings = OrtSettings(
        args.target_precision, args.ort_block_size, args.ort_accuracy_level, args.execution_provider
    )
    assert args.target_backend == "onnxruntime"
    assert settings.label == row.target_precision


def test_rows_of_two_backends_never_resume_each_other():
    assert _ort_row().key() != _ort_row(target_backend="torch", execution_provider=None).key()


def test_numbers_that_cannot_be_read_as_they_look_are_flagged() -> None:
    """Too few tokens to time, per-prompt speedups far apart, and the two overall speedups
    disagreeing each add a WARNING line; a clean run has none."""
    clean = summary_line(_run(speedups=(1.4, 1.5, 1.6)))
    assert "WARNING" not in clean
    spread = compare_table(_run(speedups=(0.2, 1.3, 1.2)))
    assert "WARNING: per-prompt speedups range 0.20x-1.30x" in spread
    assert "WARNING: the speedup of mean time/token" in spread
    short = summary_line([make_row(new_tokens=2), make_row(new_tokens=2, mode="assisted")])
    assert f"fewer than {MIN_TIMED_TOKENS} new tokens" in short


def test_a_published_section_shows_one_run_chosen_the_same_way_whatever_was_appended() -> None:
    """The run covering the most prompts, the newest of those: an older complete run and a newer
    partial one (an interrupted rerun) do not mix into it, in any order of the rows."""

    def run(run_id: str, timestamp: str, examples: tuple[int, ...], ms: float) -> list[Row]:
        return [
            make_row(example=e, run_id=run_id, timestamp=timestamp, time_per_token_ms=ms) for e in examples
        ]

    older = run("older", "2026-01-01T00:00:00", (1, 2, 3), 100.0)
    newer = run("newer", "2026-02-01T00:00:00", (1, 2, 3), 120.0)
    partial = run("partial", "2026-03-01T00:00:00", (1,), 999.0)
    for rows in (older + newer + partial, partial + newer + older, newer + partial + older):
        chosen = chosen_run(rows)
        assert {r.run_id for r in chosen} == {"newer"} and [r.example for r in chosen] == [1, 2, 3]
    # the newest wins only among the most complete
    assert {r.run_id for r in chosen_run(older + partial)} == {"older"}


@pytest.mark.parametrize(
    ("stem", "options"),
    [
        (
            "qwen2.5-coder-1.5b-fp32",
            "real[qwen2.5-coder-1.5b] --humaneval-limit 164 --humaneval-precision fp32 --humaneval-out",
        ),
        ("qwen2.5-coder-1.5b-gguf-q4k", "--humaneval-limit 164 --humaneval-precision gguf,q4k"),
        ("qwen2.5-coder-1.5b", "real[qwen2.5-coder-1.5b] --humaneval-limit 164 --humaneval-out"),
        (
            "qwen2.5-coder-1.5b-onnxruntime-CPUExecutionProvider",
            "real[qwen2.5-coder-1.5b-onnxruntime-CPUExecutionProvider] --humaneval-limit 164",
        ),
        ("qwen2.5-coder-1.5b-llama.cpp", "real_engine[qwen2.5-coder-1.5b-llama_cpp] --humaneval-limit 164"),
    ],
)
def test_a_humaneval_table_names_the_run_that_wrote_its_rows(stem, options):
    """The rows file's name says the precisions ``--humaneval-precision`` chose; the page's command
    carries them, so it reruns that configuration and writes a file of that name."""
    from harness.report.page import _humaneval_command

    command = _humaneval_command(stem, 164)
    assert options in command
    assert command.startswith("pytest perf/test_humaneval.py")
    if "-fp32" not in stem and "q4k" not in stem:
        assert "--humaneval-precision" not in command


def test_reproduce_command_of_a_served_row_is_one_the_cli_takes():
    from harness import cli
    from harness.pairs import models

    row = make_row(
        mode="assisted",
        engine="served",
        target_precision="served",
        target_backend="openai",
        target_kernels="stock",
        draft_precision="served",
        endpoint="http://127.0.0.1:8080",
        speculative_endpoint="http://127.0.0.1:8081",
    )
    command = setup.command(row, setup.defaults(models.get_pair(models.DEFAULT_PAIR)))
    assert "--engine served" in command and "--endpoint http://127.0.0.1:8080" in command
    assert "--target_precision" not in command and "--target_backend" not in command
    args = cli.build_parser().parse_args(command.split()[2:])
    from harness.decoding import engines

    run = engines.resolve(
        models.get_pair(models.DEFAULT_PAIR),
        engine=args.engine,
        endpoint=args.endpoint,
        speculative_endpoint=args.speculative_endpoint,
    )
    assert run.target.endpoint == row.endpoint and run.draft.endpoint == row.speculative_endpoint


def test_the_context_table_reads_decoding_and_end_to_end_apart() -> None:
    """A long prompt's prefill is most of a request: the table gives the decoding speedup, the
    requests' whole-time speedup and the lowest prompt's, from the same rows."""
    from harness.report import page

    def pair(example: int, assisted_ms: float, assisted_prefill: float) -> list[Row]:
        common = dict(example=example, prompt_tokens=2048, run_id="r", new_tokens=101)
        return [
            make_row(mode="plain", time_per_token_ms=40.0, prefill_ms=10_000.0, **common),
            make_row(mode="assisted", time_per_token_ms=assisted_ms, prefill_ms=assisted_prefill, **common),
        ]

    # Decoding: 40 ms against 20 and 40 (a mean of 30: 1.33x). End to end: plain 14 s each, assisted
    # 12 s and 15 s (28 / 27 s = 1.04x; the second prompt 14 / 15 = 0.93x, its prefill the slower).
    rows = pair(1, 20.0, 10_000.0) + pair(2, 40.0, 11_000.0)
    point = page._context_points(rows)["transformers"][2048]
    assert point.decode == pytest.approx(40 / 30)
    assert point.end_to_end == pytest.approx(28 / 27)
    assert point.lowest == pytest.approx(14 / 15)
    section = "\n".join(page.context_section("amd-epyc-2c", rows, "rows.jsonl"))
    assert "1.33x / 1.04x (lowest 0.93x)" in section
    assert "--context-tokens 2048 --compare --limit 2 --max_new_tokens 30" in section


def test_the_context_table_pairs_each_length_apart_in_runs_of_one_setting() -> None:
    """Two runs of the same settings (one id) at different lengths number their prompts from 1
    each: a 1024-token prompt's assisted row is read against its own plain row, not the 2048 one's."""
    from harness.report import page

    def pair(tokens: int, plain_prefill: float, assisted_prefill: float) -> list[Row]:
        common = dict(example=1, prompt_tokens=tokens, run_id="r", new_tokens=101, time_per_token_ms=40.0)
        return [
            make_row(mode="plain", prefill_ms=plain_prefill, **common),
            make_row(mode="assisted", prefill_ms=assisted_prefill, **common),
        ]

    # Each length's own pair: end to end 1.0x at both; crossed, 1024 would read (16 + 4) / (4 + 4) = 2.5x.
    rows = pair(1024, 4_000.0, 4_000.0) + pair(2048, 16_000.0, 16_000.0)
    points = page._context_points(rows)["transformers"]
    assert points[1024].end_to_end == pytest.approx(1.0)
    assert points[2048].end_to_end == pytest.approx(1.0)


def test_the_context_table_keeps_configurations_alike_but_for_k_apart() -> None:
    """Two configurations of one engine that differ only in K, in one rows file, are two columns
    named by their labels; neither overwrites the other's points."""
    from harness.report import page

    def pair(run: str, k: int, assisted_ms: float) -> list[Row]:
        common = dict(example=1, prompt_tokens=2048, run_id=run, new_tokens=101)
        return [
            make_row(mode="plain", time_per_token_ms=40.0, **common),
            make_row(
                mode="assisted",
                time_per_token_ms=assisted_ms,
                num_assistant_tokens=k,
                context_draft=16,
                **common,
            ),
        ]

    rows = pair("k1", 1, 20.0) + pair("k3", 3, 32.0)
    points = page._context_points(rows)
    assert len(points) == 2
    by_k = {name.split("-K")[1][0]: by_length[2048].decode for name, by_length in points.items()}
    assert by_k == {"1": pytest.approx(2.0), "3": pytest.approx(1.25)}
    section = "\n".join(page.context_section("amd-epyc-2c", rows, "rows.jsonl"))
    assert "2.00x" in section and "1.25x" in section
