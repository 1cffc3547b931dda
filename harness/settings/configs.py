"""The sweep's configurations and their key=value spelling (``--sweep``).

Spec syntax (``parse_configs``, ``--sweep``): configurations separated by ``;``, each a comma-separated
list of ``key=value``:

    t=fp32,d=fp32,k=5;t=w8af32,d=w8af32,k=3,sched=dynamic;t=fp32,mode=prompt_lookup,k=10

=========  ==========================================================  ===========================
key        meaning                                                     default
=========  ==========================================================  ===========================
t          target precision (fp32, bf16, w8af32, w4abf16, w8abf16;     fp32
           int4 or fp32 with kernels=onnxruntime)
d          draft precision (draft-model assistance only)               fp32
mode       ``assisted`` (draft model) or ``prompt_lookup``             assisted
k          K: draft tokens per step (prompt lookup: tokens proposed)   5 (prompt_lookup: 10)
sched      ``constant``, ``dynamic`` or ``heuristic`` (assisted only)  constant
kernels    target kernels: ``stock``, ``invariant``, or ``onnxruntime``  stock
           (the target exported to ONNX Runtime, CPU provider)
engine     an engine with a loop of its own (``--engine``'s names)       transformers
dv         draft scores only the first N token ids (+ special tokens)  whole vocabulary
dk         draft kernels: ``stock`` or ``invariant`` (for speed)        stock
tree       a token tree's rank paths joined by ``+`` (``--draft_tree``)  a chain of K
           instead of a chain (with kernels=invariant, dk=invariant)
ctx        proposals from the context, up to N a round              off
           (``--context_draft``; kernels=invariant, dk=invariant)
synth      a synthetic verdict: each proposal accepted with          off
           probability P (``--synthetic_acceptance``; the output is
           not the target's)
=========  ==========================================================  ===========================

``engine=NAME`` runs the configuration in that engine's own loop (``kernels=NAME`` is read the same
way): its own target (``t`` as the engine reads it: t=int4 or t=fp32 for onnxruntime-genai's
exports, t=gguf for the GGUF engines; left out, the engine's own), its own draft (no d, dv or dk),
``mode=prompt_lookup`` its n-gram decoding where it has one. The engine reads the spelling
(``EngineTarget``, from ``harness.decoding.engines.sweep_target``), so this module names none.

Long names work too: ``target``, ``draft``, ``schedule``, ``target_kernels``, ``draft_vocab``,
``draft_kernels``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.base import backends
from harness.base.errors import HarnessError
from harness.settings import precision, setup
from harness.settings.setup import SCHEDULES, GenerationSettings
from harness.theory import trees

MODES = ("assisted", "prompt_lookup")
KERNELS = ("stock", "invariant")
# Target "kernels" values only: the target runs through ONNX Runtime (harness.base.backends) in
# transformers' loop, or in onnxruntime-genai's own loop (harness.decoding.genai: its draft is the draft model
# exported at the target's settings, prompt lookup its n-gram decoding), so the sweep can put them
# beside the torch targets on the same prompts.
ORT = "onnxruntime"
# An engine's target as the sweep spells it: (engine name, ``t`` or None) -> the run's target.
EngineTarget = Callable[[str, str | None], setup.Target]
DEFAULT_K = {"assisted": 5, "prompt_lookup": 10}
# What `--task sweep` measures without `--sweep`: the fp32 reference, a cheaper draft, both models
# quantized, and prompt lookup (no draft at all) on both targets.
DEFAULT_SPEC = (
    "t=fp32,d=fp32,k=5;"
    "t=fp32,d=w8af32,k=3;"
    "t=w8af32,d=w8af32,k=3;"
    "t=fp32,mode=prompt_lookup,k=10;"
    "t=w8af32,mode=prompt_lookup,k=10"
)
# ``--sweep``'s keys, from the settings' own spellings (``setup.FIELDS``): key -> column.
_KEYS = {key: f.column for f in setup.FIELDS if f.sweep for key in (*f.sweep, f.column)}
_SHORT = ", ".join(f.sweep[0] for f in setup.FIELDS if f.sweep)
_SYNTAX = f"t=fp32,d=w8af32,k=3;t=fp32,mode=prompt_lookup,k=10 (keys: {_SHORT})"


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class SweepConfig:
    """One assisted configuration: the target and draft it runs, as a ``setup.RunSetup`` holds them
    (``draft`` None for prompt lookup), and how it proposes. ``of`` builds one from the sweep's
    spelling; ``label`` names it in rows, tables and plots."""

    target: setup.Target
    draft: setup.Draft | None
    mode: str = "assisted"
    num_assistant_tokens: int = 5  # K; for prompt lookup the number of tokens proposed
    schedule: str = "constant"
    tree: str = ""  # a token tree's rank paths (``--draft_tree``) instead of a chain of K
    context: int = 0  # proposals from the context, up to this many a round (``--context_draft``)
    synthetic: float | None = None  # a synthetic verdict's acceptance (``--synthetic_acceptance``)

    @classmethod
    def of(
        cls,
        target_precision: str | None = "fp32",
        draft_precision: str | None = "fp32",
        mode: str = "assisted",
        num_assistant_tokens: int = 5,
        schedule: str = "constant",
        target_kernels: str = "stock",
        draft_vocab: int | None = None,
        draft_kernels: str = "stock",
        tree: str = "",
        engine_target: EngineTarget | None = None,
        context: int = 0,
        synthetic: float | None = None,
    ) -> SweepConfig:
        """The sweep's spelling (``t``, ``kernels``: stock, invariant, the ONNX Runtime target in
        transformers' loop, or an engine's name, read by ``engine_target``) as the run's target and
        draft. An engine's draft is its own, named by the target's spelling."""
        if target_kernels in KERNELS:
            target = setup.Target(target_precision or "fp32", target_kernels)
        elif target_kernels == ORT:
            ort = backends.OrtSettings(target_precision or "int4")
            target = setup.Target(ort.label, "stock", "onnxruntime", ort.provider)
        elif engine_target is None:
            raise HarnessError(
                f"engine={target_kernels}: an engine's configuration is read with its engine "
                "(harness.decoding.engines.sweep_target)"
            )
        else:
            try:
                target = engine_target(target_kernels, target_precision)
            except HarnessError as exc:
                if str(exc).startswith("unknown engine"):
                    kernels = ", ".join((*KERNELS, ORT))
                    raise HarnessError(
                        f"kernels {target_kernels!r} is not one of {kernels}, and {exc}"
                    ) from None
                raise HarnessError(f"engine={target_kernels}: {exc}") from None
        draft = None if draft_precision is None else setup.Draft(draft_precision, draft_kernels, draft_vocab)
        config = cls(target, draft, mode, num_assistant_tokens, schedule, tree, context, synthetic)
        if draft is not None and target.engine != "transformers":
            config = dataclasses.replace(config, draft=setup.Draft(config.target_precision))
        return config

    # The sweep's spelling read back (labels, loaders and keys of stored rows use it).
    @property
    def target_precision(self) -> str:
        if self.target.precision == backends.EXPORT_LABEL:
            return "export"
        if self.target.backend == "onnxruntime":
            return backends.OrtSettings.from_label(self.target.precision).precision
        return self.target.precision

    @property
    def target_kernels(self) -> str:
        """The sweep's ``kernels``: an engine's name, ``onnxruntime``, or the torch target's kernels."""
        if self.target.engine != "transformers":
            return self.target.engine
        return ORT if self.target.backend == "onnxruntime" else self.target.kernels

    @property
    def draft_precision(self) -> str | None:
        if self.draft is None:
            return None
        # An engine's draft is its own, at the target's settings: named by the target's spelling.
        return self.target_precision if self.target.engine != "transformers" else self.draft.precision

    @property
    def draft_vocab(self) -> int | None:
        return self.draft.vocab if self.draft else None

    @property
    def draft_kernels(self) -> str:
        return self.draft.kernels if self.draft else "stock"

    @property
    def draft_key(self) -> tuple[str | None, int | None] | tuple[str | None, int | None, str]:
        """What loads one draft: precision, vocabulary restriction (and kernels when not stock)."""
        if self.draft_kernels == "stock":
            return (self.draft_precision, self.draft_vocab)
        return (self.draft_precision, self.draft_vocab, self.draft_kernels)

    @property
    def label(self) -> str:
        if self.mode == "prompt_lookup":
            # The kernels only show when they are not the stock ones.
            suffix = "" if self.target_kernels == "stock" else f"-{self.target_kernels}"
            return f"t_{self.target_precision}-prompt_lookup-K{self.num_assistant_tokens}{suffix}"
        # A tree has no K or schedule: its shape names it.
        proposes = f"tree_{self.tree}" if self.tree else f"K{self.num_assistant_tokens}-{self.schedule}"
        return (
            f"t_{self.target_precision}-d_{self.draft_precision}-{proposes}-{self.target_kernels}"
            + (f"-dv{self.draft_vocab}" if self.draft_vocab is not None else "")
            + ("-dk_invariant" if self.draft_kernels != "stock" else "")
            + (f"-ctx{self.context}" if self.context else "")
            + (f"-synth{self.synthetic:g}" if self.synthetic is not None else "")
        )

    @property
    def target_key(self) -> tuple[str, str]:
        """What loads one target: configurations sharing it are measured against the same plain runs."""
        return (self.target_precision, self.target_kernels)

    def decoding(self, new_tokens: int) -> GenerationSettings:
        """The configuration's decoding as spelled, not validated: rows read back from an engine
        carry K=0, which a run would refuse but a summary still reads."""
        # ignore_eos: plain and assisted decode exactly new_tokens, so their tokens/s cover the same work.
        return GenerationSettings(
            mode=self.mode,
            max_new_tokens=new_tokens,
            num_assistant_tokens=self.num_assistant_tokens,
            assistant_schedule=self.schedule,
            prompt_lookup_num_tokens=self.num_assistant_tokens,
            ignore_eos=True,
            draft_tree=self.tree,
            context_draft=self.context,
            synthetic_acceptance=self.synthetic,
        )

    def settings(self, new_tokens: int) -> GenerationSettings:
        return self.decoding(new_tokens).validate()

    def run(
        self, pair: str, new_tokens: int, target_device: str = "cpu", draft_device: str = "cpu"
    ) -> setup.RunSetup:
        """The configuration's assisted runs of ``pair`` as one run setup, on the devices given (a
        target on ONNX Runtime or in an engine runs where its runtime puts it)."""
        target = self.target
        if target.backend == "torch":
            target = dataclasses.replace(target, device=target_device)
        draft = dataclasses.replace(self.draft, device=draft_device) if self.draft is not None else None
        if draft is not None and target.engine != "transformers":
            # An engine's draft is its own, at the target's settings (the sweep's spelling names it
            # by the target's precision: ``_parse_one``).
            draft = setup.Draft(target.precision, device=draft_device)
        return setup.RunSetup(pair, target, draft, self.settings(new_tokens))


