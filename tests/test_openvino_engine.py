"""The OpenVINO GenAI engine: its settings, devices and books, the IR its reader makes of the
pair's GGUF files, and its pipelines on the offline pair (the real library, the real files). Its
equivalence tier, speed gate and HumanEval run in ``perf/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bare_gguf_files

from harness import cli
from harness.base.errors import HarnessError
from harness.decoding import engines, openvino
from harness.pairs import models
from harness.settings import setup
from harness.settings.results import read_rows
from harness.settings.setup import GenerationSettings
from harness.theory import analysis
from harness.weights import openvino_ir

ROOT = Path(__file__).resolve().parent.parent
SPEC = models.get_pair(models.DEFAULT_PAIR)


def _run(**given) -> setup.RunSetup:
    return engines.resolve(SPEC, **{"engine": "openvino", **given})


# --------------------------------------------------------------------------- settings, devices


def test_resolve_gives_the_pair_gguf_files_on_the_devices_asked():
    run = _run(num_assistant_tokens=3, draft_device="cpu")
    assert run.target == setup.Target("gguf", "stock", "openvino", None, "cpu", "openvino")
    assert run.draft == setup.Draft("gguf", device="cpu")
    assert run.decoding.assistant_schedule == "constant"
    assert _run(target_device="npu").target.device == "npu"  # passed through to OpenVINO


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (dict(target_kernels="invariant"), "--target_kernels applies to --engine transformers"),
        (dict(draft_precision="fp32"), "--draft_precision applies to --engine transformers"),
        (dict(target_precision="int4"), "converted to OpenVINO IR"),
        (dict(target_backend="torch"), "runs a openvino target"),
    ],
)
def test_resolve_refuses_what_openvino_does_not_run(given, expected):
    with pytest.raises(HarnessError, match=expected):
        _run(**given)


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (dict(target_device="npu"), "OpenVINO finds no NPU here"),
        (dict(draft_device="gpu"), "OpenVINO finds no GPU here"),
        (dict(target_device="tpu"), "runs on cpu, npu, gpu, not 'tpu'"),
    ],
)
def test_a_device_openvino_does_not_have_is_refused_before_anything_loads(run, expected):
    with pytest.raises(HarnessError, match=expected) as info:
        engines.check(SPEC, _run(**run))
    if "finds no" in expected:
        assert "devices: CPU" in str(info.value)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (GenerationSettings(mode="assisted", num_assistant_tokens=17), "1 to 16"),
        (
            GenerationSettings(mode="prompt_lookup", prompt_lookup_num_tokens=5),
            "reports no drafted or accepted",
        ),
    ],
)
def test_settings_the_pipelines_cannot_show_are_refused(settings, expected):
    with pytest.raises(HarnessError, match=expected):
        openvino.check_settings(settings)


def test_a_pair_without_gguf_files_is_refused_before_anything_starts():
    spec = models.get_pair("tiny-qwen2")
    run = engines.resolve(spec, engine="openvino")
    with pytest.raises(HarnessError, match="openvino runs the pair.s GGUF files, and tiny-qwen2.s target"):
        engines.check(spec, run)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--target_device", "npu"], "OpenVINO finds no NPU here"),
        (["--assistant_schedule", "heuristic"], "drafts a constant"),
        (["--draft_precision", "fp32"], "--draft_precision applies to --engine transformers"),
    ],
)
def test_cli_refuses_what_openvino_cannot_run_in_one_line(capsys, flags, expected):
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "openvino", "--assisted_generation"]
    assert cli.main([*argv, *flags, "--limit", "1", "--no_progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_flip_is_judged_among_the_pipelines_own_top_tokens():
    tokens, scores = [[5], [9], [2]], [-0.1, -0.4, -3.0]
    assert openvino.beam_gap(tokens, scores, 5, 9) == pytest.approx(0.3)
    # A token outside the listed top ones is at most as likely as the last of them.
    assert openvino.beam_gap(tokens, scores, 5, 77) == pytest.approx(2.9)


@pytest.mark.parametrize(
    ("rounds", "budget_reached", "expected"),
    [
        ([1, 2, 4, 4], False, 2),  # two rounds ended short of K+1 = 4 tokens
        ([4, 4, 2], True, 0),  # the last one the budget may have cut: not judged
        ([4, 4, 2], False, 1),
        ([1, 4, 4], True, 1),
        ([], True, 0),
    ],
)
def test_a_round_that_emitted_fewer_than_k_plus_one_tokens_ended_on_a_rejection(
    rounds, budget_reached, expected
):
    assert openvino.rejected_rounds(rounds, 3, budget_reached) == expected


# --------------------------------------------------------------------------- the IR cache


def test_an_ir_folder_whose_files_changed_is_not_used(tmp_path):
    folder = tmp_path / "ir"
    folder.mkdir()
    for name in openvino_ir.MODEL_FILES:
        (folder / name).write_bytes(b"graph " + name.encode())
    from harness.base import files

    marker = {"files": files.record(folder, list(openvino_ir.MODEL_FILES))}
    assert not openvino_ir.is_built(folder)  # no marker: an interrupted conversion
    (folder / openvino_ir.MARKER).write_text(json.dumps(marker))
    assert openvino_ir.is_built(folder)
    (folder / "openvino_model.bin").write_bytes(b"cut")
    assert not openvino_ir.is_built(folder)
    (folder / "openvino_model.bin").write_bytes(b"graph openvino_model.bin"[::-1])  # same size, new content
    assert not openvino_ir.is_built(folder)


# --------------------------------------------------------------------------- the real pair


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs.get(models.DEFAULT_PAIR, engine="openvino")


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.openvino
def test_the_pairs_ir_records_what_was_requantized(pair):
    ggufs = openvino.OpenVinoEngine.gguf_files(SPEC, _run(), None)
    marks = {
        role: json.loads(
            (openvino_ir.ir_folder(getattr(SPEC, role).name, path) / openvino_ir.MARKER).read_text()
        )
        for role, path in ggufs.items()
    }
    assert marks["target"]["requantized"] == {}  # Q4_K and Q6_K read as they are
    assert "Q5_0" in marks["draft"]["requantized"]  # the draft's 5-bit blocks, as Q8_0
    assert all(set(m["files"]) >= set(openvino_ir.MODEL_FILES) for m in marks.values())


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.openvino
def test_speculative_and_plain_books_on_the_real_pair(pair):
    ids = pair.tokenizer("def add(a, b):\n    return", return_tensors=None)["input_ids"]
    plain = pair.engine.decode(pair, ids, GenerationSettings(max_new_tokens=24, ignore_eos=True))
    spec = pair.engine.decode(
        pair,
        ids,
        GenerationSettings(mode="assisted", num_assistant_tokens=3, max_new_tokens=24, ignore_eos=True),
    )
    assert len(plain.output_ids) == len(spec.output_ids) == 24
    assert plain.drafted == 0 and plain.prefill_ms > 0 and plain.tokens_per_s > 0
    assert spec.drafted > 0 and 0 <= spec.accepted <= spec.drafted and spec.draft_ms > 0
    # Its books: one target step per token plain; per round, speculative (each round's verify
    # forward timed apart from the draft's forwards), with fewer rounds than tokens.
    assert plain.step_costs["target"][1] == 23 and plain.target_forwards == 24
    rounds = spec.step_costs["target"][1]
    assert spec.target_forwards == 1 + rounds < 24 and spec.step_costs["draft"][1] >= spec.drafted / 3
    assert 0 <= spec.rejected_steps <= rounds
    assert all(ms > 0 for ms, _ in spec.step_costs.values())
    # Per position from its per-round books: every round judged (but a last one the budget may have
    # cut) at K = 3, and no more accepted than it booked.
    counts = analysis.acceptance_by_position(spec)
    assert len(counts) == 3 and rounds - 1 <= counts[0][0] <= rounds
    assert sum(a for _, a in counts) <= spec.accepted
    assert all(counts[i][1] >= counts[i + 1][1] for i in range(2))
    if spec.output_ids != plain.output_ids:  # only ever a near tie of the plain pipeline's own
        gap = pair.engine.gap(ids, plain.output_ids, spec.output_ids)
        assert gap is not None and gap <= 0.5, gap


@pytest.mark.real
@pytest.mark.openvino
def test_both_pipelines_stop_where_a_stop_string_appears(pair):
    """HumanEval stops each completion at its stop strings; an engine that ignored them would decode
    the whole budget (and score the same after extraction, so only the token count shows it)."""
    ids = pair.tokenizer("def add(a, b):\n    return", return_tensors=None)["input_ids"]
    full = pair.engine.decode(pair, ids, GenerationSettings(max_new_tokens=24, ignore_eos=True)).output_ids
    # The token that completes the first "\n": the pipelines stop just before or just after it.
    end = next(i for i in range(len(full)) if "\n" in pair.tokenizer.decode(full[: i + 1]))
    for mode in ("plain", "assisted"):
        settings = GenerationSettings(
            mode=mode, num_assistant_tokens=3, max_new_tokens=24, stop_strings=("\n",)
        )
        out = pair.engine.decode(pair, ids, settings).output_ids
        assert out == full[: len(out)] and len(out) in (end, end + 1), (mode, out, full)


@pytest.mark.real
@pytest.mark.openvino
def test_a_failure_inside_the_library_is_a_clear_error(pair):
    # OpenVINO GenAI checks its configuration in C++ and raises RuntimeError with the check's text
    # (its speculative sampling also failed such a check once at a 4-token budget's edge).
    config = openvino.config_of(GenerationSettings(max_new_tokens=2, ignore_eos=True), None)
    config.num_beams, config.num_return_sequences = 2, 3
    with pytest.raises(
        HarnessError, match=r"plain pipeline failed inside the library: Check 'num_beams"
    ) as err:
        pair.engine._generate("plain", [1000, 1001, 1002], config)
    assert "/home/" not in str(err.value) and "rows written so far are kept" in str(err.value)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.openvino
def test_cli_compare_on_openvino_writes_its_books(tmp_path, pair):
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "openvino", "--task", "decode", "--compare"]
    argv += ["--limit", "1", "--max_new_tokens", "16", "--json", str(rows_path), "--no_progress"]
    done = subprocess.run(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT, capture_output=True, text=True, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Drafted" in done.stdout and "Speedup" in done.stdout  # the seeds' table, acceptance columns
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert set(rows) == {"plain", "assisted"} and {r.engine for r in rows.values()} == {"openvino"}
    assert rows["assisted"].drafted > 0 and rows["plain"].drafted == 0
    assert {r.versions["openvino-genai"] for r in rows.values()} == {openvino_ir.openvino_version()}
    command = setup.command(rows["assisted"], setup.defaults(SPEC))
    assert "--engine openvino" in command and "--target_kernels" not in command


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.openvino
def test_two_bare_gguf_files_run_under_openvino(tmp_path):
    """The offline pair's two GGUF files alone in a folder (no config, no tokenizer beside them): the
    CLI converts each to IR once and runs plain and speculative decoding on them, the prompts
    tokenized by the file's own vocabulary, and names them in its rows."""
    files = bare_gguf_files(tmp_path)
    # Links (or copies that kept size and time) of the pair's files: the pair's IR serves them.
    pair_files = openvino.OpenVinoEngine.gguf_files(SPEC, _run(), None)
    assert {r: openvino_ir.ir_dir(p) for r, p in files.items()} == {
        r: openvino_ir.ir_dir(p) for r, p in pair_files.items()
    }
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--engine", "openvino", "--model_name_or_path", str(files["target"]), "--assistant_model",
            str(files["draft"]), "--compare", "--limit", "1", "--max_new_tokens", "16", "--json",
            str(rows_path), "--no_progress"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT, capture_output=True, text=True, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert set(rows) == {"plain", "assisted"} and rows["assisted"].drafted > 0
    assert rows["plain"].new_tokens > 0 and rows["plain"].target_model == str(files["target"].resolve())
