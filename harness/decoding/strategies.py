"""Draft strategies: how the equivalence suite gets its proposals, and what acceptance it expects.

Shaped after transformers' candidate generators (one class per way of proposing tokens): each
strategy builds its draft for a loaded pair, shapes the prompt it needs, and states the acceptance
that proves the assisted path was really exercised, so an equivalence test is a grid of parameters
and one call (``harness.experiments.equivalence.EqualityRuns``). A new strategy is one class here.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from harness.base import vocab
from harness.pairs.models import LoadedPair
from harness.settings.setup import GenerationSettings

# A large vocabulary makes a chance agreement of a random draft practically impossible.
LARGE_VOCAB = 32000


@dataclass(frozen=True)
class Strategy:
    """The pair's own draft model (registered, or the local pair's): it must be accepted at least once."""

    name: str = "draft"

    def settings(self, k: int, schedule: str, new_tokens: int) -> GenerationSettings:
        return GenerationSettings(
            mode="assisted", num_assistant_tokens=k, assistant_schedule=schedule, max_new_tokens=new_tokens
        )

    def draft(self, pair: LoadedPair) -> LoadedPair:
        """The pair with this strategy's draft."""
        return pair

    def prompt(self, ids: list[int], continuation: list[int]) -> list[int]:
        """The prompt ids to decode, given the prompt and its plain continuation."""
        return ids

    def acceptance_problem(
        self, drafted: int, accepted: int, vocab_size: int, whole_budget: bool
    ) -> str | None:
        """Why ``accepted`` of ``drafted`` (summed over a test's cases) is not what this strategy
        implies, or None. ``whole_budget``: every case decoded its whole budget (no EOS inside)."""
        if accepted == 0:
            return f"{self.name} draft: none of {drafted} drafted tokens accepted"
        return None


@dataclass(frozen=True)
class SameModel(Strategy):
    """The target as its own draft: every drafted token must be accepted."""

    name: str = "self"

    def draft(self, pair: LoadedPair) -> LoadedPair:
        # A copy, not the same object: each model's forwards are timed and counted separately.
        return _with_draft(pair, copy.deepcopy(pair.target))

    def acceptance_problem(
        self, drafted: int, accepted: int, vocab_size: int, whole_budget: bool
    ) -> str | None:
        return None if accepted == drafted else f"target as its own draft accepted {accepted}/{drafted}"


@dataclass(frozen=True)
class RandomModel(Strategy):
    """Same architecture and vocabulary, fresh random weights: agrees by chance only."""

    name: str = "random"
    seed: int = 1234

    def draft(self, pair: LoadedPair) -> LoadedPair:
        config = copy.deepcopy(pair.target.config)
        _keep_layers(config, 1)
        # An exported target has no torch class to instantiate; the config's own class is the one.
        cls = (
            AutoModelForCausalLM.from_config
            if pair.target_setup.backend == "onnxruntime"
            else type(pair.target)
        )
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            model = cls(config)
        model.eval().to(pair.target.device)
        model.generation_config = copy.deepcopy(pair.target.generation_config)
        return _with_draft(pair, model)

    def acceptance_problem(
        self, drafted: int, accepted: int, vocab_size: int, whole_budget: bool
    ) -> str | None:
        # Exactly zero where the vocabulary is large (real pairs). A 512-token tiny model's random
        # draft hits the target's choice by chance now and then; chance level is a few percent, and
        # over a dozen drafted tokens one chance hit is already 8%: allow one on top of the 5%.
        allowed = 0 if vocab_size >= LARGE_VOCAB else 1 + 0.05 * drafted
        return None if accepted <= allowed else f"a random draft had {accepted}/{drafted} tokens accepted"


@dataclass(frozen=True)
class PartialModel(Strategy):
    """The target's first half of layers: agrees often, not always (partial acceptance)."""

    name: str = "partial"

    def draft(self, pair: LoadedPair) -> LoadedPair:
        return _with_draft(pair, truncated_target(pair))

    def acceptance_problem(
        self, drafted: int, accepted: int, vocab_size: int, whole_budget: bool
    ) -> str | None:
        if accepted == 0:
            return f"partly agreeing draft: none of {drafted} drafted tokens accepted"
        if whole_budget and accepted == drafted:
            # Over whole budgets the truncated target must also miss sometimes, or the
            # partial-accept path (accept some candidates, reject the rest) was never taken.
            return f"partly agreeing draft accepted all {drafted} tokens"
        return None


@dataclass(frozen=True)
class PromptLookup(Strategy):
    """No draft model: n-grams of the prompt propose the continuation (K = tokens proposed)."""

    name: str = "prompt_lookup"

    def settings(self, k: int, schedule: str, new_tokens: int) -> GenerationSettings:
        return GenerationSettings(mode="prompt_lookup", prompt_lookup_num_tokens=k, max_new_tokens=new_tokens)

    def prompt(self, ids: list[int], continuation: list[int]) -> list[int]:
        # Prompt lookup drafts only when the text repeats itself. Make it: the prompt, its plain
        # continuation, then the prompt again, so the lookup proposes that continuation.
        return ids + continuation + ids

    def acceptance_problem(
        self, drafted: int, accepted: int, vocab_size: int, whole_budget: bool
    ) -> str | None:
        return None  # what the lookup finds depends on the text; that it drafted is checked for all


STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (Strategy(), SameModel(), RandomModel(), PartialModel(), PromptLookup())
}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown draft strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None


def _with_draft(pair: LoadedPair, draft: PreTrainedModel) -> LoadedPair:
    return dataclasses.replace(pair, draft=vocab.pad_draft_vocab(draft, vocab.vocab_size(pair.target)))


def _keep_layers(config: PretrainedConfig, n: int) -> None:
    """Make ``config`` describe only its first ``n`` layers (per-layer types included)."""
    config.num_hidden_layers = n
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:n]


def truncated_target(pair: LoadedPair) -> PreTrainedModel:
    """The target with only its first half of layers (for the tiny stand-ins that is their
    registered draft). An exported target is truncated from the Hugging Face folder it was exported
    from, in fp32 torch."""
    if pair.target_setup.backend == "onnxruntime":
        config = copy.deepcopy(pair.target.config)
        _keep_layers(config, max(1, config.num_hidden_layers // 2))
        model = AutoModelForCausalLM.from_pretrained(
            pair.target.source, config=config, dtype=torch.float32, local_files_only=True
        )
        model.eval()
        model.generation_config = copy.deepcopy(pair.target.generation_config)
        return model
    model = copy.deepcopy(pair.target)
    decoder = model.get_decoder()
    layers = decoder.layers
    n = max(1, len(layers) // 2)
    decoder.layers = torch.nn.ModuleList(list(layers)[:n])
    _keep_layers(model.config, n)
    return model
