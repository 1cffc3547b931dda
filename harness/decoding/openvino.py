"""OpenVINO GenAI's own decoding (``--engine openvino``): the runtime of Intel's AI PCs, target and
draft each on a device of their own (``LLMPipeline(target, device, draft_model=draft_model(draft,
"CPU"))``), as the seeds run the target on an NPU and the draft on the CPU.

The pair's GGUF files are converted once to OpenVINO IR by OpenVINO GenAI's own reader
(``harness.weights.openvino_ir``). Plain decoding is the target's pipeline; speculative decoding the
pipeline with the draft model and K = ``num_assistant_tokens`` in its ``GenerationConfig``. Its
prompt-lookup pipeline is refused: it books no drafted or accepted tokens.
Prompts go in and outputs come out as token ids. A row's prefill, time per token, drafted and
accepted are the library's own books (``perf_metrics``: TTFT, generate duration; speculative:
``extended_perf_metrics``' draft tokens and accepted tokens). Its raw books time each step of each
model and count the tokens a step emitted: a plain step is one target forward, a speculative round
one target verify forward (after the prompt's) and the draft's forwards apart, so c, v and alpha
(a round that emitted fewer than K+1 tokens ended on a rejection) come from its own clock, and the
speedup gate adjusts for a host's forward costs as for the other engines.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from harness.base.errors import HarnessError
from harness.decoding.base import Engine
from harness.settings.setup import GenerationSettings
from harness.theory import analysis, timing

OPENVINO = "openvino"  # the engine's name

# Device names of the suite (``--target_device``/``--draft_device``) -> OpenVINO's.
DEVICES = {"cpu": "CPU", "npu": "NPU", "gpu": "GPU"}
MAX_K = 16
# How many of the target's top tokens a flip is judged among (beam search over one token lists
# them with their log-probabilities); a token outside them is at most as likely as the last.
JUDGE_BEAMS = 8


def ov_device(device: str) -> str:
    """OpenVINO's name for the suite's device, checked against the devices OpenVINO finds here."""
    import openvino

    name = DEVICES.get(device.split(":")[0].lower())
    if name is None:
        raise HarnessError(f"--engine {OPENVINO} runs on {', '.join(DEVICES)}, not {device!r}")
    have = openvino.Core().available_devices
    if not any(d == name or d.startswith(name + ".") for d in have):
        raise HarnessError(
            f"OpenVINO finds no {name} here (devices: {', '.join(have) or 'none'}); run that model on one "
            "of those (--target_device / --draft_device cpu), or install the device's driver"
        )
    return name


def check_settings(settings: Any) -> None:
    if settings.mode == "prompt_lookup":
        # Its prompt-lookup pipeline decodes, but books no drafted or accepted tokens (no
        # speculative statistics; only tokens per step): the suite could not show its proposals.
        raise HarnessError(
            f"--engine {OPENVINO} runs plain and draft-model speculative decoding here; its prompt lookup "
            "reports no drafted or accepted tokens: drop --prompt_lookup, or run it with --engine llama.cpp "
            "or transformers"
        )
    if settings.mode != "plain" and not 1 <= settings.proposal_k <= MAX_K:
        raise HarnessError(
            f"K = {settings.proposal_k}: the suite runs OpenVINO's speculative decoding with 1 to {MAX_K}"
        )


def config_of(settings: Any, eos: int | None) -> Any:
    """OpenVINO GenAI's ``GenerationConfig`` for the suite's settings."""
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = settings.max_new_tokens
    config.min_new_tokens = settings.min_new_tokens or 0
    config.ignore_eos = bool(settings.ignore_eos)
    if settings.eos_token_id is not None or eos is not None:
        config.eos_token_id = settings.eos_token_id if settings.eos_token_id is not None else eos
    config.do_sample = bool(settings.do_sample)
    if settings.do_sample:
        config.temperature = settings.temperature if settings.temperature is not None else 1.0
        config.top_p = settings.top_p if settings.top_p is not None else 1.0
        config.top_k = settings.top_k or 0
        if settings.seed is not None:
            config.rng_seed = settings.seed
    if settings.stop_strings:
        # Asked to keep the token that completes a stop string, as transformers' criterion does;
        # the library still leaves it out where that token is only the stop string or holds more
        # (measured: a "\n\n" token for "\n"). Either way it stops where the string appears.
        config.stop_strings = set(settings.stop_strings)
        config.include_stop_str_in_output = True
    if settings.mode == "assisted":
        config.num_assistant_tokens = settings.proposal_k
    return config


def model_steps(metrics: Any) -> list[tuple[float, int]]:
    """(ms, tokens emitted) of each step a model's raw books time (``raw_metrics.m_durations``, in
    microseconds, beside ``m_batch_sizes``)."""
    raw = metrics.raw_metrics
    durations = [float(d) / 1000.0 for d in raw.m_durations]
    return list(zip(durations, [int(b) for b in raw.m_batch_sizes][: len(durations)], strict=False))


def rejected_rounds(rounds: Sequence[int], k: int, budget_reached: bool) -> int:
    """Rounds (tokens each emitted) that ended on a rejected draft: fewer than K+1 tokens. A last
    round the token budget cut short is not judged (it may have been cut, not rejected)."""
    judged = list(rounds[:-1]) if budget_reached and rounds and rounds[-1] <= k else list(rounds)
    return sum(1 for n in judged if n <= k)


def measurement(
    prompt_ids: Sequence[int], result: Any, wall_s: float, mode: str, k: int = 0, budget: int = 0
) -> Any:
    """A ``timing.Measurement`` from a pipeline's result: its own books for prefill, time per token,
    drafted, accepted and each model's steps; the client's clock for the whole call."""
    from harness.theory.timing import Measurement

    tokens = [int(t) for t in result.tokens[0]]
    books = result.perf_metrics
    ttft = float(books.get_ttft().mean)
    generate_ms = float(books.get_generate_duration().mean)
    per_token = timing.per_token_ms(generate_ms - ttft, len(tokens))
    drafted = accepted = 0
    draft_ms = 0.0
    rejected: int | None = None
    judged: list[list[bool]] | None = None
    extended = getattr(result, "extended_perf_metrics", None)
    if mode == "plain":
        # Each timed step after the prompt's is one target forward that emitted one token.
        steps = model_steps(books)
        forwards = len(tokens)
        costs = {"target": (sum(ms for ms, _ in steps), len(steps))}
    else:
        if extended is None or not hasattr(extended, "get_num_accepted_tokens"):
            raise HarnessError(f"OpenVINO GenAI reported no speculative statistics for a {mode} decode")
        drafted, accepted = int(extended.get_num_draft_tokens()), int(extended.get_num_accepted_tokens())
        draft_ms = float(extended.draft_model_metrics.get_inference_duration().mean)
        # The first step of each model is the prompt's; the rest are verify rounds and draft forwards.
        verify = model_steps(extended.main_model_metrics)[1:]
        drafts = model_steps(extended.draft_model_metrics)[1:]
        forwards = 1 + len(verify)
        rejected = rejected_rounds([n for _, n in verify], k, len(tokens) >= budget > 0)
        judged = analysis.chain_rounds([n for _, n in verify], k, len(tokens) >= budget > 0)
        costs = {
            "target": (sum(ms for ms, _ in verify), len(verify)),
            "draft": (sum(ms for ms, _ in drafts), len(drafts)),
        }
    return Measurement(
        prompt_tokens=len(prompt_ids),
        output_ids=tokens,
        total_s=wall_s,
        prefill_ms=ttft,
        target_prefill_ms=ttft,
        time_per_token_ms=per_token,
        tokens_per_s=timing.rate(per_token),
        target_forwards=forwards,
        draft_forwards=costs.get("draft", (0.0, 0))[1],
        target_ms=generate_ms - draft_ms,
        draft_ms=draft_ms,
        other_ms=max(0.0, wall_s * 1000 - generate_ms),
        drafted=drafted,
        accepted=accepted,
        step_costs=costs,
        rejected_steps=rejected,
        judged_steps=judged,
    )


def library_error(exc: BaseException) -> str:
    """The first line of an error OpenVINO GenAI raised (a C++ check's condition), without the path
    of the machine that built the library."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r" at /\S+", "", first)[:300]


def beam_gap(tokens: Sequence[Sequence[int]], scores: Sequence[float], plain: int, other: int) -> float:
    """The plain token's log-probability lead over the other one among the listed top tokens (one
    token each, with its log-probability); a token not listed is at most as likely as the last."""
    by_id = {int(seq[0]): float(s) for seq, s in zip(tokens, scores, strict=True) if seq}
    floor = min(by_id.values()) if by_id else 0.0
    return by_id.get(plain, floor) - by_id.get(other, floor)


class Pipelines:
    """The pipelines of one pair, each made on first use: plain and speculative."""

    def __init__(self, target: Path, draft: Path | None, devices: tuple[str, str], threads: int) -> None:
        self.target, self.draft, self.devices, self.threads = target, draft, devices, threads
        self._made: dict[str, Any] = {}

    def get(self, mode: str) -> Any:
        import openvino_genai

        if mode not in self._made:
            options: dict[str, Any] = {"INFERENCE_NUM_THREADS": self.threads}
            if mode == "assisted":
                if self.draft is None:
                    raise HarnessError("the pair was loaded without its draft; load it with one to assist")
                options["draft_model"] = openvino_genai.draft_model(
                    str(self.draft), self.devices[1], INFERENCE_NUM_THREADS=self.threads
                )
            self._made[mode] = openvino_genai.LLMPipeline(str(self.target), self.devices[0], **options)
        return self._made[mode]

    def close(self) -> None:
        self._made.clear()


class OpenVinoEngine(Engine):
    """OpenVINO GenAI's ``LLMPipeline`` over the pair's GGUF files converted to IR: plain, and
    speculative with the draft model."""

    name: ClassVar[str] = OPENVINO
    backend: ClassVar[str | None] = OPENVINO
    precision: ClassVar[str | None] = "gguf"
    modes: ClassVar[tuple[str, ...]] = ("plain", "assisted")
    own_devices: ClassVar[bool] = True
    version_names: ClassVar[tuple[str, ...]] = ("openvino-genai",)
    runtime_module: ClassVar[str | None] = "openvino_genai"
    extra: ClassVar[str | None] = "openvino"
    runs: ClassVar[str] = "GGUF files (a pair's, or two bare .gguf files), converted to OpenVINO IR once"
    # Its judge (beam search over one token) reads the prefix as one prompt, not plain decoding's steps.
    exact_judge: ClassVar[bool] = False

    def __init__(self, pipelines: Pipelines, eos: int | None) -> None:
        from harness.weights.openvino_ir import openvino_version

        self.pipelines = pipelines
        self.eos = eos
        # Which OpenVINO GenAI decoded: every row this engine writes carries it beside the libraries'.
        self.versions = {"openvino-genai": openvino_version()}

    @classmethod
    def unfit(cls, spec: Any) -> str | None:
        from harness.pairs import models

        return models.missing_gguf(spec)

    @classmethod
    def prepare(cls, spec: Any, weights_dir: str | None) -> None:

        run = cls.resolve(spec)
        cls.ir_folders(spec, cls.gguf_files(spec, run, weights_dir))

    @classmethod
    def check(cls, spec: Any, run: Any) -> None:
        """Settings the pipelines take, devices OpenVINO has, a pair with GGUF files."""
        cls._checked(spec, run, None)

    @classmethod
    def _checked(
        cls, spec: Any, run: Any, weights_dir: str | None
    ) -> tuple[dict[str, Path], tuple[str, str]]:
        """What ``check`` checks, kept for ``load``: the pair's GGUF files and OpenVINO's devices."""
        from harness.weights.openvino_ir import openvino_version

        openvino_version()
        check_settings(run.decoding)
        devices = (ov_device(run.target.device), ov_device(run.draft.device) if run.draft else "CPU")
        return cls.gguf_files(spec, run, weights_dir), devices

    @staticmethod
    def gguf_files(spec: Any, run: Any, weights_dir: str | None) -> dict[str, Path]:
        from harness.pairs import models

        return models.pair_gguf_files(spec, run.draft is not None, weights_dir, OPENVINO)

    @staticmethod
    def ir_folders(spec: Any, ggufs: dict[str, Path], *, verify: bool = False) -> dict[str, Path]:
        """Each role's IR folder, converted from its GGUF file once (``openvino_ir``)."""
        from harness.weights import openvino_ir

        return {
            role: openvino_ir.ir_folder(getattr(spec, role).name, p, verify=verify)
            for role, p in ggufs.items()
        }

    @classmethod
    def load(cls, spec: Any, run: Any, *, weights_dir: str | None = None, verify: bool = False) -> Any:
        """The pair as OpenVINO GenAI runs it (checked first): its IR folders (converted once), the
        suite's tokenizer for the prompts."""
        import torch

        from harness.pairs import models
        from harness.weights import packaged

        ggufs, devices = cls._checked(spec, run, weights_dir)
        if verify:
            for model in (spec.target, spec.draft)[: len(ggufs)]:
                if not model.is_gguf_file:  # a file given as it is has no record to check against
                    models.resolve_model(model, weights_dir, verify=True)
        irs = cls.ir_folders(spec, ggufs, verify=verify)
        tokenizer = models.tokenizer_of(spec.target, weights_dir)
        pipelines = Pipelines(irs["target"], irs.get("draft"), devices, torch.get_num_threads())
        return models.LoadedPair.of_engine(
            spec,
            run,
            tokenizer,
            {role: packaged.portable(p) for role, p in ggufs.items()},
            cls(pipelines, tokenizer.eos_token_id),
        )

    def _generate(self, mode: str, ids: Sequence[int], config: Any) -> Any:
        import numpy as np
        import openvino

        tensor = openvino.Tensor(np.asarray([list(ids)], dtype=np.int64))
        try:
            return self.pipelines.get(mode).generate(tensor, config)
        except RuntimeError as exc:
            raise HarnessError(
                f"OpenVINO GenAI's {mode} pipeline failed inside the library: {library_error(exc)}; rows "
                "written so far are kept, and a rerun resumes after them"
            ) from None

    def decode(self, _pair: Any, ids: list[int], settings: Any) -> Any:
        check_settings(settings)
        if not ids:
            raise HarnessError("empty prompt: give at least one token")
        config = config_of(settings, self.eos)
        start = time.perf_counter()
        result = self._generate(settings.mode, ids, config)
        return measurement(
            ids, result, time.perf_counter() - start, settings.mode, settings.proposal_k,
            settings.max_new_tokens,
        )  # fmt: skip

    def gap(self, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> float | None:
        """The plain pipeline's own judgement of the first place ``other`` leaves ``plain``: its top
        tokens there (beam search over one token) with their log-probabilities."""
        i = analysis.first_differing_token(plain, other)
        if i is None:
            return None
        config = config_of(GenerationSettings(max_new_tokens=1, ignore_eos=True), None)
        config.num_beams = config.num_return_sequences = JUDGE_BEAMS
        result = self._generate("plain", [*prompt_ids, *plain[:i]], config)
        return beam_gap(result.tokens, result.scores, plain[i], other[i])

    def close(self) -> None:
        self.pipelines.close()
