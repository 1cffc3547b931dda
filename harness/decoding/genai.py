"""onnxruntime-genai's own decoding, plain and speculative, as an engine under test.

The runtime Ryzen AI ships decodes through onnxruntime-genai's ``Generator``, which has speculative
decoding of its own: a draft model declared as ``model.draft`` in the target's ``genai_config.json``
and ``speculative.max_draft_tokens`` (K). This module drives that engine, not an emulation of it:
``speculative_folder`` writes a folder holding the target export with the draft export beside it
(files linked, configs the builder wrote), or one configured for the engine's n-gram decoding, and
``decode_prompt`` runs the ``Generator`` token by token with the suite's clocks, returning the
engine's own statistics (``get_speculative_stats``) next to what the suite measures, so one can be
held against the other (``analysis.engine_stats_problems``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.base import backends, files
from harness.base.errors import HarnessError, UnsupportedError
from harness.decoding.base import Engine
from harness.theory import analysis, timing

GENAI = "onnxruntime-genai"  # the engine's name

MAX_K = 16  # what the engine's config parser accepts for max_draft_tokens (checked here first)
# The engine's n-gram decoding (``speculative.ngram_size``): proposals looked up in the prompt and the
# output so far by their last NGRAM_SIZE tokens. 2 is the shortest the engine takes and what
# transformers' prompt lookup matches by default (``max_matching_ngram_size``).
NGRAM_SIZE = 2
_CONFIG = "genai_config.json"


def _og() -> Any:
    try:
        import onnxruntime_genai
    except ImportError as exc:  # pragma: no cover - a broken install
        raise UnsupportedError(f"the onnxruntime-genai engine needs onnxruntime-genai ({exc})") from None
    return onnxruntime_genai


def check_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise HarnessError(f"K = {k}: onnxruntime-genai's max_draft_tokens takes 1 to {MAX_K}")
    return k


def _readable_config(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")).get("model"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def speculative_folder(target: Path, draft: Path | None, k: int, root: Path, *, ngram_size: int = 0) -> Path:
    """A folder the engine opens as speculative decoding of ``target``, up to K tokens a round.

    With a ``draft`` export: the target export's files linked in, the draft's in ``draft/``, and a
    ``genai_config.json`` whose ``model.draft`` is the draft's own decoder section (the builder's head
    sizes and layer counts). With ``ngram_size`` (>= 2) and no draft: the engine's n-gram decoding.
    Rebuilt whenever an export or a setting changes (its name carries them)."""
    check_k(k)
    if (draft is None) == (ngram_size == 0):
        raise HarnessError(
            "the engine speculates with a draft model or with n-grams (ngram_size >= 2), one of them: "
            "its n-gram decoding cannot be combined with a draft model"
        )
    if draft is None and ngram_size < 2:
        raise HarnessError(f"ngram_size {ngram_size}: the engine's n-gram decoding takes 2 or more")
    roles = ((target, "target"),) + (((draft, "draft"),) if draft is not None else ())
    for folder, role in roles:
        if not (folder / _CONFIG).is_file():
            raise HarnessError(
                f"the {role} export {folder} has no {_CONFIG}; export it with the model builder "
                "(harness.weights.onnx_export) first"
            )
    t_config = json.loads((target / _CONFIG).read_text(encoding="utf-8"))
    if draft is not None:
        d_config = json.loads((draft / _CONFIG).read_text(encoding="utf-8"))
        if t_config["model"]["vocab_size"] != d_config["model"]["vocab_size"]:
            raise HarnessError(
                f"target and draft vocabularies differ ({t_config['model']['vocab_size']} vs "
                f"{d_config['model']['vocab_size']}): the engine's speculative decoding needs one vocabulary"
            )
        name = f"{target.parent.name}+{draft.parent.name}-k{k}"
    else:
        name = f"{target.parent.name}+ngram{ngram_size}-k{k}"
    out = root / name
    if _readable_config(out / _CONFIG):
        return out
    shutil.rmtree(out, ignore_errors=True)  # missing or damaged: built again below
    tmp = root / f".{name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for src, dst in ((folder, tmp if role == "target" else tmp / "draft") for folder, role in roles):
        dst.mkdir(exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and f.name != _CONFIG:
                (dst / f.name).symlink_to(f.resolve())
    if draft is not None:
        draft_section = dict(d_config["model"]["decoder"])
        draft_section["filename"] = f"draft/{draft_section['filename']}"
        t_config["model"]["draft"] = draft_section
        t_config["speculative"] = {"max_draft_tokens": k}
    else:
        t_config["speculative"] = {"max_draft_tokens": k, "ngram_size": ngram_size}
    files.atomic_write(tmp / _CONFIG, json.dumps(t_config, indent=2).encode("utf-8"))
    try:
        os.replace(tmp, out)
    except OSError:  # another process built the same folder first
        pass
    return out


@dataclass
class EngineRun:
    """One prompt decoded by the engine, measured by the suite's clocks (ms unless named ``_s``)."""

    prompt_tokens: int
    output_ids: list[int]
    total_s: float
    prefill_ms: float  # append_tokens(prompt) up to the first new token
    time_per_token_ms: float
    stats: dict[str, Any] = field(default_factory=dict)  # get_speculative_stats(), as the engine says
    # Per verification, [drafted, accepted]: the engine's own counters' step at each verify (read
    # with ``rounds``); None when not read.
    rounds: list[tuple[int, int]] | None = None

    @property
    def tokens_per_s(self) -> float:
        return timing.rate(self.time_per_token_ms)


