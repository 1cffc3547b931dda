"""An interrupted run loses no finished row and, rerun, duplicates none: SIGINT (Ctrl-C) and SIGKILL,
at several moments, including during loading; the CLI and the sweep alike."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 4
RUN = ["--model_name", "tiny-llama", "--compare", "--limit", str(LIMIT), "--max_new_tokens", "48",
       "--ignore_eos", "--no_progress"]  # fmt: skip


def _lines(path: Path) -> list[str]:
    # Read, not exists() then read: before its first model loads, the run creates and removes the
    # rows file once to prove the path takes a file, and a poll between the two finds it gone.
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _interrupt(argv: list[str], rows: Path, sig: signal.Signals, after_rows: int) -> tuple[int, str]:
    """Start a run, send ``sig`` once it has written ``after_rows`` rows (0: while it loads); its
    exit code and what it printed on stderr."""
    proc = _start(argv)
    deadline = time.monotonic() + 120
    while len(_lines(rows)) < after_rows and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if after_rows == 0:
        time.sleep(0.5)  # inside imports and model building
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("after_rows", [0, 1, 3])
def test_an_interrupted_run_resumes_without_losing_or_duplicating_rows(tmp_path, sig, after_rows):
    rows = tmp_path / "rows.jsonl"
    argv = [*RUN, "--json", str(rows)]
    code, err = _interrupt(argv, rows, sig, after_rows)
    kept = [json.loads(line) for line in _lines(rows) if line.strip().endswith("}")]
    if code == 0:
        pytest.skip("the run finished before the signal arrived (a fast machine); nothing to test")
    assert code in (130, -signal.SIGKILL, -signal.SIGINT), (code, err[-2000:])
    if code == 130:  # the run's own handling: one line, no traceback (-2: the interrupt came before
        # the interpreter ran any of the suite's code, in its own start-up, which prints its own)
        assert "Traceback" not in err, err[-2000:]
    assert len(kept) >= (after_rows if sig == signal.SIGINT else max(0, after_rows - 1))
    done = subprocess.run(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    final = [json.loads(line) for line in _lines(rows)]
    counts = Counter((r["example"], r["mode"]) for r in final)
    assert set(counts) == {(i, m) for i in range(1, LIMIT + 1) for m in ("plain", "assisted")}
    assert max(counts.values()) == 1, counts  # nothing measured twice
    # every row written before the interruption is still there, unchanged
    assert all(row in final for row in kept)
    assert f"resumed {len(kept)} of {2 * LIMIT} runs" in done.stderr


def test_an_error_raised_while_handling_an_interrupt_counts_as_the_interrupt():
    from harness.base.errors import caused_by_interrupt

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("Could not import module 'PreTrainedModel'") from None
    except ImportError as exc:
        assert caused_by_interrupt(exc)  # from None hides it from the traceback, not from __context__
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise ModuleNotFoundError("lazy import failed") from inner
    except ModuleNotFoundError as exc:
        assert caused_by_interrupt(exc)
    assert not caused_by_interrupt(ValueError("a plain bug"))
