"""harness.experiments.sweep and ``--task sweep``: spec parsing, one load per target, rows per run,
resume, and the table, plot and command line, on the tiny qwen2 pair with a few HumanEval prompts and
8 new tokens.

Timings are printed, never asserted: only the arithmetic that ties the columns together is checked.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import pytest

from harness import cli
from harness.base import platforms
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.experiments import humaneval, sweep
from harness.pairs import models
from harness.report import sweep as sweep_report
from harness.settings import configs as sweep_spec
from harness.settings import setup
from harness.settings.results import read_records, read_rows

PAIR = "tiny-qwen2"
NEW_TOKENS = 8
# Two targets: fp32 with three configurations (two draft precisions and prompt lookup), w8af32 with one.
SPEC = (
    "t=fp32,d=fp32,k=3;t=fp32,d=w8af32,k=2;t=w8af32,d=w8af32,k=2,sched=dynamic;t=fp32,mode=prompt_lookup,k=4"
)


class CountingLoader:
    """``sweep.load_target_group`` that records each call and checks the previous target was freed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...], str]] = []
        self._previous: list[weakref.ref] = []

    def __call__(self, pair_name, *, target_precision, draft_precisions, target_kernels, **devices):
        gc.collect()
        assert all(ref() is None for ref in self._previous), "the previous target is still in memory"
        self.calls.append((target_precision, tuple(draft_precisions), target_kernels))
        pairs = sweep.load_target_group(
            pair_name,
            target_precision=target_precision,
            draft_precisions=draft_precisions,
            target_kernels=target_kernels,
            **devices,
        )
        self._previous = [weakref.ref(p.target) for p in pairs.values()]
        return pairs


@pytest.fixture(scope="module")
def prompts():
    return humaneval.prompts(2, NEW_TOKENS)


