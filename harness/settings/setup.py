"""What a run is: one value holding every setting that decides what is decoded, and how fast.

A ``RunSetup`` is a pair name, a ``Target`` (precision, kernels, backend and provider, device), a
``Draft`` (precision, kernels, vocabulary, device; None when no draft model runs) and the decoding
settings (``GenerationSettings``: mode, K and its schedule, sampling, budget). ``resolve`` fills one
from a pair's registered defaults; it is the only place that does.

``FIELDS`` lists, once, the settings that identify a result: the column a row carries, the CLI flag
that sets it and which side of the run it belongs to. Every identity derives from it: a result's
resume key (``row_key`` of a row, ``result_key`` of a run before it runs), the plain row an assisted
row is paired with (``pairing_key``), run ids (``run_id``), the columns ``runner.make_row`` writes
(``columns``).

This module imports no model code, so anything (the registry, the loaders, the experiments, the CLI)
can build and compare setups before a weight is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.base.backends import DEFAULT_PROVIDER, EXPORT_LABEL, OrtSettings
from harness.base.errors import HarnessError
from harness.theory import trees

MODES = ("plain", "assisted", "prompt_lookup")
# User-facing schedule names -> what transformers calls them. "heuristic" maps to transformers'
# "heuristic_transient" because the plain "heuristic" keeps the adapted K across calls, so the
# second prompt of a run would not start from the K the user set.
SCHEDULES = {"constant": "constant", "heuristic": "heuristic_transient", "dynamic": "constant"}
DEFAULT_CONFIDENCE_THRESHOLD = 0.4  # transformers' own default for its dynamic speculation


@dataclass(frozen=True)
class GenerationSettings:
    """How one prompt is decoded: the mode, the draft's K and schedule, sampling and the budget."""

    mode: str = "plain"
    max_new_tokens: int = 30
    min_new_tokens: int = 0
    num_assistant_tokens: int = 5
    assistant_schedule: str = "constant"
    assistant_confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD  # used by "dynamic" only
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int = 0
    eos_token_id: int | None = None  # None: the tokenizer's
    ignore_eos: bool = False  # decode the whole budget even past an EOS
    # Stop once the new text holds one of these (HumanEval's end-of-function markers). Assisted
    # decoding checks after each verify step, so it may run on by up to K tokens past the step
    # plain decoding stops at; callers that compare outputs cut both at the first stop string.
    stop_strings: tuple[str, ...] = ()
    # A static token tree the draft proposes each round instead of a chain of K (rank paths, as
    # ``theory.trees.Tree.parse`` reads them): greedy, on the batch-invariant kernels, in the
    # harness's own loop (``harness.decoding.trees``). "": a chain, in transformers' loop.
    draft_tree: str = ""
    # Proposals from the context beside the draft model (``harness.decoding.context``): where the
    # prompt or the output so far holds a continuation of the latest tokens, a round proposes up to
    # this many of them (adapted to how such proposals fare), else the draft model's chain or tree.
    # Greedy, on the batch-invariant kernels, in the harness's own loop. 0: off; None: the pair's
    # registered value where it applies (``resolve`` settles it: ``registered_context``), else off.
    context_draft: int | None = None
    # Synthetic acceptance: each proposed token accepted with this probability (a seeded draw, not
    # the target's verdict), so a round's cost is measured at a chosen acceptance apart from the
    # draft's quality (llama.cpp's and SGLang's simulated acceptance). The output is not the
    # target's: rows carry the setting and no output is compared. None: off.
    synthetic_acceptance: float | None = None

    def validate(self) -> GenerationSettings:
        def bad(what: str) -> HarnessError:
            return HarnessError(f"invalid generation setting: {what}")

        if self.mode not in MODES:
            raise bad(f"mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.max_new_tokens < 1:
            raise bad(f"--max_new_tokens must be at least 1 (got {self.max_new_tokens})")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise bad(f"min_new_tokens must be between 0 and max_new_tokens (got {self.min_new_tokens})")
        if self.num_assistant_tokens < 1:
            raise bad(f"--num_assistant_tokens must be at least 1 (got {self.num_assistant_tokens})")
        if self.assistant_schedule not in SCHEDULES:
            raise bad(
                f"--assistant_schedule {self.assistant_schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
        if not 0.0 < self.assistant_confidence_threshold < 1.0:
            raise bad(f"confidence threshold must be in (0, 1) (got {self.assistant_confidence_threshold})")
        if self.prompt_lookup_num_tokens < 1:
            raise bad(f"--prompt_lookup must be at least 1 (got {self.prompt_lookup_num_tokens})")
        if self.do_sample and not 0 < self.temperature < math.inf:
            # inf would sample uniformly and be stored as Infinity, which is not JSON.
            raise bad(f"--temperature must be a finite number > 0 when sampling (got {self.temperature})")
        # Checked whether or not sampling is on: a value out of range is a typo either way.
        if not 0.0 < self.top_p <= 1.0:
            raise bad(f"--top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise bad(f"--top_k must be >= 0, 0 meaning off (got {self.top_k})")
        if self.draft_tree:
            trees.Tree.parse(self.draft_tree)
            if self.do_sample:
                raise bad("--draft_tree decodes greedily: drop --do_sample, or the tree")
        if self.context_draft is not None and not 0 <= self.context_draft <= 64:
            raise bad(
                f"--context_draft must be between 0 (off) and 64 tokens a round (got {self.context_draft})"
            )
        if self.context_draft and self.do_sample:
            raise bad("--context_draft decodes greedily: drop --do_sample, or --context_draft")
        if self.synthetic_acceptance is not None:
            if not 0.0 <= self.synthetic_acceptance <= 1.0:
                raise bad(
                    f"--synthetic_acceptance is a probability in [0, 1] (got {self.synthetic_acceptance})"
                )
            if self.do_sample or self.mode == "prompt_lookup":
                raise bad(
                    "--synthetic_acceptance draws the verdict on a draft model's proposals under greedy "
                    "decoding: use it with --assisted_generation and without --do_sample"
                )
        return self

    @property
    def proposal_k(self) -> int:
        """How many tokens a round may propose: K for a draft model, N for prompt lookup."""
        return self.prompt_lookup_num_tokens if self.mode == "prompt_lookup" else self.num_assistant_tokens

    @property
    def chain_k(self) -> int | None:
        """K of the chain a round proposes; None for a token tree (it has no K)."""
        return None if self.draft_tree else self.proposal_k

    @property
    def confidence_threshold_in_effect(self) -> float:
        return self.assistant_confidence_threshold if self.assistant_schedule == "dynamic" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """How the target runs. ``precision`` is the label rows carry: a harness precision on torch, the
    export's settings (``backends.OrtSettings.label``, e.g. ``ort-int4-b32-aint8``) on ONNX Runtime."""

    precision: str
    kernels: str = "stock"
    backend: str = "torch"
    provider: str | None = None  # ONNX Runtime's execution provider; None on torch
    device: str = "cpu"
    engine: str = "transformers"  # what runs the decoding loop (``engines.REGISTRY``)
    endpoint: str | None = None  # a deployment's URL, for an engine that decodes over one: its plain decoding


@dataclass(frozen=True)
class Draft:
    """How the draft model runs (its output is only ever a proposal: none of this changes tokens)."""

    precision: str
    kernels: str = "stock"
    vocab: int | None = None  # the draft scores only this many leading token ids (+ specials)
    device: str = "cpu"
    endpoint: str | None = (
        None  # a deployment's URL, for an engine that decodes over one: its speculative one
    )


def invariant_pair(target: Target, draft: Draft | None) -> bool:
    """Target and draft both on the batch-invariant kernels: where every verified row is computed
    on its own, which a token tree's exactness needs."""
    return target.kernels == "invariant" and draft is not None and draft.kernels == "invariant"


@dataclass(frozen=True)
class RunSetup:
    pair: str
    target: Target
    draft: Draft | None  # None: no draft model (plain decoding or prompt lookup)
    decoding: GenerationSettings

    @property
    def uses_draft(self) -> bool:
        return self.decoding.mode == "assisted" and self.draft is not None

    def columns(self) -> dict[str, Any]:
        """The identity as rows carry it, one column per field of ``FIELDS``."""
        return {f.column: f.get(self) for f in FIELDS}


@dataclass(frozen=True)
class Field:
    """One run setting as everything downstream sees it: a row's column, a CLI flag, a reproduce
    command's word, part of a resume key, a run id and (``identity``) a baseline's case."""

    column: str  # the row column (and ``Row`` attribute) that carries it
    flag: str | None  # the CLI flag that sets it (None: set by the task or mode)
    side: str  # "target", "draft", "sampling" or "budget"
    get: Callable[[RunSetup], Any]
    # The value of a run that does not set it: a reproduce command and a case id leave it out. A
    # setting of ``GenerationSettings`` takes its default from there, its CLI flag its type.
    default: Any = None
    # What a row written before the column existed reads.
    missing: Any = None
    # Part of a baseline's case (``baselines.CaseKey``): two runs that differ in it are two cases.
    # Off for what a benchmark case fixes itself. On for the devices: a GPU host runs a CPU target too,
    # under the same platform name, and the two are different cases.
    identity: bool = True
    # How ``--sweep`` spells it (its short key first; the column's own name is taken too).
    sweep: tuple[str, ...] = ()


def _draft(get: Callable[[Draft], Any]) -> Callable[[RunSetup], Any]:
    # A draft setting means something only when a draft model assists; elsewhere it is None, so a
    # plain row never differs from another plain row by a draft it did not use.
    return lambda s: get(s.draft) if s.uses_draft else None  # type: ignore[arg-type]


def _chained(get: Callable[[GenerationSettings], Any]) -> Callable[[RunSetup], Any]:
    # K and the schedule shape a chain; a token tree (``draft_tree``) has neither.
    return lambda s: get(s.decoding) if s.uses_draft and not s.decoding.draft_tree else None


def _sampled(get: Callable[[GenerationSettings], Any]) -> Callable[[RunSetup], Any]:
    return lambda s: get(s.decoding) if s.decoding.do_sample else None


FIELDS: tuple[Field, ...] = (
    Field("model", "--model_name", "target", lambda s: s.pair),
    Field(
        "target_precision",
        "--target_precision",
        "target",
        lambda s: s.target.precision,
        sweep=("t", "target"),
    ),
    Field(
        "target_kernels",
        "--target_kernels",
        "target",
        lambda s: s.target.kernels,
        "stock",
        "stock",
        sweep=("kernels",),
    ),
    Field("target_backend", "--target_backend", "target", lambda s: s.target.backend, "torch", "torch"),
    Field("execution_provider", "--execution_provider", "target", lambda s: s.target.provider),
    Field("target_device", "--target_device", "target", lambda s: s.target.device, "cpu"),
    Field(
        "engine",
        "--engine",
        "target",
        lambda s: s.target.engine,
        "transformers",
        "transformers",
        sweep=("engine",),
    ),
    # Where a served run's requests went: part of a row's identity, not of a baseline's case.
    Field("endpoint", "--endpoint", "target", lambda s: s.target.endpoint, identity=False),
    Field("mode", None, "draft", lambda s: s.decoding.mode, identity=False, sweep=("mode",)),
    Field(
        "draft_precision", "--draft_precision", "draft", _draft(lambda d: d.precision), sweep=("d", "draft")
    ),
    Field("draft_kernels", "--draft_kernels", "draft", _draft(lambda d: d.kernels), "stock", sweep=("dk",)),
    Field("draft_vocab", "--draft_vocab", "draft", _draft(lambda d: d.vocab), sweep=("dv",)),
    Field("draft_device", "--draft_device", "draft", _draft(lambda d: d.device), "cpu"),
    Field(
        "speculative_endpoint",
        "--speculative-endpoint",
        "draft",
        _draft(lambda d: d.endpoint),
        identity=False,
    ),
    Field(
        "num_assistant_tokens",
        "--num_assistant_tokens",
        "draft",
        _chained(lambda d: d.num_assistant_tokens),
        sweep=("k",),
    ),
    Field(
        "assistant_schedule",
        "--assistant_schedule",
        "draft",
        _chained(lambda d: d.assistant_schedule),
        sweep=("sched", "schedule"),
    ),
    # None unless the schedule reads it, as temperature when greedy: a value here would be printed
    # in a row's reproduce command, and the CLI rejects it for other schedules.
    Field(
        "assistant_confidence_threshold",
        "--assistant_confidence_threshold",
        "draft",
        _chained(lambda d: d.assistant_confidence_threshold if d.assistant_schedule == "dynamic" else None),
        identity=False,
    ),
    Field(
        "prompt_lookup_num_tokens",
        "--prompt_lookup",
        "draft",
        lambda s: s.decoding.prompt_lookup_num_tokens if s.decoding.mode == "prompt_lookup" else None,
        identity=False,
    ),
    Field(
        "draft_tree",
        "--draft_tree",
        "draft",
        lambda s: (s.decoding.draft_tree or None) if s.uses_draft else None,
        sweep=("tree",),
    ),
    Field(
        "context_draft",
        "--context_draft",
        "draft",
        lambda s: (s.decoding.context_draft or None) if s.uses_draft else None,
        sweep=("ctx",),
    ),
    Field(
        "synthetic_acceptance",
        "--synthetic_acceptance",
        "draft",
        lambda s: s.decoding.synthetic_acceptance if s.uses_draft else None,
        sweep=("synth",),
    ),
    Field("do_sample", "--do_sample", "sampling", lambda s: s.decoding.do_sample),
    Field("temperature", "--temperature", "sampling", _sampled(lambda d: d.temperature)),
    Field("top_p", "--top_p", "sampling", _sampled(lambda d: d.top_p)),
    Field("top_k", "--top_k", "sampling", _sampled(lambda d: d.top_k)),
    Field("seed", "--seed", "sampling", lambda s: s.decoding.seed, identity=False),
    Field("max_new_tokens", "--max_new_tokens", "budget", lambda s: s.decoding.max_new_tokens),
    Field(
        "min_new_tokens", "--min_new_tokens", "budget", lambda s: s.decoding.min_new_tokens, 0, identity=False
    ),
)


def column_names() -> tuple[str, ...]:
    """Every setting's row column, in ``FIELDS``' order."""
    return tuple(f.column for f in FIELDS)


def _values(row: Any, names: Sequence[str]) -> tuple[Any, ...]:
    # Rows are ``Row`` objects or their dicts (a JSON line); a column an old row lacks reads None.
    if isinstance(row, Mapping):
        return tuple(row.get(n) for n in names)
    return tuple(getattr(row, n, None) for n in names)


# Which run and prompt a result belongs to. The prompt's content is part of it: a prompt edited
# between two runs of one command is another prompt, and its old row must not be resumed in its
# place. Its digest also fixes its length, so the token count is not needed to resume; it stays in
# pairing, where rows written before the digest existed are paired by it.
_WHERE = ("run_id", "task", "example", "prompt_sha")


def prompt_digest(content: Sequence[int] | str) -> str:
    """A prompt's identity: a digest of its token ids (or, before a tokenizer is loaded, its text)."""
    blob = json.dumps(content if isinstance(content, str) else [int(t) for t in content])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def row_key(row: Any) -> tuple[Any, ...]:
    """A finished row's identity within its run: the same prompt decoded with the same settings is
    the same result (a rerun skips it). ``result_key`` gives it before the run, from its setup."""
    return _values(row, (*_WHERE, *column_names()))


def result_key(run: RunSetup, *, run_id: str, task: str, example: int, prompt_sha: str) -> tuple[Any, ...]:
    """The ``row_key`` a row of ``run`` on this prompt will have: every measurement loop looks a
    finished result up by it before decoding (or before loading anything, as the sweep does)."""
    where = {"run_id": run_id, "task": task, "example": example, "prompt_sha": prompt_sha}
    return _values({**where, **run.columns()}, (*_WHERE, *column_names()))


def pairing_key(row: Any) -> tuple[Any, ...]:
    """What a plain row must share with an assisted row to be its baseline: the run, the prompt, the
    target's setup, sampling and budget (never across precisions, devices or sampling settings)."""
    sides = ("target", "sampling", "budget")
    return _values(row, (*_WHERE, "prompt_tokens", *(f.column for f in FIELDS if f.side in sides)))


def run_id(
    columns: Mapping[str, Any], *, task: str, platform: str, host: str, code: str, extra: Sequence[Any] = ()
) -> str:
    """Same configuration, same host and code, same id: resumed rows belong to the run they continue.

    ``columns`` is a setup's identity (``RunSetup.columns``, or the target side of it for a run that
    measures several arms on one target); ``extra`` holds what else the caller's run depends on (its
    modes, thread count, prompt set)."""
    blob = json.dumps(
        [
            {c: columns.get(c) for c in column_names() if c in columns},
            task,
            platform,
            host,
            code,
            list(extra),
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- registered defaults


def resolve(
    spec: Any,
    *,
    target_precision: str | None = None,
    target_kernels: str | None = None,
    target_backend: str | None = None,
    provider: str | None = None,
    ort_block_size: int | None = None,
    ort_accuracy_level: int | None = None,
    target_device: str = "cpu",
    draft_precision: str | None = None,
    draft_kernels: str | None = None,
    draft_vocab: int | None = None,
    draft_device: str = "cpu",
    with_draft: bool = True,
    decoding: GenerationSettings | None = None,
    num_assistant_tokens: int | None = None,
    assistant_schedule: str | None = None,
) -> RunSetup:
    """A run of pair ``spec`` (a ``models.PairSpec``) in the harness's own loop (transformers'
    ``generate``, or its token-tree loop), with every setting left as None taken from the pair's
    registration: the one place registered defaults are applied. Another engine's run is resolved by
    its class (``harness.decoding.engines.resolve``), which ends in ``settle`` as this does.

    ``draft_vocab`` 0 means the whole vocabulary (None: the registered restriction). On ONNX Runtime
    the target's precision is the export's label, and its kernels are the runtime's own ("stock").
    """
    if target_backend == "onnxruntime":
        if target_kernels not in (None, "stock"):
            raise HarnessError(
                "--target_kernels applies to the torch target only; ONNX Runtime runs its own kernels"
            )
        ort = OrtSettings(
            target_precision or "int4",
            OrtSettings.block_size if ort_block_size is None else ort_block_size,
            OrtSettings.accuracy_level if ort_accuracy_level is None else ort_accuracy_level,
            provider or DEFAULT_PROVIDER,
        ).validate()
        target = Target(ort.label, "stock", "onnxruntime", ort.provider, target_device)
    elif target_backend not in (None, "torch"):
        raise HarnessError(
            f"the harness's own loop runs a torch or onnxruntime target, not {target_backend}: pass the "
            "engine that runs it (--engine)"
        )
    else:
        target = Target(
            target_precision or spec.target_setup.precision,
            target_kernels or spec.target_setup.kernels,
            device=target_device,
        )
    draft = None
    if with_draft:
        registered = spec.draft_setup
        draft = Draft(
            draft_precision or registered.precision,
            draft_kernels or registered.kernels,
            registered.vocab if draft_vocab is None else (draft_vocab or None),
            draft_device,
        )
    schedule = assistant_schedule or spec.decoding.assistant_schedule
    return settle(spec, target, draft, decoding, num_assistant_tokens, schedule)


def settle(
    spec: Any,
    target: Target,
    draft: Draft | None,
    decoding: GenerationSettings | None,
    num_assistant_tokens: int | None,
    assistant_schedule: str,
) -> RunSetup:
    """The run of ``spec`` with its target and draft resolved: K left as None is the pair's registered
    K, proposals from the context left as None the pair's registered ones where they apply."""
    decoding = replace(
        decoding or GenerationSettings(),
        num_assistant_tokens=spec.decoding.num_assistant_tokens
        if num_assistant_tokens is None
        else num_assistant_tokens,
        assistant_schedule=assistant_schedule,
    )
    if decoding.context_draft is None:
        decoding = replace(decoding, context_draft=registered_context(spec.decoding, target, draft, decoding))
    return RunSetup(spec.name, target, draft, decoding)


def registered_context(
    registered: GenerationSettings, target: Target, draft: Draft | None, decoding: GenerationSettings
) -> int:
    """The pair's registered proposals from the context (``registered.context_draft``) for a run
    where they apply, else 0: greedy chains of a draft model in the harness's own loop, target and
    draft on the batch-invariant kernels (a token tree, a synthetic verdict, sampling, prompt lookup
    or another engine's loop keep what they measure without them)."""
    applies = (
        decoding.mode == "assisted"
        and not decoding.do_sample
        and not decoding.draft_tree
        and decoding.synthetic_acceptance is None
        and target.engine == "transformers"
        and target.backend == "torch"
        and invariant_pair(target, draft)
    )
    return (registered.context_draft or 0) if applies else 0


def check_url(url: str) -> str:
    """A deployment's base URL as rows carry it: http(s), a host, no credentials (an API key comes
    from the environment, never from a URL that rows and logs would print)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HarnessError(f"endpoint {url!r}: give a base URL such as http://127.0.0.1:8080")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port's range only when it is read
    except ValueError:
        raise HarnessError(
            f"endpoint {url!r}: its port is not a number from 1 to 65535; give the port the deployment "
            "listens on, such as http://127.0.0.1:8080"
        ) from None
    if parts.username or parts.password:
        raise HarnessError(
            "endpoint URLs must not carry credentials (rows and logs print them): put the API key in "
            "ASSISTED_GENERATION_API_KEY"
        )
    return url.rstrip("/")


# ``resolve``'s settings for the stock fp32 pair, whatever a pair registers: no quantization, no
# hand-written kernel, the whole draft vocabulary, K=5 constant (the reference configuration).
STOCK_FP32: dict[str, Any] = dict(
    target_precision="fp32",
    target_kernels="stock",
    draft_precision="fp32",
    draft_kernels="stock",
    draft_vocab=0,
    num_assistant_tokens=5,
    assistant_schedule="constant",
)


def defaults(spec: Any) -> dict[str, Any]:
    """The columns a run without flags has (``resolve`` with nothing given), read through ``FIELDS``:
    a reproduce command leaves out every flag whose value equals these."""
    run = resolve(spec)
    # Read as an assisted, sampled run of those settings would be, so the draft's and sampling's
    # settings have their values (a plain greedy run leaves them None).
    shown = replace(run, decoding=replace(run.decoding, mode="assisted", do_sample=True))
    return {f.column: f.get(shown) for f in FIELDS if f.flag is not None}


# --------------------------------------------------------------------------- the reproduce command

PROGRAM = ("python", "assisted_generation.py")


def _number(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _ort_target(get: Callable[[str], Any], _d: Mapping[str, Any]) -> list[str]:
    if get("target_precision") == EXPORT_LABEL:
        return []  # an export given by its folder (--model_name_or_path): run as it was made
    ort = OrtSettings.from_label(get("target_precision"), get("execution_provider") or DEFAULT_PROVIDER)
    args = ["--target_backend", "onnxruntime", "--target_precision", ort.precision]
    if ort.provider != DEFAULT_PROVIDER:
        args += ["--execution_provider", ort.provider]
    if ort.precision == "int4":
        args += ["--ort_block_size", str(ort.block_size), "--ort_accuracy_level", str(ort.accuracy_level)]
    return args


def _spell(field: Field, get: Callable[[str], Any], d: Mapping[str, Any]) -> list[str]:
    column, flag = field.column, str(field.flag)
    value = get(column)
    ort = get("target_backend") == "onnxruntime"
    if get("engine") not in (None, "transformers") and (
        column.startswith(("draft_", "assistant_")) or column == "target_kernels"
    ):
        # An engine with its own loop runs its own files and drafts a constant K: no flag sets these.
        return []
    if column == "target_precision" and ort:
        return _ort_target(get, d)
    if get("engine") not in (None, "transformers") and column in ("target_precision", "target_backend"):
        return []  # the engine's own files on its own runtime: --engine says them
    if column in ("target_backend", "execution_provider") or (column == "target_kernels" and ort):
        return []  # the ONNX Runtime target spells these itself; torch is the CLI's default
    if column == "do_sample":
        return [flag] if value else []
    if column in ("temperature", "prompt_lookup_num_tokens"):
        # The seeds always spell the temperature out when sampling; prompt lookup names its N.
        return [flag, _number(value)] if value is not None else []
    if column == "draft_vocab":
        if get("mode") != "assisted" or (value or 0) == (d.get(column) or 0):
            return []
        return [flag, str(value or 0)]
    # A setting with a default (kernels, devices, the new-token floor, a new setting) compares with
    # what the CLI does when not told, so a command that leaves the flag out still reproduces the row.
    if field.default is not None:
        changed = value is not None and value != d.get(column, field.default)
        return [flag, _number(value)] if changed else []
    if value is None or (column in d and d[column] == value):
        return []
    return [flag, _number(value)]


def command(row: Any, defaults: Mapping[str, Any] | None = None) -> str:
    """The command line that reproduces ``row`` (a ``Row`` or its dict), derived from ``FIELDS``'
    flags; flags whose value equals ``defaults[column]`` are left out (no defaults: every setting)."""
    import shlex

    d = defaults or {}
    get = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name, None)
    target, draft = str(get("target_model") or ""), get("draft_model")
    if os.path.isabs(target):  # a pair of local folders (models.local_pair), named by their paths
        args = [*PROGRAM, "--model_name_or_path", target]
        if draft and draft != target:
            args += ["--assistant_model", str(draft)]
        args += ["--task", str(get("task"))]
    else:
        args = [*PROGRAM, "--model_name", str(get("model")), "--task", str(get("task"))]
    if get("mode") == "assisted":
        args.append("--assisted_generation")
    for f in FIELDS:
        # The model and task lead; each prompt's new-token budget comes from its task.
        if f.flag is not None and f.column not in ("model", "max_new_tokens"):
            args += _spell(f, get, d)
    return shlex.join(args)