def load(folder: Path) -> Any:
    """The engine's model for an export folder (plain) or a ``speculative_folder``."""
    og = _og()
    try:
        return og.Model(str(folder))
    except Exception as exc:  # the engine raises its own RuntimeError subclasses with the reason
        raise HarnessError(f"onnxruntime-genai cannot open {folder}: {exc}") from None


@dataclass(frozen=True)
class Sampling:
    """The engine's sampling options. ``top_k`` 0 is the suite's "no top-k": the vocabulary's size,
    which keeps every token and is what the engine's speculative sampling needs (a positive top_k;
    its own default is 50)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def options(self, vocab_size: int) -> dict[str, Any]:
        return dict(
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k or vocab_size,
            random_seed=self.seed,
        )


def vocab_size(folder: Path) -> int:
    """The vocabulary an export's ``genai_config.json`` declares."""
    return int(json.loads((folder / _CONFIG).read_text(encoding="utf-8"))["model"]["vocab_size"])


def decode_prompt(
    model: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    ignore_eos: bool = True,
    sampling: dict[str, Any] | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    rounds: bool = False,
) -> EngineRun:
    """Decoding of ``prompt_ids`` by the engine, greedy or with ``sampling`` (``Sampling.options``),
    one ``generate_next_token`` per token (the engine drains a speculative round's tokens one call
    at a time), timed around the calls; it ends early once ``stop`` says so of the tokens so far
    (the library has no stop strings of its own). With ``rounds``, the engine's counters are read
    after each call, so each verification's drafted and accepted tokens are known (its books keep
    totals only)."""
    og = _og()
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(prompt_ids) + max_new_tokens,
        min_length=len(prompt_ids) + max_new_tokens if ignore_eos else 0,
        **(sampling or {"do_sample": False}),
    )
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(list(prompt_ids))
    out: list[int] = []
    first = start
    books: list[tuple[int, int]] | None = [] if rounds else None
    seen = (0, 0, 0)  # verifications, drafted, accepted so far
    while not generator.is_done() and len(out) < max_new_tokens:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
        if books is not None:  # a dict of a few counters: microseconds against a token's milliseconds
            now = generator.get_speculative_stats()
            counters = tuple(
                int(now.get(key, 0))
                for key in ("target_verify_forward_passes", "draft_tokens_evaluated", "draft_tokens_accepted")
            )
            if counters[0] > seen[0]:
                books.append((counters[1] - seen[1], counters[2] - seen[2]))
            seen = counters
        if len(out) == 1:
            first = time.perf_counter()
        if stop is not None and stop(out):
            break
    end = time.perf_counter()
    prefill_ms = (first - start) * 1000
    per_token = timing.per_token_ms((end - first) * 1000, len(out))
    return EngineRun(
        len(prompt_ids), out, end - start, prefill_ms, per_token, generator.get_speculative_stats(), books
    )


