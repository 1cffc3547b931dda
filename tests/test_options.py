"""pytest options that would make a run test less than it says are refused before collection."""

from __future__ import annotations

import pytest
from helpers import pytest_in_process


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--real-prompts", "0"], "--real-prompts must be at least 1"),
        (["--real-prompts", "-1"], "--real-prompts must be at least 1"),
        (["--humaneval-limit", "0"], "--humaneval-limit must be at least 1"),
        (["--perf-repetitions", "1"], "needs two rounds"),
        (["--target-backends", ","], "--target-backends names no backend"),
        (["--real-pairs", "bogus"], "--real-pairs 'bogus': unknown bogus"),
        (["--weights_dir", "/nonexistent"], "--weights_dir /nonexistent is not a folder"),
        (["--target-device", "tpu"], "--target-device: Unknown device 'tpu'"),
        (["--draft-device", "gpu"], "--draft-device: Unknown device 'gpu'"),
        (["--prompts", "chat,poems"], "--prompts 'chat,poems': unknown prompt set 'poems'"),
        (["--acceptance-prompts", "0"], "--acceptance-prompts must be at least 1"),
    ],
)
def test_bad_option_is_a_usage_error(pytester, option, expected):
    done = pytest_in_process(pytester, "--collect-only", "-q", *option, "tests/test_options.py")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert expected in done.stdout + done.stderr


def test_every_bad_path_provider_and_backend_is_named_in_one_usage_error(pytester, tmp_path):
    """Checked at configure time as the command line checks its flags: an unknown backend or provider,
    a divergence file that is a folder, a HumanEval folder that is a file, and a platform name that
    would reach outside baselines/ (--update-baselines writes there)."""
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    options = ["--target-backends", "torch,bogus", "--execution-provider", "BogusEP", "--divergence-out",
               str(tmp_path), "--humaneval-out", str(a_file), "--platform", "../../x"]  # fmt: skip
    done = pytest_in_process(pytester, "--collect-only", "-q", *options, "tests/test_options.py")
    said = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, said
    for expected in (
        "unknown --target_backend 'bogus'",
        "execution provider 'BogusEP' is not available",
        f"--divergence-out {tmp_path} is a folder",
        f"--humaneval-out {a_file}: {a_file} is a file",
        "--platform '../../x' must be a slug",
    ):
        assert expected in said, said
    assert "Traceback" not in said


def test_a_family_selection_says_which_real_pairs_it_left_out(pytester):
    """`pytest perf -k codellama` collects the tiny CodeLlama stand-in; the real CodeLlama pair is not
    in --real-pairs, and the run says so and how to include it."""
    done = pytest_in_process(pytester, "--collect-only", "-q", "-k", "codellama", "perf/test_decode.py")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "tiny-codellama" in said
    assert "names real pairs this run did not collect: CodeLlama-7b-hf" in said
    assert "--real-pairs CodeLlama-7b-hf" in said


def test_a_device_off_the_cpu_is_in_every_id_and_the_cpus_ids_stay(pytester, monkeypatch):
    """`--target-device cuda --draft-device cuda:1`: every case that loads a pair says where its
    models run (`-k cuda` selects them); the CPU's ids, which stored baselines are named by, stay as
    they were. Only collection runs, nothing is placed: the device check answers as on a host with
    two GPUs."""
    import torch

    from harness.base import devices

    monkeypatch.setattr(devices, "check_device", lambda name: torch.device(name))
    args = ("--collect-only", "-q", "-k", "tiny", "perf/test_decode.py")
    on_gpus = pytest_in_process(pytester, *args, "--target-device", "cuda", "--draft-device", "cuda:1")
    on_cpu = pytest_in_process(pytester, *args)
    gpu_ids = [line for line in on_gpus.stdout.splitlines() if "::" in line]
    cpu_ids = [line for line in on_cpu.stdout.splitlines() if "::" in line]
    assert len(gpu_ids) == len(cpu_ids) > 50
    assert all("[cuda-draft_cuda1-" in line for line in gpu_ids), gpu_ids
    assert "perf/test_decode.py::test_property_assisted_equals_plain[tiny-llama]" in cpu_ids
    assert not any("cuda" in line for line in cpu_ids)