def plain_label(target_precision: str, target_kernels: str = "stock") -> str:
    """The label of a target's plain runs (the baseline of every configuration on that target)."""
    return f"t_{target_precision}-plain" + ("" if target_kernels == "stock" else f"-{target_kernels}")


def _positive_int(where: str, key: str, text: str, example: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise HarnessError(f"{where}: {key}={text!r} is not an integer; write e.g. {key}={example}") from None
    if value < 1:
        raise HarnessError(f"{where}: {key} must be at least 1 (got {value})")
    return value


def _parse_entry(entry: str, where: str, engine_target: EngineTarget | None) -> SweepConfig:
    values: dict[str, str] = {}
    for item in entry.split(","):
        item = item.strip()
        if not item:
            raise HarnessError(f"{where}: empty item in {entry!r}; separate key=value items by single commas")
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise HarnessError(f"{where}: {item!r} is not key=value; write e.g. {_SYNTAX}")
        field = _KEYS.get(key.lower())
        if field is None:
            raise HarnessError(f"{where}: unknown key {key!r}; known keys: {_SHORT}")
        if field in values:
            raise HarnessError(f"{where}: {key!r} is given twice; give each key once per configuration")
        values[field] = value

    given = set(values)
    mode = values.pop("mode", "assisted").lower()
    if mode not in MODES:
        raise HarnessError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}")
    k = _positive_int(where, "k", values.pop("num_assistant_tokens", str(DEFAULT_K[mode])), 5)
    schedule = values.pop("assistant_schedule", None)
    draft = values.pop("draft_precision", None)
    draft_given = draft is not None
    dv_text = values.pop("draft_vocab", None)
    draft_vocab = None if dv_text is None else _positive_int(where, "dv", dv_text, 32768)
    if mode == "prompt_lookup":
        # Silently ignoring these would print a configuration that did not run as written.
        if draft is not None:
            raise HarnessError(f"{where}: prompt_lookup uses no draft model; remove d={draft}")
        if draft_vocab is not None:
            raise HarnessError(f"{where}: prompt_lookup uses no draft model; remove dv={draft_vocab}")
        if "draft_kernels" in values:
            raise HarnessError(
                f"{where}: prompt_lookup uses no draft model; remove dk={values['draft_kernels']}"
            )
        if schedule is not None and schedule != "constant":
            raise HarnessError(
                f"{where}: sched applies to draft-model assistance only; remove sched={schedule}"
            )
        schedule = "constant"
    else:
        draft = draft or "fp32"
        schedule = (schedule or "constant").lower()
        if schedule not in SCHEDULES:
            raise HarnessError(f"{where}: sched {schedule!r} is not one of {', '.join(SCHEDULES)}")
    kernels = values.pop("target_kernels", "stock").lower()
    engine = values.pop("engine", None)
    if engine is not None:
        if "target_kernels" in given:
            raise HarnessError(f"{where}: engine={engine} runs its own kernels; remove kernels={kernels}")
        kernels = engine.lower()
    own = kernels not in (*KERNELS, ORT)  # an engine's name: its own target and draft
    draft_kernels = values.pop("draft_kernels", "stock").lower()
    if draft_kernels not in KERNELS:
        raise HarnessError(f"{where}: dk {draft_kernels!r} is not one of {', '.join(KERNELS)}")
    target = values.pop("target_precision", None if own else "int4" if kernels == ORT else "fp32")
    if kernels == ORT and target not in backends.ORT_PRECISIONS:
        raise HarnessError(
            f"{where}: kernels={kernels} takes t={' or t='.join(backends.ORT_PRECISIONS)}, not t={target}"
        )
    if own and mode == "assisted" and (draft_given or draft_vocab is not None or draft_kernels != "stock"):
        raise HarnessError(f"{where}: engine={kernels} drafts with its own draft model; remove d, dv and dk")
    context = _positive_int(where, "ctx", values.pop("context_draft"), 16) if "context_draft" in values else 0
    if context and (mode != "assisted" or kernels != "invariant" or draft_kernels != "invariant"):
        raise HarnessError(
            f"{where}: ctx={context} proposes from the context beside a draft model, on the batch-invariant "
            "kernels: mode=assisted,kernels=invariant,dk=invariant"
        )
    synthetic = (
        _probability(where, "synth", values.pop("synthetic_acceptance"))
        if "synthetic_acceptance" in values
        else None
    )
    if synthetic is not None and (
        mode != "assisted" or kernels != "invariant" or draft_kernels != "invariant"
    ):
        raise HarnessError(
            f"{where}: synth={synthetic:g} draws a synthetic verdict on a draft model's proposals, on the "
            "batch-invariant kernels: mode=assisted,kernels=invariant,dk=invariant"
        )
    tree = values.pop("draft_tree", "")
    if tree and given & {"num_assistant_tokens", "assistant_schedule"}:
        raise HarnessError(f"{where}: tree={tree} proposes a tree, not a chain of K: remove k and sched")
    if tree:
        if mode != "assisted" or kernels != "invariant" or draft_kernels != "invariant":
            raise HarnessError(
                f"{where}: tree={tree} runs a draft model on the batch-invariant kernels: "
                "kernels=invariant,dk=invariant"
            )
        try:
            trees.Tree.parse(tree)
        except HarnessError as exc:
            raise HarnessError(f"{where}: {exc}") from None
    for name in (target, draft) if kernels in KERNELS else ((draft,) if kernels == ORT else ()):
        if name is not None:
            try:
                precision.check_precision(name)
            except HarnessError as exc:
                raise HarnessError(f"{where}: {exc}") from None
    if values:  # a setting with a sweep key that a configuration cannot carry: never silently dropped
        raise HarnessError(f"{where}: {', '.join(sorted(values))} cannot be set per configuration here")
    try:
        return SweepConfig.of(
            target,
            draft,
            mode,
            k,
            schedule,
            kernels,
            draft_vocab,
            draft_kernels,
            tree,
            engine_target,
            context,
            synthetic,
        )
    except HarnessError as exc:
        raise HarnessError(f"{where}: {exc}") from None