def divergence_gap(
    model: Any, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]
) -> tuple[int, float] | None:
    """Where ``other`` first leaves the engine's plain output ``plain``, and the engine's own
    one-token logit gap there between the plain token and the one ``other`` took (None: identical).

    A gap within the precision's near-tie tolerance (``backends.ort_near_tie_tolerance``) is a
    flip the wide verification forward may make; anything larger is a fault of the engine."""
    import numpy as np

    i = analysis.first_differing_token(plain, other)
    if i is None:
        return None
    og = _og()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt_ids) + i + 1, do_sample=False)
    generator = og.Generator(model, params)
    # Replayed the way plain decoding ran: the prompt in one forward, then one token per forward, so
    # the logits are the ones plain decoding chose from (a single wide forward would not be).
    generator.append_tokens(list(prompt_ids))
    for token in plain[:i]:
        generator.append_tokens([token])
    logits = np.asarray(generator.get_logits(), dtype=np.float64).reshape(-1)
    return i, float(logits[plain[i]] - logits[other[i]])


# --------------------------------------------------------------------------- the engine as a decoder


@dataclass
class Models:
    """The engine's plain model and, per K, its speculative one (built on first use)."""

    target_export: Path
    draft_export: Path | None
    root: Path
    plain: Any
    speculative: dict[tuple[str, int], Any] = field(default_factory=dict)

    def model_for(self, mode: str, k: int) -> Any:
        """The model for ``mode``: plain, assisted (the draft model, K = k) or prompt_lookup (the
        engine's n-gram decoding proposing up to k tokens)."""
        if mode == "plain":
            return self.plain
        if mode == "assisted" and self.draft_export is None:
            raise HarnessError("this engine was prepared without a draft export; prepare it with_draft=True")
        if (mode, k) not in self.speculative:
            folder = (
                speculative_folder(self.target_export, self.draft_export, k, self.root)
                if mode == "assisted"
                else speculative_folder(self.target_export, None, k, self.root, ngram_size=NGRAM_SIZE)
            )
            self.speculative[(mode, k)] = load(folder)
        return self.speculative[(mode, k)]


def check_settings(settings: Any) -> None:
    """What onnxruntime-genai 0.18.0 runs through the suite: plain decoding, with a draft model or
    with its n-gram decoding (the suite's prompt lookup), greedy or sampled (temperature, top-p,
    top-k, seed). A K it refuses is refused here first, with the range it takes."""
    if settings.mode != "plain":
        check_k(settings.proposal_k)


def sampling_of(settings: Any) -> Sampling | None:
    """The engine's sampling options for the suite's settings (None: greedy)."""
    if not settings.do_sample:
        return None
    return Sampling(settings.temperature, settings.top_p, settings.top_k, settings.seed)


