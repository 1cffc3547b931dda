"""The one way the suite measures several arms (plain and assisted decoding, or configurations) on
the same work: interleaved per item, the arms' order rotating from item to item.

Why: a shared machine has slow phases, and the first run of a pair of runs meets colder caches and
another clock state than the second. Interleaving puts every arm into the same phase of the machine;
rotating keeps any arm from always running first. The CLI's ``--compare``, the benchmark cases'
rounds, the sweep and the HumanEval pass@1 suite all order their runs with ``interleave`` and run
them with ``run``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tqdm import tqdm

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class Job(Generic[T, A]):
    index: int  # 1-based: the item's place in the workload (a row's "example")
    item: T
    arm: A
    position: int  # the arm's place in this item's rotated order
    order: int  # the arm's place in the arms as given


def interleave(items: Sequence[T], arms: Sequence[A]) -> list[Job[T, A]]:
    """Every (item, arm), item by item; item ``i`` runs the arms rotated by ``i`` places."""
    jobs = []
    n = len(arms)
    for i, item in enumerate(items):
        for position in range(n):
            order = (position + i) % n
            jobs.append(Job(i + 1, item, arms[order], position, order))
    return jobs


def by_item(jobs: Sequence[Job[T, A]]) -> list[Job[T, A]]:
    """``jobs`` item by item, each item's arms in their own order: the order ``run`` returns."""
    return sorted(jobs, key=lambda job: (job.index, job.order))


# Tokens of the unrecorded warm-up decode of every arm before the clock starts: enough to take the
# one-time costs (kernel builds, caches, allocations, first touch of the weights) out of the first
# measured prompt, short enough to cost little next to a measured run.
WARMUP_TOKENS = 4


def run(
    jobs: Sequence[Job[T, A]],
    measure: Callable[[Job[T, A]], R],
    *,
    stored: Callable[[Job[T, A]], R | None] = lambda _job: None,
    resumed_from: str | None = None,
    desc: str = "",
    progress: bool = True,
    postfix: Callable[[R], dict[str, str]] | None = None,
    warmup: Callable[[Job[T, A]], object] | None = None,
) -> list[R]:
    """Run ``jobs`` in order, measuring each unless ``stored`` has its result (a resumed run), and
    return the results item by item in the arms' own order, whatever order they ran in.

    With ``resumed_from`` (the rows file), says how many runs were resumed from it, every time.
    With ``warmup``, each arm's first pending job is first run through it, unmeasured, and the time
    that preparation took is said (so no one-time cost lands in a measured row).
    """
    results: dict[tuple[int, int], R] = {}  # by (index, order): items and arms need not hash
    todo = []
    for job in jobs:
        found = stored(job)
        if found is not None:
            results[job.index, job.order] = found
        else:
            todo.append(job)
    if resumed_from is not None:
        print(f"resumed {len(results)} of {len(jobs)} runs from {resumed_from}", file=sys.stderr)
    if warmup is not None and todo:
        start = time.perf_counter()
        for job in {job.arm: job for job in reversed(todo)}.values():
            warmup(job)
        print(
            f"prepared in {time.perf_counter() - start:.1f} s (one-time costs: kernel builds, caches, first "
            "touch of the weights; not in any measured row)",
            file=sys.stderr,
        )
    bar = tqdm(todo, desc=desc, unit="run", file=sys.stderr, disable=not progress)
    for job in bar:
        result = results[job.index, job.order] = measure(job)
        if postfix is not None:
            bar.set_postfix(postfix(result))
    bar.close()
    return [results[job.index, job.order] for job in by_item(jobs)]
