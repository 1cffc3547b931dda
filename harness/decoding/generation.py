"""Plain and assisted decoding through transformers' own ``generate``, with every setting pinned.

Users ship ``generate(assistant_model=...)``, so that is what runs. What this module adds is
control and measurement: every setting that changes speed or output is set explicitly on each call
(transformers reads K, the schedule and the confidence threshold from the *assistant's*
``generation_config``, ignores them when passed to the target's ``generate``, ships version-dependent
defaults for them, its "heuristic" schedule writes K back into the assistant between calls, and
where scikit-learn is installed it re-fits the confidence threshold between rounds), and every
forward of both models is timed (``harness.theory.timing``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation import candidate_generator
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

from harness.base import backends, devices
from harness.base.errors import HarnessError
from harness.decoding import trees
from harness.decoding.base import Engine
from harness.pairs import models
from harness.pairs.models import LoadedPair
from harness.settings import setup
from harness.settings.setup import SCHEDULES, GenerationSettings, RunSetup, Target
from harness.theory.analysis import count_acceptance
from harness.theory.timing import Measurement, record_forwards, synchronized


def generation_config(settings: GenerationSettings, pair: LoadedPair) -> GenerationConfig:
    """The target's full generation config: nothing left to be filled from a checkpoint's defaults."""
    eos = (
        None
        if settings.ignore_eos
        else (settings.eos_token_id if settings.eos_token_id is not None else pair.eos_token_id)
    )
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else pair.eos_token_id
    kw: dict[str, Any] = dict(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=settings.min_new_tokens,
        do_sample=settings.do_sample,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )
    if settings.do_sample:
        kw.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    if settings.mode == "prompt_lookup":
        kw.update(
            prompt_lookup_num_tokens=settings.prompt_lookup_num_tokens,
            max_matching_ngram_size=settings.max_matching_ngram_size,
        )
    return GenerationConfig(**kw)


class MinNewTokensOnEveryDevice(MinNewTokensLengthLogitsProcessor):
    """transformers' minimum-new-tokens rule, for scores on any device.

    transformers hands the target's logits processors to the draft's own ``generate`` as they are;
    the stock processor keeps its EOS ids on the target's device, so a draft on another device (the
    seeds' split: target on the accelerator, draft on the CPU) fails at its first step."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        own = self.eos_token_id
        self.eos_token_id = own.to(scores.device)
        try:
            return super().__call__(input_ids, scores)
        finally:
            self.eos_token_id = own


def split_min_new_tokens(
    config: GenerationConfig, kwargs: dict[str, Any], pair: LoadedPair, prompt_len: int
) -> None:
    """On a pair split across devices, move ``min_new_tokens`` from ``config`` into a processor that
    both models' ``generate`` can run (``MinNewTokensOnEveryDevice``); on one device nothing changes."""
    if not config.min_new_tokens or config.eos_token_id is None:
        return
    on_target = devices.device_of(pair.target)
    if on_target == devices.device_of(pair.draft):
        return
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    rule = MinNewTokensOnEveryDevice(prompt_len, config.min_new_tokens, eos, device=on_target)
    kwargs["logits_processor"] = LogitsProcessorList([rule])
    config.min_new_tokens = None


def pin_assistant(draft: torch.nn.Module, settings: GenerationSettings) -> None:
    """Write K, schedule and threshold where transformers reads them: the draft's config."""
    config = draft.generation_config
    config.num_assistant_tokens = settings.num_assistant_tokens
    config.num_assistant_tokens_schedule = SCHEDULES[settings.assistant_schedule]
    # 0 turns the confidence stop off; transformers' default (0.4) would otherwise make every
    # "constant" run silently dynamic.
    config.assistant_confidence_threshold = settings.confidence_threshold_in_effect


@contextlib.contextmanager
def threshold_as_set() -> Iterator[None]:
    """Run the draft's confidence threshold as the settings state it, on every host.

    transformers' assisted loop re-fits the threshold between rounds (an ROC fit over the draft's
    probabilities and the target's verdicts) only where scikit-learn happens to be importable, so
    one run stopped its drafts differently on two hosts (K=7 "dynamic" at threshold 1e-6 ran every
    round to K here and stopped a round at 4 on a host with scikit-learn), and a row's threshold
    was not the one that ran. The switch it reads is this module's ``is_sklearn_available``; it is
    turned off for the call only, and restored after."""
    found = getattr(candidate_generator, "is_sklearn_available", None)
    if found is None:
        raise HarnessError(
            "this transformers version's assisted loop no longer reads is_sklearn_available: check "
            "how it adapts the draft's confidence threshold before pinning it (harness.decoding.generation)"
        )
    candidate_generator.is_sklearn_available = lambda: False
    try:
        yield
    finally:
        candidate_generator.is_sklearn_available = found


