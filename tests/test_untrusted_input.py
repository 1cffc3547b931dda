"""Input a user (or a hostile tester) can give, and state a run can find, that must never become a
wrong row, a lost row or a traceback: each is refused with one clear line, before any model loads,
or kept apart from the rows it is not."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import load_pair, pytest_in_process

from harness import cli
from harness.experiments import bench
from harness.report import NOT_TIMED, seed_table
from harness.settings import baselines, results
from harness.theory import timing
from harness.weights import onnx_export

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name", "tiny-llama", "--max_new_tokens", "8", "--no_progress"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- resume and the row store


def test_an_edited_prompt_is_decoded_again_not_resumed(tmp_path, capsys) -> None:
    prompts, rows = tmp_path / "p.txt", tmp_path / "pe.jsonl"
    prompts.write_text("def add(a, b):\n")
    assert run_cli(capsys, *TINY, "--prompts", str(prompts), "--json", str(rows))[0] == 0
    prompts.write_text("class Stack:\n")  # same line, same file, another prompt
    code, _, err = run_cli(capsys, *TINY, "--prompts", str(prompts), "--json", str(rows))
    assert code == 0, err
    assert "resumed 0 of 1 runs" in err
    first, second = results.read_rows(rows)
    assert first.prompt_sha and second.prompt_sha and first.prompt_sha != second.prompt_sha
    # The same prompt again is resumed: the key is the content, not the line it sits on.
    code, _, err = run_cli(capsys, *TINY, "--prompts", str(prompts), "--json", str(rows))
    assert "resumed 1 of 1 runs" in err and len(results.read_rows(rows)) == 2


@pytest.mark.parametrize("link", ["symlink", "hardlink", "dotted"])
def test_the_writer_lock_holds_through_any_path_to_the_file(tmp_path, capsys, link) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    other = {"symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl"}.get(link)
    if link == "symlink":
        other.symlink_to(rows)
    elif link == "hardlink":
        os.link(rows, other)
    else:
        other = tmp_path / "." / ".." / tmp_path.name / "rows.jsonl"
    with results.exclusive(rows):
        code, _, err = run_cli(capsys, *TINY, "--limit", "1", "--json", str(other))
    assert code == 2 and "another run is writing" in err
    assert rows.read_text() == ""


def test_a_foreign_one_line_json_file_is_refused_untouched(tmp_path, capsys) -> None:
    foreign = tmp_path / "config.json"
    foreign.write_text('{"a": 1}')
    code, _, err = run_cli(capsys, *TINY, "--limit", "1", "--json", str(foreign))
    assert code == 2 and "is not a rows file" in err
    assert foreign.read_text() == '{"a": 1}'


@pytest.mark.parametrize("where", ["proc", "long-name"])
def test_a_rows_path_that_cannot_be_created_is_a_usage_error(tmp_path, capsys, where) -> None:
    path = "/proc/x.jsonl" if where == "proc" else str(tmp_path / ("r" * 250 + ".jsonl"))  # 256 chars
    code, _, err = run_cli(capsys, *TINY, "--limit", "1", "--json", path)
    assert code == 2 and "cannot be created there" in err, err
    assert "Traceback" not in err


def test_a_rows_name_at_the_file_systems_limit_needs_nothing_beside_it(tmp_path, capsys) -> None:
    # The lock is the file's own: no longer name (a ".lock" beside it) has to fit.
    path = tmp_path / ("r" * 249 + ".jsonl")  # 255 characters, the most a name may have
    code, _, err = run_cli(capsys, *TINY, "--limit", "1", "--json", str(path))
    assert code == 0, err
    assert len(results.read_rows(path)) == 1 and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# --------------------------------------------------------------------------- flags the run would not read


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--ort_block_size", "64"], "--ort_block_size sets the ONNX Runtime export"),
        (["--ort-accuracy-level", "1"], "--ort_accuracy_level sets the ONNX Runtime export"),
        (["--llama-bench", "/usr/bin/true"], "--llama-bench times llama.cpp's reference row of --task sweep"),
        (["--rows", "x.jsonl"], "--rows is read by --regen-tables only"),
        (["--threads", "100000"], "--threads 100000 is more than this machine can use"),
        (
            [
                "--assisted_generation",
                "--assistant_schedule",
                "constant",
                "--assistant_confidence_threshold",
                "0.3",
            ],
            "read by --assistant_schedule dynamic only",
        ),
        (
            [
                "--target_backend",
                "onnxruntime",
                "--engine",
                "onnxruntime-genai",
                "--assistant_schedule",
                "heuristic",
            ],
            "--assistant_schedule is a setting of transformers' draft loop",
        ),  # fmt: skip
        (
            [
                "--target_backend",
                "onnxruntime",
                "--engine",
                "onnxruntime-genai",
                "--assistant_confidence_threshold",
                "0.3",
            ],
            "--assistant_confidence_threshold is a setting of transformers' draft loop",
        ),  # fmt: skip
    ],
    ids=[
        "ort-block",
        "ort-accuracy",
        "llama-bench",
        "rows",
        "threads",
        "threshold",
        "genai-sched",
        "genai-threshold",
    ],  # fmt: skip
)
def test_a_flag_the_run_would_ignore_is_refused(capsys, argv, expected) -> None:
    code, out, err = run_cli(capsys, *TINY, "--limit", "1", *argv)
    assert code == 2 and expected in err, err
    assert out == ""  # refused before anything decoded


def test_a_decode_too_short_to_time_has_no_rate() -> None:
    # An engine that drains one speculative round a token per call: 4 tokens, microseconds apart.
    assert math.isnan(timing.per_token_ms(0.0048, 4))
    assert math.isnan(timing.rate(timing.per_token_ms(0.0048, 4)))
    assert math.isnan(timing.per_token_ms(50.0, 1))
    assert timing.per_token_ms(30.0, 4) == 10.0 and timing.rate(10.0) == 100.0


def test_a_rate_that_was_not_timed_prints_as_such(tmp_path, capsys) -> None:
    rows_path = tmp_path / "rows.jsonl"
    assert run_cli(capsys, *TINY, "--limit", "1", "--json", str(rows_path))[0] == 0
    row = results.read_rows(rows_path)[0]
    row.time_per_token_ms = row.tokens_per_s = float("nan")
    for wide in (True, False):
        table = seed_table([row], acceptance=False, wide=wide)
        assert NOT_TIMED in table and "nan" not in table.lower().replace(NOT_TIMED, "")


# --------------------------------------------------------------------------- weights folders


def _local_folder(tmp_path: Path, damage: str) -> Path:
    """A saved tiny model whose safetensors file is then cut short or replaced by random bytes."""
    from harness.weights import tiny

    folder = tmp_path / f"model-{damage}"
    tiny.build_target("tiny-llama").save_pretrained(folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(4096))
    return folder


@pytest.mark.parametrize("damage", ["truncated", "random"])
@pytest.mark.parametrize("flag", ["--model_name_or_path", "--assistant_model"])
def test_a_damaged_safetensors_file_is_a_usage_error(tmp_path, capsys, damage, flag) -> None:
    from harness.weights import tiny

    good = tmp_path / "good"
    tiny.build_target("tiny-llama").save_pretrained(good)
    bad = _local_folder(tmp_path, damage)
    target, draft = (bad, good) if flag == "--model_name_or_path" else (good, bad)
    argv = ["--model_name_or_path", str(target), "--assistant_model", str(draft), "--limit", "1"]
    code, _, err = run_cli(capsys, *argv, "--no_progress")
    assert code == 2 and "is not a whole safetensors file" in err and str(bad) in err, err


def test_pytest_refuses_a_local_pair_with_damaged_weights(pytester, tmp_path) -> None:
    bad = _local_folder(tmp_path, "truncated")
    done = pytest_in_process(
        pytester, "--collect-only", "-q", "--local-pair", f"mine={bad}", "tests/test_options.py"
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "is not a whole safetensors file" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- cached exports


def test_every_file_of_a_cached_export_is_checked(tmp_path) -> None:
    """A damaged ``genai_config.json`` (not a model file) makes the export unfinished, so it is built
    again, and so does a marker that recorded only the model files (an export made before)."""
    folder = tmp_path / "export"
    folder.mkdir()
    for name, text in (("model.onnx", "graph"), ("model.onnx.data", "weights"), ("genai_config.json", "{}")):
        (folder / name).write_text(text)
    from harness.base import files

    names = sorted(p.name for p in folder.iterdir())
    (folder / onnx_export.MARKER).write_text(json.dumps({"files": files.record(folder, names)}))
    assert onnx_export.is_exported(folder)
    time.sleep(0.01)
    (folder / "genai_config.json").write_text("{]")  # same size, other content
    assert not onnx_export.is_exported(folder)
    (folder / "genai_config.json").write_text("{}")
    only_models = files.record(folder, ["model.onnx", "model.onnx.data"])
    (folder / onnx_export.MARKER).write_text(json.dumps({"files": only_models}))
    assert not onnx_export.is_exported(folder)


# --------------------------------------------------------------------------- interruption


def test_ctrl_c_stops_a_run_started_with_sigint_ignored(tmp_path) -> None:
    """A shell script's ``cmd &`` starts its job with SIGINT ignored, and Python keeps it so: such a
    run used to decode on to the end. It stops, rows kept, exit 130."""
    rows = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-llama", "--compare", "--limit", "6", "--max_new_tokens", "200",
            "--ignore_eos", "--no_progress", "--json", str(rows)]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not rows.exists() or not rows.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    kept = results.read_rows(rows)
    assert proc.returncode == 130, err
    assert 1 <= len(kept) < 12 and "interrupted" in err


# --------------------------------------------------------------------------- the gate on a new host kind


def test_a_host_kind_without_a_baseline_is_held_to_the_nearest_platform(tmp_path) -> None:
    case = bench.case("tiny-llama", 16, 8, num_assistant_tokens=3)
    pair = load_pair("tiny-llama")
    m = bench.measure_case(pair, case, 4, platform="amd-epyc-2c-avx512")
    root = tmp_path / "baselines"
    for platform in ("amd-epyc-2c-avx512", "stx"):
        baselines.save_baseline(root, platform, case.key(), m.record())
    assert baselines.baseline_platform(root, "amd-epyc-2c-avx512", case.key()) == "amd-epyc-2c-avx512"
    # A Xeon host with no baseline of its own: the AVX-512 2-core EPYC shares most of its slug.
    held_to = baselines.baseline_platform(root, "intel-xeon-2c-avx512", case.key())
    assert held_to == "amd-epyc-2c-avx512"
    gates = m.gate(root, held_to)
    assert "speedup" in gates and not gates["speedup"].failed, gates["speedup"].message
    other = bench.case("tiny-llama", 16, 8, num_assistant_tokens=4)
    with pytest.raises(baselines.MissingBaselineError, match="nor on any other platform"):
        baselines.baseline_platform(root, "intel-xeon-2c-avx512", other.key())