@pytest.fixture(scope="module")
def swept(prompts, tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "rows.jsonl"
    loader = CountingLoader()
    configs = sweep_spec.parse_configs(SPEC)
    result = sweep.run_sweep(
        PAIR, configs, prompts, NEW_TOKENS, path, loader=loader, progress=False, platform="test-box-2c"
    )
    return result, loader, path


# --------------------------------------------------------------------------- parsing


def test_parse_the_issue_example():
    configs = sweep_spec.parse_configs(
        "t=fp32,d=fp32,k=5;t=w8af32,d=w8af32,k=3,sched=dynamic;t=fp32,mode=prompt_lookup,k=10"
    )
    assert configs == [
        sweep_spec.SweepConfig.of("fp32", "fp32", "assisted", 5, "constant", "stock"),
        sweep_spec.SweepConfig.of("w8af32", "w8af32", "assisted", 3, "dynamic", "stock"),
        sweep_spec.SweepConfig.of("fp32", None, "prompt_lookup", 10, "constant", "stock"),
    ]
    assert [c.label for c in configs] == [
        "t_fp32-d_fp32-K5-constant-stock",
        "t_w8af32-d_w8af32-K3-dynamic-stock",
        "t_fp32-prompt_lookup-K10",
    ]


def test_parse_defaults_long_names_spaces_and_a_trailing_semicolon():
    (a, b, c) = sweep_spec.parse_configs(
        " t = w8af32 ; target=fp32, draft=w8af32, schedule=heuristic ; mode=prompt_lookup ;"
    )
    assert a == sweep_spec.SweepConfig.of("w8af32", "fp32", "assisted", 5, "constant", "stock")
    assert b == sweep_spec.SweepConfig.of("fp32", "w8af32", "assisted", 5, "heuristic", "stock")
    assert c.label == "t_fp32-prompt_lookup-K10"  # prompt lookup's own default K
    inv = sweep_spec.parse_configs(
        "t=w8af32,mode=prompt_lookup,kernels=invariant;t=fp32,d=w8af32,target_kernels=invariant"
    )
    assert [x.label for x in inv] == [
        "t_w8af32-prompt_lookup-K10-invariant",
        "t_fp32-d_w8af32-K5-constant-invariant",
    ]


def test_default_spec_is_the_documented_list():
    assert [c.label for c in sweep_spec.parse_configs(sweep_spec.DEFAULT_SPEC)] == [
        "t_fp32-d_fp32-K5-constant-stock",
        "t_fp32-d_w8af32-K3-constant-stock",
        "t_w8af32-d_w8af32-K3-constant-stock",
        "t_fp32-prompt_lookup-K10",
        "t_w8af32-prompt_lookup-K10",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", "--sweep is empty"),
        (" ; ", "--sweep is empty"),
        ("t=fp32;;t=bf16", "configuration 2 is empty"),
        ("t=fp8", "Unknown precision 'fp8'"),
        ("t=fp32,d=int3", "Unknown precision 'int3'"),
        ("k=0", "k must be at least 1"),
        ("k=two", "k='two' is not an integer"),
        ("x=1", "unknown key 'x'"),
        ("t", "'t' is not key=value"),
        ("t=", "'t=' is not key=value"),
        ("t=fp32,,k=3", "empty item"),
        ("t=fp32,t=bf16", "'t' is given twice"),
        ("mode=beam", "mode 'beam' is not one of assisted, prompt_lookup"),
        ("sched=fast", "sched 'fast' is not one of"),
        ("mode=prompt_lookup,d=fp32", "prompt_lookup uses no draft model"),
        ("mode=prompt_lookup,sched=dynamic", "sched applies to draft-model assistance only"),
        ("kernels=magic", "kernels 'magic' is not one of stock, invariant, onnxruntime, and unknown engine"),
        ("kernels=onnxruntime,t=w8af32", "kernels=onnxruntime takes t=int4 or t=fp32, not t=w8af32"),
        ("t=fp32,k=3;t=fp32,d=fp32,k=3", "configuration 2 repeats configuration 1"),
        ("engine=onnxruntime-genai,d=w8af32", "engine=onnxruntime-genai drafts with its own draft model"),
        ("kernels=onnxruntime-genai,k=3,dv=100", "remove d, dv and dk"),
        ("engine=onnxruntime-genai,t=bf16", "'bf16' is not offered with --target_backend onnxruntime"),
        ("engine=llama.cpp,d=fp32", "engine=llama.cpp drafts with its own draft model; remove d, dv and dk"),
        ("engine=llama.cpp,t=fp32", "engine=llama.cpp: --engine llama.cpp runs GGUF files as they are"),
        ("engine=openvino,d=q4k", "engine=openvino drafts with its own draft model; remove d, dv and dk"),
        ("kernels=openvino,t=int4", "its target precision is gguf, not int4"),
        ("engine=llama.cpp,kernels=invariant", "engine=llama.cpp runs its own kernels; remove kernels"),
        ("engine=transformers", "engine=transformers is the sweep's own loop"),
        ("kernels=llama", "unknown engine 'llama': choose one of transformers, llama.cpp"),
    ],
)
def test_parse_rejects_bad_specs_with_a_clear_message(spec, expected):
    with pytest.raises(HarnessError) as info:
        sweep_spec.parse_configs(spec, engines.sweep_target(models.DEFAULT_PAIR))
    assert expected in str(info.value)


# --------------------------------------------------------------------------- measuring


def test_each_target_is_loaded_once_with_every_draft_it_needs(swept):
    _, loader, _ = swept
    # fp32: plain + three configurations (drafts fp32 and w8af32, prompt lookup); w8af32: one.
    assert loader.calls == [
        ("fp32", (("fp32", None), ("w8af32", None)), "stock"),
        ("w8af32", (("w8af32", None),), "stock"),
    ]