def _probability(where: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise HarnessError(f"{where}: {key}={text} is not a probability in [0, 1]")
    return value


def parse_configs(spec: str, engine_target: EngineTarget | None = None) -> list[SweepConfig]:
    """Parse the compact ``--sweep`` syntax (see the module docstring) into configurations; an
    engine's configurations are read by ``engine_target``.

    Configurations are separated by ``;`` (a trailing one is fine), their items by ``,``. Every
    mistake raises a HarnessError naming the configuration and what to write instead.
    """
    entries = [e.strip() for e in str(spec).split(";")]
    if entries and not entries[-1]:
        entries.pop()  # "a;b;" is a habit, not a mistake
    if not any(entries):
        raise HarnessError(f"--sweep is empty; give at least one configuration, e.g. {_SYNTAX}")
    configs: list[SweepConfig] = []
    seen: dict[str, int] = {}
    for n, entry in enumerate(entries, 1):
        where = f"--sweep configuration {n}"
        if not entry:
            raise HarnessError(f"{where} is empty; remove the extra ';'")
        config = _parse_entry(entry, where, engine_target)
        if config.label in seen:
            # Labels key the rows: a duplicate would be measured once and reported twice.
            raise HarnessError(
                f"{where} repeats configuration {seen[config.label]} ({config.label}); remove one"
            )
        seen[config.label] = n
        configs.append(config)
    return configs


def group_configs(configs: Sequence[SweepConfig]) -> dict[tuple[str, str], list[SweepConfig]]:
    """Configurations by target (precision, kernels), targets in order of first appearance."""
    groups: dict[tuple[str, str], list[SweepConfig]] = {}
    for config in configs:
        groups.setdefault(config.target_key, []).append(config)
    return groups
