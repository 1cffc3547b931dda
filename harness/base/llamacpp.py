"""llama.cpp as a measuring instrument: its plain decoding of the same GGUF, timed by llama-bench.

The binary is the user's (``--llama-bench PATH`` or the environment variable below) or the suite's
own build of llama.cpp (``harness.kernels.llama_build``); for a model without a GGUF file the
reference is absent with a one-line note.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from harness.base.errors import HarnessError

ENV = "ASSISTED_GENERATION_LLAMA_BENCH"
# Before and after a run differing by more than this, the line says the host's speed moved.
DRIFT_NOTE = 0.10
T = TypeVar("T")


@dataclass(frozen=True)
class Reference:
    """llama.cpp's plain decoding of one GGUF file on this machine."""

    tokens_per_s: float
    tokens_per_s_std: float
    threads: int
    new_tokens: int
    build: str  # llama.cpp's build commit and number as llama-bench reports them
    # Measured around a run (``around``): tokens/s just before and just after it; this is their mean.
    before: float | None = None
    after: float | None = None

    @property
    def ms_per_token(self) -> float:
        return 1000.0 / self.tokens_per_s


def absent_note() -> str:
    return f"llama.cpp reference: not measured (no llama-bench given: --llama-bench PATH or {ENV})"


def reference(
    binary: Path | None, gguf: Path | None, model: str, *, threads: int, new_tokens: int = 64, depth: int = 0
) -> tuple[Reference | None, str]:
    """llama.cpp's plain decoding of ``gguf`` measured now and a line saying it, or None and a line
    saying why there is none (no binary given, no GGUF file, llama-bench failed): never an error."""
    if binary is None:
        return None, absent_note()
    if gguf is None:
        return None, f"llama.cpp reference: not measured ({model} has no GGUF file here)"
    try:
        reps = repetitions(depth)
        ref = measure(binary, gguf, threads=threads, new_tokens=new_tokens, depth=depth, repetitions=reps)
    except HarnessError as exc:
        return None, f"llama.cpp reference: failed ({exc})"
    return ref, (
        f"llama.cpp reference ({ref.build}, {gguf.name}, {ref.threads} threads, {ref.new_tokens} tokens"
        f"{_onto(depth)}): "
        f"plain decoding {ref.tokens_per_s:.2f} tok/s (+-{ref.tokens_per_s_std:.2f}) "
        f"= {ref.ms_per_token:.1f} ms/token"
    )


def around(
    binary: Path | None,
    gguf: Path | None,
    model: str,
    work: Callable[[], T],
    *,
    threads: int,
    new_tokens: int = 64,
    depth: int = 0,
) -> tuple[T, Reference | None, str]:
    """``work()`` with llama.cpp's plain decoding measured just before and just after it.

    Why both: a run of minutes on a shared 2-core VM sees the host's speed move by up to 25%, and
    llama-bench cannot be interleaved with the harness's own rounds; the reference is the mean of
    the two, and the line gives both (and says so when they differ by more than 10%), so a ratio to
    it is read with the drift it carries. Without a binary or a GGUF file: ``work()`` and the note.
    ``depth``: tokens already in the cache when the timed tokens start (llama-bench's ``-d``)."""
    before, line = reference(binary, gguf, model, threads=threads, new_tokens=new_tokens, depth=depth)
    result = work()
    if before is None:
        return result, None, line
    after, after_line = reference(binary, gguf, model, threads=threads, new_tokens=new_tokens, depth=depth)
    if after is None:
        return result, before, f"{line} (before this run; after it: {after_line})"
    mean = dataclasses.replace(
        before,
        tokens_per_s=(before.tokens_per_s + after.tokens_per_s) / 2,
        tokens_per_s_std=max(before.tokens_per_s_std, after.tokens_per_s_std),
        before=before.tokens_per_s,
        after=after.tokens_per_s,
    )
    line = (
        f"llama.cpp reference ({mean.build}, {gguf.name}, {mean.threads} threads, {mean.new_tokens} tokens"
        f"{_onto(depth)}): plain decoding {before.tokens_per_s:.2f} tok/s before this run and "
        f"{after.tokens_per_s:.2f} after, "
        f"mean {mean.tokens_per_s:.2f} = {mean.ms_per_token:.1f} ms/token"
    )
    drift = abs(after.tokens_per_s - before.tokens_per_s) / mean.tokens_per_s
    if drift > DRIFT_NOTE:
        line += f"; the host's speed moved by {drift:.0%} during the run, and ratios to it carry that"
    return result, mean, line