def test_a_row_per_run_with_the_config_and_prompt_named(swept, prompts):
    result, _, path = swept
    rows = read_rows(path)
    arms = {"fp32": 4, "w8af32": 2}  # plain + configurations per target
    assert len(rows) == len(prompts) * sum(arms.values())
    for row in rows:
        s = row.extra["sweep"]
        assert row.task == "sweep" and row.new_tokens == NEW_TOKENS
        assert s["prompt"] == row.prompt_label == prompts[row.example - 1].label
        assert s["config"] in {c.config.label for c in result.results} | {"t_fp32-plain", "t_w8af32-plain"}
        assert {"accepted_steps", "target_decode_ms", "draft_decode_forwards"} <= set(s)
    # Plain and assisted rows of one target share a run id (so report tables pair them); targets do not.
    ids = {
        row.target_precision: {r.run_id for r in rows if r.target_precision == row.target_precision}
        for row in rows
    }
    assert all(len(v) == 1 for v in ids.values()) and ids["fp32"] != ids["w8af32"]


def test_arm_order_rotates_from_prompt_to_prompt(swept):
    _, _, path = swept
    fp32 = [r for r in read_rows(path) if r.target_precision == "fp32"]
    order = {e: [r.extra["sweep"]["config"] for r in fp32 if r.example == e] for e in (1, 2)}
    assert order[1][0] == "t_fp32-plain"
    assert order[2] == order[1][1:] + order[1][:1]
    assert [r.extra["sweep"]["position"] for r in fp32 if r.example == 2] == [0, 1, 2, 3]


def test_summary_columns_are_consistent(swept):
    result, _, _ = swept
    assert [r.config.label for r in result.results] == [c.label for c in sweep_spec.parse_configs(SPEC)]
    best_label, best = result.best_plain
    assert best == max(r.plain_tokens_per_s for r in result.results)
    assert best_label in ("t_fp32-plain", "t_w8af32-plain")
    for r in result.results:
        assert r.prompts == 2
        assert r.speedup.value == pytest.approx(r.assisted_tokens_per_s / r.plain_tokens_per_s)
        assert r.vs_best_plain == pytest.approx(r.assisted_tokens_per_s / best)
        assert r.acceptance_rate is not None and 0.0 <= r.acceptance_rate <= 1.0
        assert 0.0 < r.non_forward_share < 1.0
        assert r.predicted_speedup is not None and r.predicted_speedup > 0
    lookup = result.result("t_fp32-prompt_lookup-K4")
    assert lookup.c == 0.0 and lookup.config.num_assistant_tokens == 4
    assert math.isfinite(result.result("t_fp32-d_fp32-K3-constant-stock").c)


def test_fp32_target_outputs_are_identical_to_plain_greedy(swept):
    result, _, _ = swept
    for label in (
        "t_fp32-d_fp32-K3-constant-stock",
        "t_fp32-d_w8af32-K2-constant-stock",
        "t_fp32-prompt_lookup-K4",
    ):
        assert result.result(label).identical, label


def test_resume_skips_finished_runs_and_finished_targets(prompts, tmp_path):
    path = tmp_path / "rows.jsonl"
    configs = sweep_spec.parse_configs(SPEC)
    first = CountingLoader()
    # A run stopped after its first configuration: plain and config 1 on both prompts.
    sweep.run_sweep(
        PAIR, configs[:1], prompts, NEW_TOKENS, path, loader=first, progress=False, platform="box"
    )
    assert len(read_rows(path)) == 4 and len(first.calls) == 1
    kept = path.read_text()

    full = CountingLoader()
    result = sweep.run_sweep(
        PAIR, configs, prompts, NEW_TOKENS, path, loader=full, progress=False, platform="box"
    )
    assert path.read_text().startswith(kept)  # nothing finished was rewritten
    rows = read_rows(path)
    assert len(rows) == 12  # the 4 finished ones + 2 more fp32 configurations + w8af32 plain and config, x2
    keys = [(r.run_id, r.extra["sweep"]["config"], r.example) for r in rows]
    assert len(keys) == len(set(keys)), "a finished run was measured again"
    # fp32 still had runs to do, so it loaded once, needing only the drafts of its unfinished configs.
    assert full.calls == [("fp32", (("w8af32", None),), "stock"), ("w8af32", (("w8af32", None),), "stock")]

    def never(*args, **kwargs):
        raise AssertionError("a finished sweep loaded a model")

    again = sweep.run_sweep(
        PAIR, configs, prompts, NEW_TOKENS, path, loader=never, progress=False, platform="box"
    )
    assert len(read_rows(path)) == 12
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in result.results]


