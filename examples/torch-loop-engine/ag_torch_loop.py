"""Speculative decoding in a loop of its own, as an engine of the assisted-generation suite.

Each round the draft proposes K tokens greedily, the target scores prompt, output and proposals in
one forward, and the longest prefix the target agrees with is kept, with the target's own next
token. Under greedy decoding that is the target's output exactly, which the suite's equivalence tier
checks. Each model keeps a KV cache, cut back past a rejected proposal.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import torch
from transformers import DynamicCache

from harness.base.errors import HarnessError
from harness.decoding.base import Engine
from harness.pairs import models
from harness.settings.setup import Draft
from harness.theory.timing import Measurement, record_forwards


class TorchLoopEngine(Engine):
    """A pair's torch target and draft in a plain speculative loop (greedy decoding only)."""

    name: ClassVar[str] = "torch-loop"
    backend: ClassVar[str | None] = "torch"
    default_k: ClassVar[int | None] = 4
    modes: ClassVar[tuple[str, ...]] = ("plain", "assisted")
    runs: ClassVar[str] = "a pair's Hugging Face models in fp32 (its draft model as it is)"

    @classmethod
    def check(cls, spec: models.PairSpec, run: Any) -> None:
        if run.decoding.do_sample:
            raise HarnessError(f"--engine {cls.name} decodes greedily only: drop --do_sample")
        if run.decoding.mode not in cls.modes:
            modes = " and ".join(cls.modes)
            raise HarnessError(f"--engine {cls.name} runs {modes} decoding, not {run.decoding.mode}")
        if run.target.precision != "fp32":
            raise HarnessError(f"--engine {cls.name} runs fp32 models: drop --target_precision")

    @classmethod
    def load(
        cls, spec: models.PairSpec, run: Any, *, weights_dir: str | None = None, verify: bool = False
    ) -> Any:
        cls.check(spec, run)
        # The harness loads the models (its registry, weights and checks); this engine only decodes them.
        as_loaded = dataclasses.replace(
            run,
            target=dataclasses.replace(run.target, engine="transformers"),
            draft=None if run.draft is None else Draft("fp32"),
        )
        pair = models.load_pair(spec, as_loaded, weights_dir=weights_dir, verify=verify)
        return dataclasses.replace(pair, target_setup=run.target, draft_setup=run.draft, engine=cls())

    def decode(self, pair: Any, prompt_ids: list[int], settings: Any) -> Measurement:
        if not prompt_ids:
            raise HarnessError("empty prompt: give at least one token")
        stop = _Stop(pair, settings, len(prompt_ids))
        watched = {"target": pair.target}
        if settings.mode == "assisted":
            watched["draft"] = pair.draft
        rounds: list[list[bool]] = []  # per verification, each proposal kept or not
        with torch.inference_mode(), record_forwards(watched) as log:
            start = time.perf_counter()
            ids = list(prompt_ids)
            target = _Cached(pair.target, ids)
            draft = _Cached(pair.draft, ids) if settings.mode == "assisted" else None
            while not stop.done(ids):
                if draft is None:
                    ids.append(int(target.feed(ids)[-1].argmax()))
                    continue
                proposal: list[int] = []
                for _ in range(min(settings.num_assistant_tokens, stop.left(ids))):
                    proposal.append(int(draft.feed(ids + proposal)[-1].argmax()))
                # One verification: the target's token after the last kept one and after each proposal.
                wanted = target.feed(ids + proposal).argmax(-1).tolist()
                kept = 0
                while kept < len(proposal) and proposal[kept] == wanted[kept]:
                    kept += 1
                rounds.append([True] * kept + [False] * (len(proposal) - kept))
                for token in proposal[:kept] + [wanted[kept]]:
                    if stop.done(ids):
                        break
                    ids.append(token)
                target.keep(len(ids) - 1)
                draft.keep(len(ids) - 1)
            end = time.perf_counter()
        output = ids[len(prompt_ids) :]
        drafted, accepted = sum(len(r) for r in rounds), sum(sum(r) for r in rounds)
        return Measurement.of_log(log, start, end, len(prompt_ids), output, drafted, accepted, rounds)


class _Cached:
    """A model and its KV cache, which holds every token but the sequence's last: each forward feeds
    what the cache lacks, so a verification is one forward of the last kept token and the proposals."""

    def __init__(self, model: torch.nn.Module, prompt: list[int]) -> None:
        self.model, self.cache, self.seen = model, DynamicCache(), 0
        if len(prompt) > 1:  # the prefill
            self.feed(prompt[:-1])

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Logits after each token of ``ids`` the cache did not hold yet."""
        new = torch.tensor([ids[self.seen :]])
        logits = self.model(input_ids=new, past_key_values=self.cache, use_cache=True).logits[0]
        self.seen = len(ids)
        return logits

    def keep(self, n: int) -> None:
        """Drop what the cache holds past the first ``n`` tokens (rejected proposals)."""
        if self.seen > n:
            self.cache.crop(n - self.seen)  # a negative count: the tokens to drop
            self.seen = n


class _Stop:
    """Where decoding ends, the same in both modes: the budget, EOS, a stop string in the new text."""

    def __init__(self, pair: Any, settings: Any, prompt_len: int) -> None:
        self.settings, self.tokenizer, self.prompt_len = settings, pair.tokenizer, prompt_len
        eos = settings.eos_token_id if settings.eos_token_id is not None else pair.eos_token_id
        self.eos = None if settings.ignore_eos else eos

    def left(self, ids: list[int]) -> int:
        return self.settings.max_new_tokens - (len(ids) - self.prompt_len)

    def done(self, ids: list[int]) -> bool:
        new = ids[self.prompt_len :]
        if len(new) >= self.settings.max_new_tokens:
            return True
        if len(new) < self.settings.min_new_tokens or not new:
            return False
        if self.eos is not None and new[-1] == self.eos:
            return True
        text = self.tokenizer.decode(new) if self.settings.stop_strings else ""
        return any(s in text for s in self.settings.stop_strings)