def _step_costs(stats: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """The engine's own books: its verify and draft forwards (prefill and re-anchoring left out)."""
    return {
        "target": (stats.get("total_target_verify_ms", 0.0), stats.get("target_verify_forward_passes", 0)),
        "draft": (stats.get("total_draft_ms", 0.0), stats.get("draft_forward_passes", 0)),
    }


def _outside_forwards(run: EngineRun) -> float:
    """Wall ms of a speculative run outside the engine's own target and draft forwards."""
    booked = run.stats.get("total_target_ms", 0.0) + run.stats.get("total_draft_ms", 0.0)
    return max(0.0, run.total_s * 1000 - booked)


def _plain_step_costs(run: EngineRun) -> dict[str, tuple[float, int]]:
    """Plain decoding: every step after the first token is one target forward, by the suite's clock."""
    steps = len(run.output_ids) - 1
    return {"target": (run.time_per_token_ms * steps, steps) if steps > 0 else (0.0, 0)}


class GenaiEngine(Engine):
    """onnxruntime-genai's Generator over the model builder's exports of a pair, at the target's
    settings (the draft exported beside it): plain decoding, its speculative decoding with the draft
    and its n-gram decoding (the suite's prompt lookup). One object per loaded pair holds its models."""

    name: ClassVar[str] = GENAI
    backend: ClassVar[str | None] = "onnxruntime"
    runtime_module: ClassVar[str | None] = "onnxruntime_genai"
    extra: ClassVar[str | None] = "onnxruntime"
    runs: ClassVar[str] = "the model builder's exports of a Hugging Face folder (made once)"

    @classmethod
    def near_tie_tolerance(cls, target: Any) -> float:
        from harness.base import backends

        return backends.ort_near_tie_tolerance(target.precision)

    # Its judge replays plain decoding step for step: the plain token must lead there.
    exact_judge: ClassVar[bool] = True

    def __init__(self, models_of: Models, vocab: int) -> None:
        from importlib import metadata

        self.models = models_of
        self.vocab = vocab
        # Which onnxruntime-genai decoded: every row this engine writes carries it beside the libraries'.
        self.versions = {"onnxruntime-genai": metadata.version("onnxruntime-genai")}

    @classmethod
    def target_of(
        cls,
        spec: Any,
        *,
        target_precision: str | None = None,
        provider: str | None = None,
        target_device: str = "cpu",
        ort_block_size: int | None = None,
        ort_accuracy_level: int | None = None,
        **other: Any,
    ) -> Any:
        """The builder's export of the target at ``--target_precision int4|fp32`` and ``--ort_*``; a
        target given as the builder's output folder is run as it is (``export``)."""
        from harness.base import backends
        from harness.settings.setup import Target

        if spec is not None and spec.target.is_genai_export:
            if target_precision is not None or ort_block_size is not None or ort_accuracy_level is not None:
                raise HarnessError(
                    f"{spec.target.path} is an export already: its precision is what the model builder made; "
                    "drop --target_precision and --ort_*"
                )
            provider = provider or backends.DEFAULT_PROVIDER
            return Target(
                backends.EXPORT_LABEL,
                "stock",
                "onnxruntime",
                backends.check_provider(provider),
                target_device,
                cls.name,
            )

        defaults = backends.OrtSettings()
        ort = backends.OrtSettings(
            target_precision or defaults.precision,
            defaults.block_size if ort_block_size is None else ort_block_size,
            defaults.accuracy_level if ort_accuracy_level is None else ort_accuracy_level,
            provider or defaults.provider,
        ).validate()
        return Target(ort.label, "stock", "onnxruntime", ort.provider, target_device, cls.name)

    from_built_models: ClassVar[bool] = True
    version_names: ClassVar[tuple[str, ...]] = ("onnxruntime-genai",)

    @classmethod
    def from_models(cls, spec: Any, run: Any, target: Any, draft: Any, tokenizer: Any, folder: Path) -> Any:
        """The models saved as Hugging Face folders, exported by the model builder as any pair's are."""
        from harness.weights import tiny

        root = str(folder)
        folders = {
            "target": tiny.saved_folder("target", target, tokenizer, root),
            "draft": tiny.saved_folder("draft", draft, tokenizer, root),
        }
        return cls.load(spec, run, folders=folders)

    @classmethod
    def unfit(cls, spec: Any) -> str | None:
        from harness.base import backends

        if spec.family not in backends.ORT_FAMILIES:
            written = ", ".join(backends.ORT_FAMILIES)
            return f"its family {spec.family} is not one the model builder writes ({written})"
        return None

    @classmethod
    def prepare(cls, spec: Any, weights_dir: str | None) -> None:
        from harness.pairs import models

        if spec.name == models.DEFAULT_PAIR:
            models.prepare_packaged(export_target=True, export_draft=True)

    @classmethod
    def check(cls, spec: Any, run: Any) -> None:
        """What onnxruntime-genai 0.18.0 runs through the suite (``check_settings``), on an export
        of a family its model builder writes."""
        from harness.base import backends
        from harness.pairs import models

        backends.check_family(spec.family, spec.name)
        if run.target.precision == backends.EXPORT_LABEL:
            if run.draft is not None and not spec.draft.is_genai_export:
                raise HarnessError(
                    f"the target {spec.target.path} is an export: give the draft as one too (the model "
                    "builder's output folder), so both run as they were made"
                )
        else:
            models.ort_settings(run).validate()
        check_settings(run.decoding)

    @classmethod
    def load(
        cls,
        spec: Any,
        run: Any,
        *,
        weights_dir: str | None = None,
        verify: bool = False,
        folders: dict[str, Path] | None = None,
    ) -> Any:
        """The pair as the engine runs it (checked first); ``folders`` (role -> Hugging Face folder)
        stands in for the spec's own models (a test's pair built from a recipe)."""
        from transformers import AutoTokenizer

        from harness.pairs import models
        from harness.weights import packaged

        cls.check(spec, run)
        ort = None if run.target.precision == backends.EXPORT_LABEL else models.ort_settings(run)
        roles = {"target": spec.target, **({"draft": spec.draft} if run.draft is not None else {})}
        if folders is not None:
            folders = {role: folders[role] for role in roles}
        elif spec.target.is_tiny:
            # The tiny stand-ins have no folders: saved once, named by their content (tiny.saved_folder).
            from harness.weights import tiny

            name, tokenizer = spec.name.lower(), tiny.build_tokenizer()
            target = tiny.build_target(name)
            models_of = {"target": target, "draft": tiny.build_draft(name, target)}
            folders = {
                role: tiny.saved_folder(m.name, models_of[role], tokenizer) for role, m in roles.items()
            }
        else:
            # A model given as the builder's output is run as it is (its tokenizer is in it too).
            folders = {
                role: Path(m.path)
                if m.is_genai_export
                else models.resolve_model(m, weights_dir, verify=verify)
                for role, m in roles.items()
            }
        exports = {
            role: folder
            if roles[role].is_genai_export
            else models.export_ort_target(roles[role].name, folder, ort, verify=verify)
            for role, folder in folders.items()
        }
        held = Models(
            exports["target"], exports.get("draft"), packaged.cache_root() / "genai", load(exports["target"])
        )
        return models.LoadedPair.of_engine(
            spec,
            run,
            AutoTokenizer.from_pretrained(folders["target"], local_files_only=True),
            {role: str(path) for role, path in exports.items()},
            cls(held, vocab_size(exports["target"])),
        )

    def gap(self, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> float | None:
        """The engine's own one-token logit gap where ``other`` leaves ``plain`` (None: identical):
        how the equivalence check judges a flip (there is no torch target)."""
        found = divergence_gap(self.models.plain, prompt_ids, plain, other)
        return None if found is None else found[1]

    def decode(self, pair: Any, ids: list[int], settings: Any) -> Any:
        from harness.theory.timing import Measurement

        check_settings(settings)
        stops = settings.stop_strings
        # The whole new text is searched, as transformers' criterion here does (``StopInNewText``).
        stop = (lambda out: any(s in pair.tokenizer.decode(out) for s in stops)) if stops else None
        model = self.models.model_for(settings.mode, settings.proposal_k)
        sampling = sampling_of(settings)
        run = decode_prompt(
            model,
            ids,
            settings.max_new_tokens,
            ignore_eos=settings.ignore_eos,
            sampling=sampling.options(self.vocab) if sampling else None,
            stop=stop,
            rounds=settings.mode != "plain",
        )
        s = run.stats
        speculative = settings.mode != "plain"
        return Measurement(
            prompt_tokens=len(ids),
            output_ids=run.output_ids,
            total_s=run.total_s,
            prefill_ms=run.prefill_ms,
            target_prefill_ms=run.prefill_ms,
            time_per_token_ms=run.time_per_token_ms,
            tokens_per_s=run.tokens_per_s,
            # The engine counts and times its forwards only when it speculates; plain decoding is one
            # target forward per token, timed by the suite's clock around the whole decode.
            target_forwards=s.get("target_forward_passes", 0) if speculative else len(run.output_ids),
            draft_forwards=s.get("draft_forward_passes", 0),
            target_ms=s.get("total_target_ms", 0.0) if speculative else run.total_s * 1000,
            draft_ms=s.get("total_draft_ms", 0.0),
            # Speculative: the wall time outside the engine's own target and draft forwards. Plain:
            # not separated (the whole decode is booked to the target).
            other_ms=_outside_forwards(run) if speculative else 0.0,
            drafted=s.get("draft_tokens_evaluated", 0),
            accepted=s.get("draft_tokens_accepted", 0),
            # The rounds a correction token closed are the ones that rejected a candidate.
            step_costs=_step_costs(s) if speculative else _plain_step_costs(run),
            rejected_steps=s.get("correction_tokens", 0) if speculative else None,
            judged_steps=[[i < accepted for i in range(drafted)] for drafted, accepted in run.rounds]
            if run.rounds is not None
            else None,
        )