def test_bad_run_input_is_rejected_before_loading(prompts, tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("loaded before rejecting")

    configs = sweep_spec.parse_configs("t=fp32")
    cases = [
        (dict(configs=[]), "at least one configuration"),
        (dict(prompts=[]), "at least one prompt"),
        (dict(new_tokens=1), "new_tokens must be an integer of at least 2"),
        (dict(configs=configs * 2), "repeat a label"),
    ]
    for change, message in cases:
        kw = dict(configs=configs, prompts=prompts, new_tokens=NEW_TOKENS) | change
        with pytest.raises(HarnessError, match=message):
            sweep.run_sweep(PAIR, rows_path=tmp_path / "r.jsonl", loader=never, progress=False, **kw)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"x": 1}\nnot json\n{"x": 2}\n')
    with pytest.raises(HarnessError, match="cannot resume from"):
        sweep.run_sweep(PAIR, configs, prompts, NEW_TOKENS, damaged, loader=never, progress=False)


def test_onnxruntime_target_in_a_sweep():
    """kernels=onnxruntime puts the exported target (int4 unless t says fp32) beside torch ones."""
    [config] = sweep_spec.parse_configs("kernels=onnxruntime,d=fp32,k=3")
    assert (config.target_precision, config.target_kernels) == ("int4", "onnxruntime")
    assert config.label == "t_int4-d_fp32-K3-constant-onnxruntime"
    pairs = sweep.load_target_group(
        "tiny-qwen2", target_precision="int4", draft_precisions=("fp32",), target_kernels="onnxruntime"
    )
    pair = pairs[("fp32", None)]
    assert (pair.target_setup.backend, pair.target_setup.precision) == ("onnxruntime", "ort-int4-b32-aint8")


@pytest.mark.parametrize("kernels", ["onnxruntime-genai", "llama.cpp", "openvino"])
def test_an_engines_configuration_is_the_run_its_engine_loads(kernels):
    """An engine's draft is its own, at the target's settings, on the draft device given: the run a
    configuration is (the sweep's resume key is built from it before loading) is the run loaded."""
    [config] = sweep_spec.parse_configs(f"engine={kernels},k=3", engines.sweep_target(models.DEFAULT_PAIR))
    run = config.run("qwen2.5-coder-1.5b", 8, "cpu", "npu")
    assert run.draft == setup.Draft(run.target.precision, device="npu")
    assert config.draft_precision == config.target_precision  # its label keeps the sweep's spelling
    [torch_config] = sweep_spec.parse_configs("t=fp32,d=w8af32,k=3")
    assert torch_config.run("qwen2.5-coder-1.5b", 8, "cpu", "cpu").draft.precision == "w8af32"


def test_group_pairs_share_one_target():
    pairs = sweep.load_target_group(PAIR, target_precision="fp32", draft_precisions=("fp32", "w8af32"))
    fp32, w8 = ("fp32", None), ("w8af32", None)
    assert set(pairs) == {fp32, w8}
    assert pairs[fp32].target is pairs[w8].target
    assert (pairs[fp32].draft_setup.precision, pairs[w8].draft_setup.precision) == ("fp32", "w8af32")
    assert pairs[fp32].draft is not pairs[w8].draft
    assert sweep.load_target_group(PAIR, target_precision="fp32", draft_precisions=())[None].draft is None


# --------------------------------------------------------------------------- presentation


def test_table_names_the_machine_the_workload_and_every_config(swept):
    result, _, _ = swept
    text = sweep_report.sweep_table(result)
    for label in (r.config.label for r in result.results):
        assert label in text
    for header in sweep_report.TABLE_HEADERS:
        assert header in text
    for fact in (
        "machine: `test-box-2c`",
        "threads: 1",
        "torch ",
        "transformers ",
        "2 prompts",
        "8 new tokens",
    ):
        assert fact in text, fact
    # GitHub markdown: a header row, a separator row, one row per configuration.
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[1].startswith("|--") and len(table) == 2 + len(result.results)


