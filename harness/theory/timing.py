"""Clocks on every forward pass of the target and the draft.

Forward hooks on the two top-level modules see each call ``generate`` makes (the target's verify
steps and the draft's proposal steps inside the assistant's own ``generate``), so the runner learns
each forward's wall time and its number of input tokens without sleeps, streamers or patching
transformers. Cost per forward is two ``perf_counter`` calls and one append: see
``hook_overhead_s`` and the test that holds it under 1% of a run.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from harness.base import devices


@dataclass(frozen=True)
class Forward:
    role: str  # "target" or "draft"
    start: float  # perf_counter seconds
    end: float
    input_tokens: int  # tokens fed in this call (prompt + candidates on a first verify, K+1 later)
    cache_tokens: int  # tokens already in the KV cache before the call
    token_ids: tuple[int, ...] = ()  # the ids fed in (kept for roles in ``keep_ids``): the candidates

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000.0


@dataclass
class ForwardLog:
    forwards: list[Forward] = field(default_factory=list)

    def of(self, role: str) -> list[Forward]:
        return [f for f in self.forwards if f.role == role]

    def total_ms(self, role: str) -> float:
        return sum(f.ms for f in self.of(role))


def _input_tokens(args: tuple, kwargs: dict, keep: bool) -> tuple[int, int, tuple[int, ...]]:
    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    n = int(ids.shape[1]) if isinstance(ids, torch.Tensor) else 0
    cache = kwargs.get("past_key_values")
    cached = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
    # tolist() then index: indexing the tensor first builds a view, which costs more than the copy.
    kept = tuple(ids.tolist()[0]) if keep and isinstance(ids, torch.Tensor) and ids.dim() == 2 else ()
    return n, cached, kept


def synchronizer(module: object) -> Callable[[], None] | None:
    """What waits for the work ``module``'s device has queued, or None where the device runs each
    call to its end before returning (the CPU: nothing is added there). A CUDA or XPU call returns
    when its kernels are launched, so a clock read then stops at the launch, and the work's time lands
    in whatever waits next (the first decode step, the draft's forward)."""
    device = devices.device_of(module)
    if device.type == "cpu":
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        return functools.partial(accelerator.synchronize, device)
    backend = getattr(torch, device.type, None)
    if backend is not None and hasattr(backend, "synchronize"):
        return functools.partial(backend.synchronize, device)
    return None


def synchronized(*modules: object) -> Callable[[], None] | None:
    """One call that waits for every device of ``modules``; None when all run on the CPU."""
    waits = [w for w in (synchronizer(m) for m in modules) if w is not None]
    if not waits:
        return None

    def wait() -> None:
        for w in waits:
            w()

    return wait


@contextmanager
def record_forwards(
    models: dict[str, torch.nn.Module], keep_ids: tuple[str, ...] = ("target",)
) -> Iterator[ForwardLog]:
    """Time every forward of each named module while the block runs; hooks are removed after.

    For roles in ``keep_ids`` the fed token ids are kept: a target's verify input holds the draft's
    candidates, which is how acceptance is counted exactly.
    """
    log = ForwardLog()
    handles = []
    # On an asynchronous device every boundary waits for the queued work first, so a forward's time
    # is its own; on the CPU there is nothing to wait for (``wait`` is None).
    wait = synchronized(*models.values())
    for role, module in models.items():
        pending: list[tuple[float, int, int, tuple[int, ...]]] = []
        keep = role in keep_ids

        def pre(_m: torch.nn.Module, args: tuple, kwargs: dict, _p: list = pending, _k: bool = keep) -> None:
            n, cached, ids = _input_tokens(args, kwargs, _k)
            if wait is not None:
                wait()
            _p.append((time.perf_counter(), n, cached, ids))

        def post(
            _m: torch.nn.Module, _args: tuple, _kw: dict, _out: object, _p: list = pending, _r: str = role
        ) -> None:
            if wait is not None:
                wait()
            end = time.perf_counter()
            start, n, cached, ids = _p.pop()
            log.forwards.append(Forward(_r, start, end, n, cached, ids))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        yield log
    finally:
        for h in handles:
            h.remove()


class _Probe(torch.nn.Module):
    """Takes what ``generate`` passes a model's forward and does nothing with it."""

    def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> torch.Tensor:
        return input_ids


def hook_overhead_s(calls: int = 2000, input_tokens: int = 8) -> float:
    """Seconds one forward's instrumentation costs, measured on a module that does nothing.

    The probe is called the way ``generate`` calls a model (keyword ``input_ids`` holding a verify
    step's tokens, a KV cache) and is watched as a target, whose ids are kept, so the slowest hook
    path is the one measured.
    """
    from transformers import DynamicCache

    module = _Probe()
    ids = torch.zeros(1, input_tokens, dtype=torch.long)
    cache = DynamicCache()

    def run() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            module(input_ids=ids, past_key_values=cache)
        return time.perf_counter() - start

    bare = min(run() for _ in range(3))
    with record_forwards({"target": module}, keep_ids=("target",)):
        hooked = min(run() for _ in range(3))
    return max(hooked - bare, 0.0) / calls


# Below this much wall time after the first new token a rate is not a measurement: an engine that
# drains one speculative round a token per call reports its round's later tokens microseconds apart
# (a 4-token decode once read 619,578 tokens/s). Such a decode's rate is NaN, shown as not timed.
MIN_TIMED_MS = 1.0


def per_token_ms(after_first_ms: float, new_tokens: int) -> float:
    """Time per token after the first (the seeds' Time/Token), or NaN when the decode after the first
    token is too short to time (fewer than two tokens, or under ``MIN_TIMED_MS``)."""
    if new_tokens < 2 or after_first_ms < MIN_TIMED_MS:
        return float("nan")
    return after_first_ms / (new_tokens - 1)


def rate(time_per_token_ms: float) -> float:
    """Tokens per second from a time per token; NaN when that time is not a measurement."""
    return 1000.0 / time_per_token_ms if time_per_token_ms > 0 else float("nan")


@dataclass
class Measurement:
    """One ``generate`` call, measured. Times in ms unless named ``_s``."""

    prompt_tokens: int
    output_ids: list[int]
    total_s: float
    prefill_ms: float
    target_prefill_ms: float
    time_per_token_ms: float
    tokens_per_s: float
    target_forwards: int
    draft_forwards: int
    target_ms: float
    draft_ms: float | None  # None where the engine books no draft time apart (llama.cpp's server)
    other_ms: float
    drafted: int
    accepted: int
    forwards: list[Forward] = field(default_factory=list, repr=False)
    # What an engine that keeps its own books reports instead of per-forward records (harness.decoding.genai):
    # role -> (ms, count) of its decode-step forwards (prefill left out), and its verify steps that
    # ended on a rejected candidate. None where ``forwards`` hold the record.
    step_costs: dict[str, tuple[float, int]] | None = None
    rejected_steps: int | None = None
    # What a loop that judges its own candidates records (a token tree, ``harness.decoding.trees``): per
    # round, each depth of the tree along the path it took, accepted or not. None: read off the
    # target's verify inputs, which hold a chain's candidates in order.
    judged_steps: list[list[bool]] | None = None
    # [[drafted, accepted], ...] per draft position as a deployment's counters book them, where no
    # round is seen (``analysis.positions_of_counters``); None: counted from the rounds.
    position_counts: list[list[int]] | None = None
    # Accepted tokens that were proposed from the context rather than by the draft model
    # (``harness.decoding.context``); None where nothing proposes from the context.
    from_context: int | None = None

    @classmethod
    def of_log(
        cls,
        log: ForwardLog,
        start: float,
        end: float,
        prompt_tokens: int,
        output_ids: list[int],
        drafted: int,
        accepted: int,
        judged_steps: list[list[bool]] | None = None,
    ) -> Measurement:
        """A decode timed by ``record_forwards`` from ``start`` to ``end`` (perf_counter seconds): the
        target's first forward ends the prefill, the rest is time per token."""
        target, draft = log.of("target"), log.of("draft")
        total_ms = (end - start) * 1000.0
        target_ms = sum(f.ms for f in target)
        draft_ms = sum(f.ms for f in draft)
        tpt = per_token_ms((end - target[0].end) * 1000.0, len(output_ids))
        return cls(
            prompt_tokens=prompt_tokens,
            output_ids=output_ids,
            total_s=total_ms / 1000.0,
            prefill_ms=(target[0].end - start) * 1000.0,
            target_prefill_ms=target[0].ms,
            time_per_token_ms=tpt,
            tokens_per_s=rate(tpt),
            target_forwards=len(target),
            draft_forwards=len(draft),
            target_ms=target_ms,
            draft_ms=draft_ms,
            other_ms=total_ms - target_ms - draft_ms,
            drafted=drafted,
            accepted=accepted,
            forwards=list(log.forwards),
            judged_steps=judged_steps,
        )

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_target_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0
