"""The acceptance tier: a configuration's drafting over a real prompt set, held to its reference.

Each engine runs the pair as it is registered for it (transformers: the pair's K and schedule;
an engine with its own loop: its constant K), greedy, over the mixed prompts and then HumanEval's
(``tier_prompts``), each to the whole budget. Each prompt's decode is written as a row as it
finishes; what the tier keeps of it (``acceptance.PromptAcceptance``) is held to the stored
reference (``harness.settings.acceptance``), whatever the host kind.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from tqdm import tqdm

from harness.base import platforms, tasks
from harness.experiments import humaneval, runner
from harness.kernels import fused
from harness.pairs.models import LoadedPair
from harness.settings import acceptance, baselines, setup
from harness.settings.setup import GenerationSettings

TASK = "acceptance"
# 16 prompts (the mixed ones, then HumanEval's) of 32 new tokens: about 130 verifications at the
# first position, so one flipped near tie moves a rate by under a point, well under its floor's
# slack (at least 5 points); the references hold 40, so a run of up to 40 is held to them.
TIER_PROMPTS = 16
TIER_NEW_TOKENS = 32


def tier_prompts(n: int = TIER_PROMPTS, new_tokens: int = TIER_NEW_TOKENS) -> list[tasks.Prompt]:
    """The first ``n`` of the mixed prompts (questions and code, alternating), then HumanEval's."""
    prompts = [dataclasses.replace(p, max_new_tokens=new_tokens) for p in tasks.decode_prompts("mixed")]
    if n > len(prompts):
        prompts += humaneval.prompts(n - len(prompts), new_tokens)
    return prompts[:n]


def tier_settings(pair: LoadedPair, new_tokens: int = TIER_NEW_TOKENS) -> GenerationSettings:
    """Greedy assisted decoding as the pair is registered for its engine, to the whole budget."""
    k = getattr(pair.engine, "default_k", None)
    registered = pair.spec.decoding
    if k is not None:
        registered = dataclasses.replace(registered, num_assistant_tokens=k, assistant_schedule="constant")
    tier = dataclasses.replace(registered, mode="assisted", max_new_tokens=new_tokens, ignore_eos=True)
    # The pair's proposals from the context need both models on the fused layers: a draft swapped in
    # for a check (``strategies``: a random one) runs the draft's chain alone.
    fused_pair = pair.draft is not None and all(
        isinstance(getattr(m, "model", None), fused.FusedStack) for m in (pair.target, pair.draft)
    )
    context = setup.registered_context(registered, pair.target_setup, pair.draft_setup, tier)
    return dataclasses.replace(tier, context_draft=context if fused_pair else 0)


def case_key(pair: LoadedPair, settings: GenerationSettings) -> baselines.CaseKey:
    return baselines.case_key(pair.run_setup(settings).columns(), TASK, None)


def reference_key(pair: LoadedPair, settings: GenerationSettings) -> str:
    return acceptance.reference_key(pair.spec.name, case_key(pair, settings).case_id)


def reference(
    pair: LoadedPair, settings: GenerationSettings, measured: list[acceptance.PromptAcceptance], platform: str
) -> acceptance.Reference:
    """A run recorded as its configuration's reference (``--update-baselines``)."""
    versions = {**platforms.library_versions(), **(pair.engine.versions if pair.engine else {})}
    host = platforms.detect()
    where = f"{platform} ({host.cpu}, {baselines.cpu_kind(host.cpu_id) or 'CPU kind unknown'})"
    return acceptance.Reference(
        reference_key(pair, settings), case_key(pair, settings).to_dict(), tuple(measured), where, versions
    )


def rows_path(platform: str, runs: str | os.PathLike[str]) -> Path:
    return Path(runs) / "rows" / f"{TASK}-{platform}.jsonl"


def measure(
    pair: LoadedPair,
    prompts: list[tasks.Prompt],
    settings: GenerationSettings,
    *,
    rows: str | os.PathLike[str] | None = None,
    platform: str = "",
    run_id: str = "",
    progress: bool = True,
) -> list[acceptance.PromptAcceptance]:
    """Decode each prompt once under ``settings``; each decode's row is written before the next."""
    from harness.decoding.generation import generate

    out = []
    for p in tqdm(
        prompts, desc=f"acceptance {pair.spec.name}", unit="prompt", file=sys.stderr, disable=not progress
    ):
        ids = list(p.input_ids) if p.input_ids is not None else list(pair.tokenizer(p.text)["input_ids"])
        m = generate(pair, ids, settings)
        sha = setup.prompt_digest(p.text)
        row = runner.record(
            rows, pair, m, settings, example=len(out), task=TASK, label=p.label, platform=platform,
            run_id=run_id, prompt_sha=sha,
        )  # fmt: skip
        counts = row.accepted_by_position
        out.append(
            acceptance.PromptAcceptance(
                p.label,
                sha,
                m.new_tokens,
                m.target_forwards,
                tuple((int(d), int(a)) for d, a in counts) if counts is not None else None,
                setup.prompt_digest(m.output_ids),
            )
        )
    return out