def test_the_terminal_table_fits_120_columns_and_names_every_config(swept):
    result, _, _ = swept
    text = sweep_report.sweep_table(result, wide=False)
    lines = [line for line in text.splitlines() if not line.startswith("command: ")]
    assert max(len(line) for line in lines) <= 120, text
    for n, r in enumerate(result.results, 1):
        assert f"{n}: {r.config.label}" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(result.results)


def test_plot_and_markdown_are_written_side_by_side(swept, tmp_path):
    result, _, _ = swept
    md, png = sweep_report.write_sweep(result, tmp_path)
    assert md.parent == png.parent == tmp_path / "test-box-2c"
    assert md.name.startswith("sweep-tiny-qwen2-") and png.name == md.name.replace(".md", ".png")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"](./{png.name})" in md.read_text()
    # The same sweep again rewrites its own page; another sweep of the pair writes its own beside it.
    assert sweep_report.write_sweep(result, tmp_path) == (md, png)
    fewer = dataclasses.replace(result, results=result.results[:1])
    other_md, other_png = sweep_report.write_sweep(fewer, tmp_path)
    assert other_md != md and md.is_file() and f"](./{other_png.name})" in other_md.read_text()


# --------------------------------------------------------------------------- command line


def _cli(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_engine_as_a_sweep_target(tmp_path, capsys):
    """onnxruntime-genai's own loop beside transformers' on the same prompts: its draft model and its
    n-gram decoding measured against its own plain runs, every output equal to them."""
    (engine,) = sweep_spec.parse_configs("engine=onnxruntime-genai,k=3", engines.sweep_target("tiny-qwen2"))
    assert engine.target.engine == "onnxruntime-genai" and engine.draft_precision == "int4"
    assert engine.label == "t_int4-d_int4-K3-constant-onnxruntime-genai"
    spec = "engine=onnxruntime-genai,k=3;kernels=onnxruntime-genai,mode=prompt_lookup,k=4"
    argv = ["--model_name", "tiny-qwen2", "--task", "sweep", "--limit", "2", "--max_new_tokens", "32",
            "--results_dir", str(tmp_path), "--no_progress", "--sweep", spec]  # fmt: skip
    assert cli.main(argv) == 0
    path = tmp_path / "rows" / "sweep" / f"tiny-qwen2-{platforms.detect().name}.jsonl"
    rows = read_rows(path)
    assert {r.engine for r in rows} == {"onnxruntime-genai"}
    by_arm = {}
    for r in rows:
        by_arm.setdefault(r.extra["sweep"]["config"], {})[r.example] = r.output_ids
    plain = by_arm.pop("t_int4-plain-onnxruntime-genai")
    assert sorted(by_arm) == [
        "t_int4-d_int4-K3-constant-onnxruntime-genai",
        "t_int4-prompt_lookup-K4-onnxruntime-genai",
    ]
    assert all(outputs == plain for outputs in by_arm.values())
    assert "2: t_int4-prompt_lookup-K4-onnxruntime-genai" in capsys.readouterr().out
    # The engine's rows carry its own draft's setup; the rerun finds each by the key of the run the
    # configuration is, before loading anything.
    assert cli.main(argv) == 0
    assert f"resumed 6 of 6 runs from {path}" in capsys.readouterr().err
    assert len(read_rows(path)) == len(rows)


def test_cli_task_sweep_end_to_end_and_rerun_resumes(tmp_path, capsys, monkeypatch):
    argv = [
        "--model_name", PAIR, "--task", "sweep", "--sweep", "t=fp32,d=fp32,k=3;t=fp32,mode=prompt_lookup,k=4",
        "--limit", "2", "--max_new_tokens", str(NEW_TOKENS), "--results_dir", str(tmp_path),
        "--platform", "test-box-2c", "--no_progress",
    ]  # fmt: skip
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    assert "t_fp32-d_fp32-K3-constant-stock" in out and "t_fp32-prompt_lookup-K4" in out
    assert "--task sweep --sweep" in out  # the command that reproduces the table
    folder = tmp_path / "test-box-2c"
    (md,) = folder.glob("sweep-tiny-qwen2-*.md")
    assert md.with_suffix(".png").is_file()
    rows = tmp_path / "rows" / "sweep" / "tiny-qwen2-test-box-2c.jsonl"
    assert len(read_rows(rows)) == 2 * 3

    def no_load(*args, **kwargs):
        raise AssertionError("the rerun loaded a model although every run was finished")

    monkeypatch.setattr(models, "load_pair", no_load)
    # The command the sweep printed, run as printed, resumes every row.
    import re
    import shlex

    printed = re.search(r"command: (python assisted_generation\.py .*)", out).group(1)
    code, out2, err = _cli(capsys, *shlex.split(printed)[2:], "--no_progress")
    assert code == 0, err
    assert len(read_rows(rows)) == 2 * 3
    assert "t_fp32-prompt_lookup-K4" in out2
    assert f"resumed 6 of 6 runs from {rows}" in err


def test_cli_sweep_never_resumes_another_hosts_or_codes_rows(tmp_path, capsys, monkeypatch):
    """Rows a different host (or different harness code) measured are not this run's: they are
    measured again, the rerun says it resumed nothing, and nothing lands in the committed results/
    (the default output is the runs folder)."""
    monkeypatch.setenv("ASSISTED_GENERATION_RUNS", str(tmp_path / "runs"))
    argv = [
        "--model_name", PAIR, "--task", "sweep", "--sweep", "t=fp32,d=fp32,k=3", "--limit", "1",
        "--max_new_tokens", str(NEW_TOKENS), "--platform", "test-box-2c", "--no_progress",
    ]  # fmt: skip
    code, _, err = _cli(capsys, *argv)
    assert code == 0, err
    assert "resumed 0 of 2 runs" in err
    rows = tmp_path / "runs" / "rows" / "sweep" / "tiny-qwen2-test-box-2c.jsonl"
    assert len(read_rows(rows)) == 2
    for what in ("host_id", "code_version"):
        monkeypatch.setattr(platforms, what, lambda what=what: "elsewhere-" + what)
        code, _, err = _cli(capsys, *argv)
        assert code == 0, err
        assert "resumed 0 of 2 runs" in err
    assert len(read_rows(rows)) == 6


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--task", "sweep", "--sweep", "t=fp8"], "Unknown precision 'fp8'"),
        (["--task", "sweep", "--sweep", "k=0"], "k must be at least 1"),
        (["--sweep", "t=fp32"], "--sweep is used with --task sweep"),
        (["--task", "sweep", "--compare"], "--compare does not apply to --task sweep"),
        (["--task", "sweep", "--target_precision", "bf16"], "--target_precision does not apply"),
        (["--task", "sweep", "--do_sample"], "decodes greedily"),
        (["--task", "sweep", "--max_new_tokens", "1"], "at least 2"),
        (["--task", "sweep", "--limit", "0"], "--limit must be at least 1"),
        (["--task", "sweep", "--weights_dir", "no/such/folder"], "is not a folder"),
    ],
)
def test_cli_sweep_bad_input_is_one_line_exit_2(capsys, monkeypatch, argv, expected):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was rejected")

    monkeypatch.setattr(models, "load_pair", no_load)
    code, out, err = _cli(capsys, "--model_name", PAIR, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("assisted_generation.py: error: "), err
    assert expected in lines[0]
    assert out == ""


def test_cli_sweep_llama_reference_is_absent_or_explained(tmp_path, capsys, monkeypatch):
    """Without a llama-bench the reference is a one-line note, never a failure; with one, a pair
    without a GGUF file says so; a wrong binary is refused before anything loads."""
    monkeypatch.delenv("ASSISTED_GENERATION_LLAMA_BENCH", raising=False)
    argv = [
        "--model_name", PAIR, "--task", "sweep", "--sweep", "t=fp32,d=fp32,k=3", "--limit", "1",
        "--max_new_tokens", str(NEW_TOKENS), "--platform", "test-box-2c", "--no_progress",
        "--results_dir", str(tmp_path),
    ]  # fmt: skip
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    assert "llama.cpp reference: not measured (no llama-bench given" in out
    fake = tmp_path / "llama-bench"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1" >&2; exit 0; fi\nexit 1\n')
    fake.chmod(0o755)
    code, out, err = _cli(capsys, *argv, "--llama-bench", str(fake))
    assert code == 0, err
    assert f"not measured ({PAIR} has no GGUF file here)" in out
    (md,) = (tmp_path / "test-box-2c").glob("sweep-tiny-qwen2-*.md")
    md = md.read_text()
    assert "has no GGUF file here" in md
    code, _, err = _cli(capsys, *argv, "--llama-bench", str(tmp_path / "missing"))
    assert code == 2 and "not an executable file" in err


def test_cli_sweep_keeps_the_llama_reference_for_the_results_page(tmp_path, capsys, monkeypatch):
    """llama.cpp measured around a sweep is stored beside its rows with the sweep's time window; the
    results page shows it, with the sweep's fastest plain and exact assisted decoding as multiples
    of it, under the table whose rows lie in that window, and nowhere else."""
    import json

    from harness.report import page

    decode = {"n_prompt": 0, "n_gen": NEW_TOKENS, "avg_ts": 20.0, "stddev_ts": 0.1, "n_threads": 1}
    fake = tmp_path / "llama-bench"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 7 (abc)" >&2; exit 0; fi\n'
        f"echo '{json.dumps([{**decode, 'build_commit': 'abc', 'build_number': 7}])}'\n"
    )
    fake.chmod(0o755)
    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "gguf_file", lambda *args: gguf)
    argv = [
        "--model_name", PAIR, "--task", "sweep", "--sweep", "t=fp32,d=fp32,k=3", "--limit", "2",
        "--max_new_tokens", str(NEW_TOKENS), "--platform", "test-box-2c", "--no_progress",
        "--results_dir", str(tmp_path), "--llama-bench", str(fake),
    ]  # fmt: skip
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    rows_path = tmp_path / "rows" / "sweep" / "tiny-qwen2-test-box-2c.jsonl"
    (ref,) = read_records(sweep.reference_path(rows_path))
    assert (ref["before"], ref["after"], ref["tokens_per_s"], ref["gguf"]) == (
        20.0,
        20.0,
        20.0,
        "target.gguf",
    )
    rows = read_rows(rows_path)
    assert all(ref["started"] <= r.timestamp <= ref["finished"] for r in rows)
    plain = [r.tokens_per_s for r in rows if r.mode == "plain"]
    text = page.results_page(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("llama.cpp's plain decoding"))
    assert "(target.gguf, build abc (7), 1 threads" in line and "20.00 and 20.00 tok/s, mean 20.00" in line
    assert f"Fastest plain decoding here: {sum(plain) / len(plain) / 20.0:.2f}x of it" in line
    assert sweep.covering_reference([ref], rows) == ref
    # Measured around another sweep (before these rows, or after them): not theirs.
    before = {**ref, "started": "2000-01-01T00:00:00+00:00", "finished": "2000-01-01T00:01:00+00:00"}
    after = {**ref, "started": "2999-01-01T00:00:00+00:00", "finished": "2999-01-01T00:01:00+00:00"}
    assert sweep.covering_reference([before, after], rows) is None
    assert sweep.covering_reference([before, ref, after], rows) == ref


