"""pytest options that would make a run test less than it says are refused before collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    ],
)
def test_bad_option_is_a_usage_error(option, expected):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *option,
         "tests/test_options.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert expected in done.stdout + done.stderr
