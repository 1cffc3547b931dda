"""Concurrent requests on a serving engine: where speculation stops paying as load grows.

A server batches the steps of the requests it serves at once, so its aggregate throughput grows
with concurrency while each request slows; speculative decoding's verifications widen every batch
by K rows, and past some load that costs more than it saves (vLLM and ArcticInference users report
n-gram and suffix decoding turning into a loss at high concurrency). ``run_level`` sends the prompts
as N concurrent streams (each stream one request at a time, the next prompt when its last is done)
to an engine serving N at once (``Engine.serve_concurrently``): each request a row, written as it
finishes, and the level's aggregate tokens per second over its wall time. Bounded: each prompt is
sent once, and no stream starts a request past ``deadline_s``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.base.errors import HarnessError
from harness.base.tasks import Prompt
from harness.experiments import runner
from harness.pairs.models import LoadedPair
from harness.settings import setup
from harness.settings.results import Row
from harness.settings.setup import GenerationSettings
from harness.theory.timing import Measurement

# No stream starts a request after this long at one level (each request has its own timeout too).
DEADLINE_S = 1800.0


@dataclass(frozen=True)
class Level:
    """One concurrency level in one mode: its requests' tokens and times, and its wall time."""

    concurrency: int
    mode: str
    requests: int
    new_tokens: int
    wall_s: float
    time_per_token_ms: tuple[float, ...]  # each request's own (NaN where too short to time)

    @property
    def aggregate_tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def request_tokens_per_s(self) -> float:
        """A request's own rate: 1000 over the mean of the requests' time per token."""
        timed = [t for t in self.time_per_token_ms if not math.isnan(t)]
        return 1000.0 / statistics.fmean(timed) if timed else math.nan


def _serving_engines() -> str:
    """The registered engines that serve several requests at once, as ``--engine`` spells them."""
    from harness.decoding import engines

    names = [n for n in engines.names() if engines.engine_class(n).max_concurrency > 1]
    return " or ".join(f"--engine {n}" for n in names) or "an engine with slots of its own"


def check_concurrency(engine: object, levels: Sequence[int]) -> None:
    """Each level at least 1 and within what the engine serves at once (``max_concurrency``)."""
    most = int(getattr(engine, "max_concurrency", 1))
    name = getattr(engine, "name", "this engine")
    for n in levels:
        if n < 1:
            raise HarnessError(f"--concurrency must be at least 1 (got {n})")
        if most == 1 and n > 1:
            raise HarnessError(
                f"--concurrency {n}: --engine {name} decodes one request at a time; concurrent streams go "
                f"to a serving engine ({_serving_engines()})"
            )
        if n > most:
            raise HarnessError(f"--concurrency {n}: --engine {name} serves at most {most} requests at once")


def run_level(
    pair: LoadedPair,
    prompts: Sequence[list[int]],
    settings: GenerationSettings,
    concurrency: int,
    record: Callable[[int, Measurement, float], None],
    *,
    deadline_s: float = DEADLINE_S,
) -> Level:
    """Every prompt sent once over ``concurrency`` streams to ``pair``'s engine serving that many at
    once; ``record(index, measurement, sent_s)`` is called as each request finishes (under a lock,
    so rows are written whole; ``sent_s``: when it was sent, from the level's start). The first
    prompt is decoded once alone first (not recorded): it starts the server and touches the weights,
    so the level times requests only."""
    from harness.decoding.generation import generate

    if pair.engine is None:
        raise HarnessError(f"concurrent requests need an engine that serves them ({_serving_engines()})")
    check_concurrency(pair.engine, [concurrency])
    pair.engine.serve_concurrently(concurrency)
    generate(pair, list(prompts[0]), settings)
    lock = threading.Lock()
    todo = list(enumerate(prompts))
    done: list[Measurement] = []
    start = time.perf_counter()

    def stream() -> None:
        while True:
            with lock:
                if not todo or time.perf_counter() - start > deadline_s:
                    return
                index, ids = todo.pop(0)
            sent = time.perf_counter() - start
            m = generate(pair, list(ids), settings)
            with lock:
                done.append(m)
                record(index, m, sent)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(stream) for _ in range(concurrency)]:
            future.result()  # a failed request fails the level, with its own message
    wall = time.perf_counter() - start
    return Level(
        concurrency,
        settings.mode,
        len(done),
        sum(m.new_tokens for m in done),
        wall,
        tuple(m.time_per_token_ms for m in done),
    )


def measure_levels(
    pair: LoadedPair,
    prompts: Sequence[Prompt],
    settings: GenerationSettings,
    levels: Sequence[int],
    modes: Sequence[str],
    *,
    json_path: str | Path | None,
    platform: str,
    max_new_tokens: int | None = None,
    progress: bool = True,
) -> list[Level]:
    """Each level in each mode (``run_level``), every prompt decoded to its whole budget so each
    level's load is what it says; each request a row (``runner.record``, its level in
    ``extra["concurrency"]``), written as it finishes."""
    from tqdm import tqdm

    check_concurrency(pair.engine, levels)
    budget = max_new_tokens or prompts[0].max_new_tokens
    ids_of = runner.check_context(pair, prompts, budget)
    digests = [setup.prompt_digest(ids) for ids in ids_of]
    run_id = runner.run_id_for(pair, "concurrency", settings, platform, modes)
    out = []
    bar = tqdm(
        total=len(levels) * len(modes) * len(prompts), desc="requests", unit="request", disable=not progress
    )
    for n in levels:
        for mode in modes:
            s = dataclasses.replace(settings, mode=mode, max_new_tokens=budget, ignore_eos=True).validate()

            def record(
                index: int, m: Measurement, sent: float, s: GenerationSettings = s, n: int = n
            ) -> None:
                runner.record(
                    json_path, pair, m, s, example=index + 1, task="concurrency", label=prompts[index].label,
                    platform=platform, run_id=run_id, prompt_sha=digests[index],
                    extra={"concurrency": n, "sent_s": round(sent, 4)},
                )  # fmt: skip
                bar.update(1)

            out.append(run_level(pair, ids_of, s, n, record))
    bar.close()
    return out


def levels_of_rows(rows: Sequence[Row]) -> list[Level]:
    """The levels a run's rows (``measure_levels``) hold: each level's wall time from when its
    requests were sent and how long each took."""
    groups: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        level = (row.extra or {}).get("concurrency")
        if level is not None:
            groups.setdefault((int(level), row.mode), []).append(row)
    out = []
    for (n, mode), group in sorted(groups.items()):
        wall = max(float(r.extra.get("sent_s", 0.0)) + r.total_s for r in group)
        tokens = sum(r.new_tokens for r in group)
        out.append(Level(n, mode, len(group), tokens, wall, tuple(r.time_per_token_ms for r in group)))
    return out