def test_a_speedup_far_from_its_prediction_is_flagged(swept):
    result, _, _ = swept
    first = result.results[0]
    agreeing = dataclasses.replace(first, predicted_speedup_verify=first.speedup.value)
    far = dataclasses.replace(first, predicted_speedup_verify=first.speedup.value / 3)
    assert sweep_report.warnings(dataclasses.replace(result, results=(agreeing,))) == []
    flagged = sweep_report.warnings(dataclasses.replace(result, results=(far,)))
    assert len(flagged) == 2 and flagged[1].startswith(f"WARNING: {first.config.label} measured")
    assert "WARNING" in sweep_report.sweep_table(dataclasses.replace(result, results=(far,)))


def test_sweep_keys_are_the_settings_own_spellings() -> None:
    """``--sweep`` takes each setting's short key and its column name (both from ``setup.FIELDS``)."""
    from harness.settings import configs, setup

    short = configs.parse_configs("t=fp32,d=w8af32,k=3,sched=heuristic,dv=64,dk=invariant")
    long = configs.parse_configs(
        "target_precision=fp32,draft_precision=w8af32,num_assistant_tokens=3,"
        "assistant_schedule=heuristic,draft_vocab=64,draft_kernels=invariant"
    )
    assert short == long
    spelled = {key for f in setup.FIELDS for key in f.sweep}
    assert {"t", "d", "k", "sched", "kernels", "dv", "dk", "mode"} <= spelled
    with pytest.raises(HarnessError, match="known keys: t, kernels, engine, mode, d, dk, dv, k, sched"):
        configs.parse_configs("q=1")