LONG_DEPTH = 2048  # a cache (llama-bench's -d) from which one repetition is timed, not three


def repetitions(depth: int) -> int:
    """llama-bench's repetitions onto a ``depth``-token cache: its own prefill of a long cache, made
    again each repetition, dwarfs the timed tokens, so from ``LONG_DEPTH`` on it runs once."""
    return 3 if depth < LONG_DEPTH else 1


def _onto(depth: int) -> str:
    return f" onto a {depth}-token cache" if depth else ""


def measure(
    binary: Path, gguf: Path, *, threads: int, new_tokens: int = 64, repetitions: int = 3, depth: int = 0
) -> Reference:
    """Plain decoding of ``new_tokens`` tokens (no prompt), ``repetitions`` times, on ``threads``;
    with ``depth``, onto a cache already holding that many tokens (llama-bench's ``-d``)."""
    return parse(_bench(binary, gguf, ["-p", "0", "-n", str(new_tokens)], threads, depth, repetitions))


def batch_ms(binary: Path, gguf: Path, *, rows: int, threads: int, depth: int = 0) -> float:
    """ms of one llama.cpp forward of ``rows`` tokens at once onto a cache holding ``depth`` (llama-bench's
    prompt test of that many tokens, ``-p rows -n 0 -d depth``): the work of its verification of
    ``rows - 1`` drafted tokens, beside the harness's forward of M = ``rows``."""
    text = _bench(binary, gguf, ["-p", str(rows), "-n", "0"], threads, depth, repetitions(depth))
    batch = [r for r in _rows(text) if r.get("n_prompt") == rows and r.get("n_gen", 0) == 0]
    if not batch or not float(batch[0].get("avg_ts", 0)) > 0:
        raise HarnessError(f"llama-bench's output has no row for a batch of {rows} tokens (n_prompt {rows})")
    return 1000.0 * rows / float(batch[0]["avg_ts"])


def _bench(binary: Path, gguf: Path, test: list[str], threads: int, depth: int, repetitions: int) -> str:
    """llama-bench's JSON output for one test (``test``: its -p and -n)."""
    cmd = [str(binary), "-m", str(gguf), *test, "-t", str(threads)]
    if depth:
        cmd += ["-d", str(depth)]
    cmd += ["-r", str(repetitions), "-o", "json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"llama-bench could not run ({exc}); command: {' '.join(cmd)}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise HarnessError(f"llama-bench failed (exit {done.returncode}): {' / '.join(tail)}")
    return done.stdout


def _rows(text: str) -> list[dict]:
    start = text.find("[")
    try:
        rows = json.loads(text[start:]) if start >= 0 else []
    except json.JSONDecodeError as exc:
        raise HarnessError(f"llama-bench printed no JSON list ({exc}); was it run with -o json?") from exc
    return [r for r in rows if isinstance(r, dict)]


def parse(text: str) -> Reference:
    """The decode row of llama-bench's JSON output."""
    decode = [r for r in _rows(text) if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
    if not decode:
        raise HarnessError("llama-bench's output has no decode row (n_gen > 0, n_prompt = 0)")
    r = decode[0]
    return Reference(
        tokens_per_s=float(r["avg_ts"]),
        tokens_per_s_std=float(r.get("stddev_ts", 0.0)),
        threads=int(r.get("n_threads", 0)),
        new_tokens=int(r["n_gen"]),
        build=f"{r.get('build_commit', '?')} ({r.get('build_number', '?')})",
    )
