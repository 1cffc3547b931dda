"""Run prompts through a loaded pair in one or more modes and turn each call into a ``Row``.

Modes are interleaved per prompt (plain, then assisted, for the same prompt) so both see the same
machine state; a speedup is only ever computed from rows of one run. Each finished row is appended
to the JSONL file before the next prompt starts, and a rerun with the same file skips rows it
already holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.base import platforms
from harness.base.errors import HarnessError
from harness.base.tasks import Prompt
from harness.decoding.generation import generate
from harness.experiments import experiment
from harness.pairs.models import LoadedPair, ModelSpec
from harness.settings import results, setup
from harness.settings.results import Row, append_row, read_rows
from harness.settings.setup import GenerationSettings
from harness.theory import analysis
from harness.theory.timing import Measurement
from harness.weights import packaged


def prompt_ids(pair: LoadedPair, prompt: Prompt) -> list[int]:
    if prompt.input_ids is not None:
        return list(prompt.input_ids)
    return list(pair.tokenizer(prompt.text)["input_ids"])


def context_length(pair: LoadedPair) -> int | None:
    config = getattr(pair.target, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def check_context(pair: LoadedPair, prompts: Sequence[Prompt], max_new_tokens: int | None) -> list[list[int]]:
    """Every prompt's token ids, after checking that prompt and budget fit the target's context:
    a prompt at or past it is an error naming it (before anything decodes), and a budget past it is
    cut to what fits, with a note."""
    ids_of = [prompt_ids(pair, p) for p in prompts]
    limit = context_length(pair)
    if limit is None:
        return ids_of
    too_long = [(p.label, len(ids)) for p, ids in zip(prompts, ids_of, strict=True) if len(ids) >= limit]
    if too_long:
        label, n = too_long[0]
        raise HarnessError(
            f"prompt {label} has {n} tokens, at or past {pair.spec.name}'s context of {limit} tokens"
            + (f" ({len(too_long)} prompts are)" if len(too_long) > 1 else "")
            + "; shorten it or leave it out"
        )
    over = [
        p.label
        for p, ids in zip(prompts, ids_of, strict=True)
        if len(ids) + (max_new_tokens or p.max_new_tokens) > limit
    ]
    if over:
        print(
            f"note: new tokens are cut to {pair.spec.name}'s context of {limit} tokens "
            f"for {len(over)} prompt(s)",
            file=sys.stderr,
        )
    return ids_of


def run_id_for(
    pair: LoadedPair,
    task: str,
    settings: GenerationSettings,
    platform: str,
    modes: Sequence[str] = ("plain",),
) -> str:
    """Same configuration, same id: resumed rows belong to the run they continue.

    The modes are part of it: a plain-only run and a later ``--compare`` run writing to the same file
    are different runs, so a speedup never pairs rows measured in separate runs.
    """
    arms = [pair.run_setup(dataclasses.replace(settings, mode=mode)).columns() for mode in modes]
    return setup.run_id(
        arms[0],
        task=task,
        platform=platform,
        host=platforms.host_id(),
        code=platforms.code_version(),
        # Settings without a column (ignore_eos, the n-gram size) and every further mode's columns.
        extra=[settings.to_dict(), *arms[1:]],
    )


def _model_id(spec: ModelSpec) -> str:
    # A local folder is named by its path: the reproduce command passes it back (--model_name_or_path).
    return spec.path or spec.hf_id or spec.name


def _by_position(m: Measurement, settings: GenerationSettings) -> list[list[int]] | None:
    if settings.mode == "plain":
        return None
    counts = analysis.acceptance_by_position(m)
    return counts if counts or not m.drafted else None


def make_row(
    pair: LoadedPair,
    m: Measurement,
    settings: GenerationSettings,
    *,
    example: int,
    task: str,
    label: str = "",
    platform: str = "",
    run_id: str = "",
    prompt_sha: str = "",
) -> Row:
    run = pair.run_setup(settings)
    by_position = _by_position(m, settings)
    return Row(
        **run.columns(),
        example=example,
        assisted=settings.mode != "plain",
        task=task,
        target_model=_model_id(pair.spec.target),
        draft_model=_model_id(pair.spec.draft) if run.uses_draft else None,
        prompt_tokens=m.prompt_tokens,
        new_tokens=m.new_tokens,
        total_s=m.total_s,
        prefill_ms=m.prefill_ms,
        target_prefill_ms=m.target_prefill_ms,
        time_per_token_ms=m.time_per_token_ms,
        tokens_per_s=m.tokens_per_s,
        target_forwards=m.target_forwards,
        draft_forwards=m.draft_forwards,
        target_ms=m.target_ms,
        draft_ms=m.draft_ms,
        other_ms=m.other_ms,
        drafted=m.drafted,
        accepted=m.accepted,
        acceptance_rate=m.acceptance_rate,
        tokens_per_target_forward=m.tokens_per_target_forward,
        accepted_from_context=m.from_context,
        accepted_by_position=by_position,
        acceptance_length=analysis.acceptance_length(by_position, m.new_tokens, m.target_forwards)
        if settings.mode != "plain"
        else None,
        output_ids=m.output_ids,
        platform=platform,
        cpu=platforms.detect().cpu_id,
        prompt_label=label,
        prompt_sha=prompt_sha,
        # An engine outside the Python libraries names its own build (llama.cpp's server).
        versions={**platforms.library_versions(), **(pair.engine.versions if pair.engine else {})},
        run_id=run_id,
        timestamp=results.utc_now(),
        # Every setting, including those without a column (ignore_eos, eos_token_id, n-gram size).
        extra={
            "weights": {role: packaged.portable(where) for role, where in pair.origins.items()},
            "settings": settings.to_dict(),
            "threads": torch.get_num_threads(),
        },
    )


def record(
    path: str | os.PathLike[str] | None,
    pair: LoadedPair,
    m: Measurement,
    settings: GenerationSettings,
    *,
    example: int,
    task: str,
    label: str,
    platform: str,
    run_id: str,
    prompt_sha: str,
    extra: Mapping[str, Any] | None = None,
) -> Row:
    """A measured decode as a row (``make_row``, plus the caller's own ``extra`` sections: a
    benchmark's round, a sweep's configuration), appended to ``path`` and flushed before the next
    decode starts. The CLI's runs, the benchmark's rounds and the sweep all write rows through here."""
    row = make_row(
        pair,
        m,
        settings,
        example=example,
        task=task,
        label=label,
        platform=platform,
        run_id=run_id,
        prompt_sha=prompt_sha,
    )
    row.extra.update(extra or {})
    if path is not None:
        append_row(path, row)
    return row


def run_prompts(
    pair: LoadedPair,
    prompts: Sequence[Prompt],
    settings: GenerationSettings,
    *,
    modes: Sequence[str] = ("plain",),
    task: str = "decode",
    json_path: str | Path | None = None,
    platform: str | None = None,
    max_new_tokens: int | None = None,
    progress: bool | None = None,
    on_row: Callable[[Row], None] | None = None,
    decode: Callable[[LoadedPair, list[int], GenerationSettings], Measurement] = generate,
) -> list[Row]:
    """Decode every prompt in every mode (interleaved per prompt); return all rows, resumed ones too."""
    platform = platform or platforms.detect().name
    for mode in modes:
        dataclasses.replace(settings, mode=mode).validate()
    # A run appending to a rows file holds its lock throughout, so a second run on it is refused.
    with results.exclusive(json_path) if json_path is not None else contextlib.nullcontext():
        run_id = run_id_for(pair, task, settings, platform, modes)
        done: dict[tuple, Row] = {}
        if json_path is not None:
            try:
                stored = read_rows(json_path)
            except ValueError as exc:  # a damaged line mid-file: say which, rather than a traceback
                raise HarnessError(f"cannot resume from {json_path}: {exc}") from exc
            done = {r.key(): r for r in stored if r.run_id == run_id}
        ids_of = check_context(pair, prompts, max_new_tokens)
        digests = [setup.prompt_digest(ids) for ids in ids_of]
        limit = context_length(pair)

        def settings_of(job: experiment.Job[Prompt, str]) -> GenerationSettings:
            budget = max_new_tokens or job.item.max_new_tokens
            if limit is not None:
                budget = min(budget, limit - len(ids_of[job.index - 1]))
            return dataclasses.replace(settings, mode=job.arm, max_new_tokens=budget)

        def stored(job: experiment.Job[Prompt, str]) -> Row | None:
            run = pair.run_setup(settings_of(job))
            key = setup.result_key(
                run, run_id=run_id, task=task, example=job.index, prompt_sha=digests[job.index - 1]
            )
            return done.get(key)

        def measure(job: experiment.Job[Prompt, str]) -> Row:
            s = settings_of(job)
            row = record(
                json_path,
                pair,
                decode(pair, ids_of[job.index - 1], s),
                s,
                example=job.index,
                task=task,
                label=job.item.label,
                platform=platform,
                run_id=run_id,
                prompt_sha=digests[job.index - 1],
            )
            if on_row is not None:
                on_row(row)
            return row

        def warmup(job: experiment.Job[Prompt, str]) -> None:
            s = settings_of(job)
            tokens = min(experiment.WARMUP_TOKENS, s.max_new_tokens)
            decode(
                pair, ids_of[job.index - 1], dataclasses.replace(s, max_new_tokens=tokens, min_new_tokens=0)
            )

        return experiment.run(
            experiment.interleave(prompts, list(modes)),
            measure,
            warmup=warmup,
            stored=stored,
            resumed_from=str(json_path) if json_path is not None else None,
            desc=f"{pair.spec.name} {task}",
            progress=progress is not False,
            postfix=lambda row: {"tok_s": f"{row.tokens_per_s:.2f}", "mode": row.mode},
        )