class _InternalDraftCall(logging.Filter):
    """transformers' own assisted loop calls the draft's ``generate`` with a config and keyword
    settings together, and then warns about it once per process: an internal call, nothing a user
    passed, and printed in the middle of every first assisted run's progress bar. Dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "together with generation-related" not in record.getMessage()


logging.getLogger("transformers.generation.utils").addFilter(_InternalDraftCall())


class StopInNewText(StoppingCriteria):
    """Stop a sequence once the text generated after the prompt contains any of ``stop_strings``.

    Written here because transformers' StopStringCriteria only asks whether the sequence ENDS with
    a stop string. That is enough when one token is added per step, but an assisted step appends
    up to K+1 tokens, and a stop string inside them is never seen again: assisted runs went on to
    the token budget (119 tokens where plain decoding stopped after 8, HumanEval/2). Searching the
    whole new text stops both modes at the step that completes the first stop string.
    """

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...] | list[str], prompt_len: int) -> None:
        if not stop_strings or any(not s for s in stop_strings):
            raise HarnessError("stop strings must be non-empty strings")
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.prompt_len = prompt_len

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None = None, **kwargs: Any
    ) -> torch.BoolTensor:
        done = [
            any(s in self.tokenizer.decode(row[self.prompt_len :]) for s in self.stop_strings)
            for row in input_ids
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def generate(
    pair: LoadedPair, prompt_ids: list[int] | torch.Tensor, settings: GenerationSettings
) -> Measurement:
    """Decode one prompt once and measure it, through the pair's engine (a pair built by hand,
    without one, runs transformers' loop)."""
    settings.validate()
    ids = [int(t) for t in torch.as_tensor(prompt_ids).reshape(-1)]
    if pair.engine is not None:
        return pair.engine.decode(pair, ids, settings)
    return transformers_loop(pair, ids, settings)


# Largest top-2 logit gap (in logits, after the model's own output layer) that counts as a near tie
# at a precision whose batched and one-token kernels may round differently. bf16 keeps 8 bits of
# mantissa: for logits of magnitude ~20 one ulp is ~0.125, and a K+1-token forward accumulates a few
# ulps of difference through the layers, so gaps up to ~0.5 can flip. fp32 gets no allowance.
NEAR_TIE_TOLERANCE = {"fp32": 0.0, "bf16": 0.5, "w8abf16": 0.5, "w4abf16": 0.5, "w8af32": 1e-3}


class Transformers(Engine):
    """transformers' own ``generate`` with ``assistant_model`` (what users ship), and the harness's own
    loop where a run verifies a token tree (transformers' verifies chains only)."""

    name: ClassVar[str] = "transformers"
    default_k: ClassVar[int | None] = None  # the pair's registered K and schedule
    own_draft: ClassVar[bool] = False
    runs: ClassVar[str] = "Hugging Face folders (or GGUF files transformers converts), or an ONNX export"

    @classmethod
    def near_tie_tolerance(cls, target: Target) -> float:
        if target.backend == "onnxruntime":
            return backends.ort_near_tie_tolerance(target.precision)
        # The near-tie rule is for kernels whose batched rows may round differently (stock,
        # third-party); the batch-invariant kernels compute every row as a one-token step: none.
        if target.kernels == "invariant":
            return 0.0
        return NEAR_TIE_TOLERANCE.get(target.precision, 0.0)

    @classmethod
    def resolve(cls, spec: models.PairSpec, **given: Any) -> RunSetup:
        if given.pop("endpoint", None) or given.pop("speculative_endpoint", None):
            raise HarnessError(
                "--endpoint and --speculative-endpoint go with an engine that decodes over a deployment's "
                "API (--engine served): add it or drop them"
            )
        return setup.resolve(spec, **given)

    @classmethod
    def check(cls, spec: models.PairSpec, run: RunSetup) -> None:
        models.check_run(spec, run)

    @classmethod
    def load(
        cls, spec: models.PairSpec, run: RunSetup, *, weights_dir: str | None = None, verify: bool = False
    ) -> LoadedPair:
        pair = models.load_pair(spec, run, weights_dir=weights_dir, verify=verify)  # checks the run
        pair.engine = cls()
        return pair

    def decode(self, pair: LoadedPair, prompt_ids: list[int], settings: GenerationSettings) -> Measurement:
        return transformers_loop(pair, prompt_ids, settings)


def transformers_loop(pair: LoadedPair, prompt_ids: list[int], settings: GenerationSettings) -> Measurement:
    """transformers' ``generate`` on one prompt, every setting pinned and every forward timed."""
    if settings.mode == "assisted" and pair.draft is None:
        raise HarnessError(f"{pair.spec.name} was loaded without a draft; load it with its draft to assist")
    if settings.mode == "assisted" and (
        settings.draft_tree or settings.context_draft or settings.synthetic_acceptance is not None
    ):
        # transformers' loop verifies a draft model's chains only, by the target's verdict: a tree,
        # proposals from the context and a synthetic verdict run in the harness's own.
        return trees.decode(pair, prompt_ids, settings)
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1).to(pair.target.device)
    if ids.shape[1] == 0:
        raise HarnessError("empty prompt: give at least one token")
    prompt_len = int(ids.shape[1])
    config = generation_config(settings, pair)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "generation_config": config}
    if settings.stop_strings:
        # As a criteria list, not config.stop_strings: the config is copied into the draft's own
        # generate call, which has no tokenizer and would refuse it.
        kwargs["stopping_criteria"] = StoppingCriteriaList(
            [StopInNewText(pair.tokenizer, settings.stop_strings, prompt_len)]
        )
    watched = {"target": pair.target}
    if settings.mode == "assisted":
        split_min_new_tokens(config, kwargs, pair, prompt_len)
        pin_assistant(pair.draft, settings)
        kwargs["assistant_model"] = pair.draft
        watched["draft"] = pair.draft
    torch.manual_seed(settings.seed)

    wait = synchronized(*watched.values())
    with torch.inference_mode(), threshold_as_set(), record_forwards(watched) as log:
        start = time.perf_counter()
        out = pair.target.generate(ids, **kwargs)
        if wait is not None:  # the last token's work, queued on an asynchronous device
            wait()
        end = time.perf_counter()

    output = out[0, prompt_len:].tolist()
    drafted, accepted = count_acceptance(log.of("target"), prompt_len, ids[0].tolist() + output)
    return Measurement.of_log(log, start, end, prompt_len, output, drafted, accepted)
