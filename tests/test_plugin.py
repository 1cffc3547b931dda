"""The suite is a pytest plugin: another repository's tests get its options, fixtures and
parametrisation by installing the harness, with no conftest of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from helpers import installed_engine, pytest_in_process

# A test of a user's own repository, using the plugin's fixtures (WHICH: the pairs it runs on).
USER_TEST = Path(__file__).parent / "fixtures" / "user_test.py.txt"


def test_plugin_is_a_pytest11_entry_point():
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("assisted_generation") == "harness.pytest_plugin"


def test_a_users_repository_runs_the_suites_fixtures(pytester, tmp_path):
    (tmp_path / "test_mine.py").write_text(USER_TEST.read_text().replace("WHICH", "real=False"))
    done = pytest_in_process(pytester, "-q", "-k", "tiny-llama or tiny-qwen2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # parametrised over the registry's tiny pairs, ids carrying the pair name
    assert "2 passed" in done.stdout, done.stdout
    listed = pytest_in_process(pytester, "--collect-only", "-q", cwd=tmp_path)
    assert "test_mine.py::test_assisted_equals_plain[tiny-llama]" in listed.stdout


def test_help_lists_every_option_under_one_group(pytester, tmp_path):
    done = pytest_in_process(pytester, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("assisted generation:", 1)[1]
    options = ("--weights_dir", "--platform", "--update-baselines", "--regen-tables", "--real-prompts",
               "--perf-repetitions", "--target-backends", "--real-pairs", "--allow-inconclusive",
               "--humaneval-precision")  # fmt: skip
    for option in options:
        assert option in section


@pytest.mark.parametrize("marker", ["real", "slow", "perf", "pairs", "backends"])
def test_plugin_registers_the_markers(pytestconfig, marker):
    assert any(line.startswith(marker) for line in pytestconfig.getini("markers"))


def test_humaneval_precision_names_both_models_on_the_invariant_kernels():
    from harness.base.errors import HarnessError
    from harness.pytest_plugin import humaneval_precisions

    assert humaneval_precisions(None) == {}
    fp32 = humaneval_precisions("fp32")
    assert fp32 == dict(
        target_precision="fp32", draft_precision="fp32", target_kernels="invariant", draft_kernels="invariant"
    )
    assert humaneval_precisions("gguf, q4k")["draft_precision"] == "q4k"
    for bad in ("fp33", "fp32,w8af32,bf16", ""):
        with pytest.raises(HarnessError, match="--humaneval-precision"):
            humaneval_precisions(bad)


def test_a_bad_humaneval_precision_is_a_usage_error(pytester, tmp_path):
    done = pytest_in_process(pytester, "--humaneval-precision", "fp33", "--co", cwd=tmp_path)
    assert done.returncode != 0
    assert "--humaneval-precision 'fp33'" in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--humaneval-out", "/proc/x"), "--humaneval-out /proc/x: "),
        (("--llama-server", "/bin/false"), "is not a llama.cpp binary"),
    ],
)
def test_a_place_or_binary_that_cannot_serve_is_a_usage_error_before_collection(
    pytester, tmp_path, args, said
):
    done = pytest_in_process(pytester, *args, "--co", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert said in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_a_divergence_tier_resumes_its_finished_prompts_and_redoes_an_edited_one(pytester, tmp_path):
    """``--divergence-out`` of an interrupted tier: a rerun counts the prompts it finished, by name
    and digest; a row whose prompt text was since edited is decoded again, never counted for it."""
    import json

    root = Path(__file__).resolve().parents[1]
    rows = tmp_path / "div.jsonl"
    node = "perf/test_decode.py::test_precision_tier[tiny-llama-fp32-stock]"

    def tier() -> list[dict]:
        done = pytest_in_process(pytester, node, "-q", "--divergence-out", str(rows), cwd=root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return [json.loads(line) for line in rows.read_text().splitlines()]

    first = tier()
    assert len(first) == 4 and all(r["prompt_sha"] for r in first)
    assert tier() == first  # all four resumed: nothing decoded or written again
    edited = [{**first[0], "prompt_sha": "0" * 12}, *first[1:]]  # as if its text had changed since
    rows.write_text("".join(json.dumps(r) + "\n" for r in edited))
    again = tier()
    assert len(again) == 5 and again[-1]["prompt"] == first[0]["prompt"]
    assert again[-1]["prompt_sha"] == first[0]["prompt_sha"]


@pytest.mark.parametrize(
    ("engines", "said"),
    [
        ("vllm", "unknown engine 'vllm': choose one of transformers"),
        ("served", "--engines served: the suites cannot run a deployment's plain and speculative"),
        ("", "--engines names no engine"),
    ],
)
def test_engines_an_engine_axis_cannot_run_are_a_usage_error_before_collection(
    pytester, tmp_path, engines, said
):
    done = pytest_in_process(pytester, "--engines", engines, "--co", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_a_broken_plug_in_engine_is_said_once_and_the_others_run(tmp_path):
    """An installed package whose engine fails to import leaves the engine axis without it, said
    once in the header; named on purpose it is a usage error naming its package."""
    site = tmp_path / "site"
    installed_engine(site, "broken", "broken_engine:Engine")
    (site / "broken_engine.py").write_text("import a_runtime_that_is_not_installed\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(site)}
    node = "perf/test_decode.py::test_engine_tier"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", node, "--co", "-q", "-p", "no:cacheprovider"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("engine broken not run here")]
    assert len(said) == 1 and "broken-engine" in said[0] and "ModuleNotFoundError" in said[0]
    assert "tiny-qwen2-onnxruntime_genai" in done.stdout  # the others' cases still collected
    named = subprocess.run(
        [sys.executable, "-m", "pytest", node, "--co", "-q", "-p", "no:cacheprovider", "--engines", "broken"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert named.returncode == 4 and "failed to import" in named.stderr and "Traceback" not in named.stderr


def test_the_real_tiers_decode_the_prompt_sets_named(pytester, tmp_path):
    """The ``tier_prompts`` fixture: the first ``--real-prompts`` of the sets ``--prompts`` names, in
    turn; by default the mixed prompts, then HumanEval's."""
    (tmp_path / "test_sets.py").write_text(
        "def test_sets(tier_prompts):\n    print('LABELS', ' '.join(p.label for p in tier_prompts))\n"
    )
    chosen = pytest_in_process(
        pytester, "-q", "-s", "--prompts", "summarization,rag", "--real-prompts", "3", cwd=tmp_path
    )
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "LABELS summarization-reef rag-return-policy summarization-library" in chosen.stdout
    default = pytest_in_process(pytester, "-q", "-s", "--real-prompts", "24", cwd=tmp_path)
    labels = default.stdout.split("LABELS ", 1)[1].split()[:24]
    assert labels[:2] == ["general-capital", "code-merge_intervals"] and labels[22:] == [
        "HumanEval/0",
        "HumanEval/1",
    ]