@pytest.mark.parametrize(("kernels", "backend"), [("llama.cpp", "llama.cpp"), ("openvino", "openvino")])
def test_an_engine_of_gguf_files_is_a_sweep_target_with_its_own_draft(kernels, backend) -> None:
    """``engine=llama.cpp`` and ``engine=openvino`` (or ``kernels=``) run the pair's GGUF files in
    that engine's own loop: the target and its draft (or prompt lookup) as the engine runs them,
    spelled back the same."""
    from harness.settings import configs

    assisted, lookup = configs.parse_configs(
        f"engine={kernels},k=3;kernels={kernels},mode=prompt_lookup,k=5",
        engines.sweep_target(models.DEFAULT_PAIR),
    )
    run = assisted.run(models.DEFAULT_PAIR, 16)
    assert (run.target.precision, run.target.backend, run.target.engine) == ("gguf", backend, kernels)
    assert run.draft is not None and run.draft.precision == "gguf" and run.decoding.num_assistant_tokens == 3
    assert lookup.run(models.DEFAULT_PAIR, 16).draft is None and lookup.target_kernels == kernels
    assert assisted.target_kernels == kernels and assisted.target_precision == "gguf"


def test_a_synthetic_acceptance_configuration_beside_the_exact_one(tmp_path, capsys):
    """``synth=P``: the same chain with a synthetic verdict, its rows marked with the setting and its
    label, its acceptance near P at the first position and its output not held to plain's."""
    (config,) = sweep_spec.parse_configs("t=w8af32,d=w8af32,kernels=invariant,dk=invariant,k=3,synth=0.5")
    assert config.label.endswith("-synth0.5") and config.decoding(8).synthetic_acceptance == 0.5
    chain = "t=w8af32,d=w8af32,kernels=invariant,dk=invariant,k=3"
    spec = f"{chain};{chain},synth=0.5"
    argv = ["--model_name", "tiny-qwen2", "--task", "sweep", "--limit", "2", "--max_new_tokens", "48",
            "--results_dir", str(tmp_path), "--no_progress", "--sweep", spec]  # fmt: skip
    assert cli.main(argv) == 0
    path = tmp_path / "rows" / "sweep" / f"tiny-qwen2-{platforms.detect().name}.jsonl"
    synthetic = [r for r in read_rows(path) if r.synthetic_acceptance is not None]
    assert synthetic and {r.synthetic_acceptance for r in synthetic} == {0.5}
    first = [sum(c) for c in zip(*(r.accepted_by_position[0] for r in synthetic), strict=True)]
    assert 0.25 <= first[1] / first[0] <= 0.75, first
    assert "synth0.5" in capsys.readouterr().out
