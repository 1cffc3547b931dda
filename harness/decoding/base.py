"""The engine interface: what every engine is, and what the suites ask of one.

An engine is one class (after transformers' ``candidate_generator``: an abstract base, one subclass
per strategy, capabilities as class attributes, the loop above unaware of which it got). Its class
attributes say what it is before anything loads: its name, the runtime that computes its target, the
K its own speculative decoding drafts, the row fields its books cannot fill, how near a tie its flips
may be, and whether its runtime is here. Its class methods check a run and load a pair for it; the
loaded pair carries an instance, whose ``decode`` turns one prompt into a ``Measurement``.

Engines are registered under the entry-point group ``assisted_generation.engines`` (the built-in ones
in this package's own metadata), so another package adds one by naming its class there
(``harness.decoding.engines``; docs/ENGINES.md "Writing an engine").
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from harness.base.errors import HarnessError

if TYPE_CHECKING:
    from harness.pairs.models import LoadedPair, PairSpec
    from harness.settings.setup import GenerationSettings, RunSetup, Target
    from harness.theory.timing import Measurement

# Row fields an engine's books may lack: they need the draft's time apart from the target's.
DRAFT_SPLIT_FIELDS = frozenset(
    {"alpha", "draft_forward_ms", "c", "predicted_speedup", "predicted_speedup_verify"}
)


def test_id(name: str) -> str:
    """An engine's name as test ids and markers carry it: ``llama.cpp`` -> ``llama_cpp``."""
    return "".join(c if c.isalnum() else "_" for c in name)


class Engine(abc.ABC):
    """One engine: plain and speculative decoding of a pair in one runtime's own loop."""

    # The name users pass (``--engine``, ``--engines``, the sweep's ``engine=``) and rows carry.
    name: ClassVar[str]
    # The runtime that computes the target, as rows' ``target_backend`` says it; None: the run's
    # (``--target_backend``), for the one engine that runs either.
    backend: ClassVar[str | None] = None
    # The target precision rows carry when the engine runs the pair's files as they are; None: the run's.
    precision: ClassVar[str | None] = None
    # The constant K its own speculative decoding drafts in the suites' cases (None: the pair's
    # registered K and schedule, which only an engine with schedules of its own can follow).
    default_k: ClassVar[int | None] = 3
    # The draft is the engine's own file at the target's settings (no draft precision, kernels or
    # vocabulary of the harness's to set).
    own_draft: ClassVar[bool] = True
    # Its judge of a flip replays plain decoding step for step (True), or reads the prefix as one
    # prompt (a batched prefill, not plain decoding's steps).
    exact_judge: ClassVar[bool] = True
    # The decoding modes it runs (``GenerationSettings.mode``): plain, a draft model's, prompt lookup.
    modes: ClassVar[tuple[str, ...]] = ("plain", "assisted", "prompt_lookup")
    # Row fields its books cannot fill (they stay empty in its rows, and the suites do not ask).
    unbooked: ClassVar[frozenset[str]] = frozenset()
    # HumanEval problems its pass@1 comparison takes at least: more than the suites' default two where
    # its flips are near ties of its own kernels (pass@1 could move on a few problems by chance).
    humaneval_problems: ClassVar[int] = 0
    # The Python module its runtime needs (None: nothing beyond the harness's own dependencies), and
    # the harness's optional extra that installs it.
    runtime_module: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    # What it runs of a pair, said in refusals and on the results page.
    runs: ClassVar[str] = "the pair's files"
    # It places its models on devices of its own naming (NPU, GPU), checked by its ``check``, not torch's.
    own_devices: ClassVar[bool] = False
    # Command-line options only this engine reads (argparse dest names, e.g. ``llama_server``): given
    # with another engine they are refused; given with this one they reach ``take_options``.
    options: ClassVar[tuple[str, ...]] = ()
    # It decodes over a deployment's endpoints (``--endpoint``, ``--speculative-endpoint``).
    takes_endpoints: ClassVar[bool] = False
    # It runs models built in memory (``from_models``) and samples: the sampling tier's chi-square runs it.
    from_built_models: ClassVar[bool] = False
    # Whether the suites can run it on a registered pair with nothing more than its files (a served
    # deployment needs the user's endpoints).
    in_suites: ClassVar[bool] = True

    # Which build decoded, beside the libraries' (an instance sets its own): rows carry it, and the
    # results page shows the keys ``version_names`` lists.
    versions: Mapping[str, str] = MappingProxyType({})
    version_names: ClassVar[tuple[str, ...]] = ()
    # How many requests it serves at once (``--concurrency``): 1, one prompt at a time; a serving
    # engine takes up to its slots (``serve_concurrently``), each a stream of its own.
    max_concurrency: ClassVar[int] = 1

    @classmethod
    def test_id(cls) -> str:
        """The engine as test ids carry it (``-k llama_cpp`` selects llama.cpp's cases)."""
        return test_id(cls.name)

    @classmethod
    def missing(cls) -> str | None:
        """Why its runtime cannot run here (None: it can): said once per run, not per test."""
        if cls.runtime_module is not None and importlib.util.find_spec(cls.runtime_module) is None:
            return (
                f"its runtime ({cls.runtime_module}) is not installed: "
                f'pip install "assisted-generation-harness[{cls.extra}]"'
            )
        return None

    @classmethod
    def from_models(
        cls, spec: PairSpec, run: RunSetup, target: Any, draft: Any, tokenizer: Any, folder: Path
    ) -> LoadedPair:
        """A pair of torch models built in memory (the sampling tier's), as this engine runs them,
        with its files written under ``folder``; an engine that samples sets ``from_built_models``."""
        raise HarnessError(f"engine {cls.name} runs {cls.runs}, not models built in memory")

    @classmethod
    def take_options(cls, values: Mapping[str, Any]) -> None:
        """Apply the values of its ``options`` that a command line gave (checked: a bad one raises)."""
        return None

    @classmethod
    def near_tie_tolerance(cls, target: Target) -> float:
        """How far apart the target's top two logits may be for a flip to count as a near tie. Third-party
        kernels take different paths for one token and for K+1 (int4 weights, int8 activation blocks):
        the int4 allowance, 0.5 logits."""
        return 0.5

    @classmethod
    def unfit(cls, spec: PairSpec) -> str | None:
        """Why it cannot run pair ``spec`` at all, from what the pair is (None: it can): the suites
        leave such a pair out of the engine's cases and say so once. Cheap: asked at collection."""
        return None

    @classmethod
    def build(cls) -> None:
        """Compile what it runs (once per machine); the suites call it beside the weights' conversion."""
        return None  # most engines build nothing

    @classmethod
    def prepare(cls, spec: PairSpec, weights_dir: str | None) -> None:
        """Make what it reads of ``spec`` from the pair's converted weights (exports, IR), once per
        machine; the suites call it before the first real test, while no model is loaded."""
        return None  # most engines read the converted weights as they are

    @classmethod
    def resolve(cls, spec: PairSpec, **given: Any) -> RunSetup:
        """A run of pair ``spec`` on this engine (``setup.resolve``'s keywords): its own target (the
        pair's files as it runs them), its own draft at the target's settings, and a constant K,
        the pair's registered one unless given. Settings only the harness's own loop reads (draft
        precision, kernels and vocabulary, target kernels, a token tree) are refused, saying what
        this engine runs instead."""
        from harness.settings import setup

        backend = given.pop("target_backend", None)
        if backend not in (None, cls.backend or "torch"):
            raise HarnessError(
                f"engine {cls.name} runs a {cls.backend} target: drop --target_backend {backend}"
            )
        decoding = given.pop("decoding", None)
        own_loop = (
            (
                ("draft_tree", bool(decoding.draft_tree)),
                ("context_draft", bool(decoding.context_draft)),
                ("synthetic_acceptance", decoding.synthetic_acceptance is not None),
            )
            if decoding is not None
            else ()
        )
        for flag, given_here in own_loop:
            if given_here:
                raise HarnessError(
                    f"--{flag} runs in the harness's own loop, not {cls.name}'s: drop --engine {cls.name} "
                    f"or --{flag}"
                )
        for name in ("draft_precision", "draft_vocab", "draft_kernels", "target_kernels"):
            if given.pop(name, None) is not None:
                raise HarnessError(f"--{name} applies to --engine transformers; {cls.name} runs {cls.runs}")
        if (given.get("endpoint") or given.get("speculative_endpoint")) and not cls.takes_endpoints:
            raise HarnessError(
                f"--endpoint and --speculative-endpoint go with an engine that decodes over a deployment's "
                f"API; {cls.name} runs {cls.runs}: drop them"
            )
        with_draft = given.pop("with_draft", True)
        draft_device = given.pop("draft_device", "cpu")
        k = given.pop("num_assistant_tokens", None)
        if given.pop("assistant_schedule", None) not in (None, "constant"):
            raise HarnessError(f"--engine {cls.name} drafts a constant K: drop --assistant_schedule")
        target = cls.target_of(spec, **given)
        draft = setup.Draft(target.precision, device=draft_device) if with_draft else None
        return setup.settle(spec, target, draft, decoding, k, "constant")

    @classmethod
    def target_of(
        cls,
        spec: PairSpec,
        *,
        target_precision: str | None = None,
        provider: str | None = None,
        target_device: str = "cpu",
        **other: Any,
    ) -> Target:
        """The target it runs of ``spec``: the pair's files as they are (its ``precision``), or the
        pair's registered precision for an engine that takes the harness's models."""
        from harness.base.backends import DEFAULT_PROVIDER
        from harness.settings.setup import Target

        fixed = cls.precision
        if fixed is not None and target_precision not in (None, fixed):
            raise HarnessError(
                f"--engine {cls.name} runs {cls.runs}: its target precision is {fixed}, not "
                f"{target_precision} (drop --target_precision, or t= in a sweep)"
            )
        if provider not in (None, DEFAULT_PROVIDER):
            raise HarnessError(f"--engine {cls.name} runs {cls.runs}: drop --execution_provider {provider}")
        precision = fixed or target_precision or spec.target_setup.precision
        return Target(precision, "stock", cls.backend or "torch", None, target_device, cls.name)

    @classmethod
    @abc.abstractmethod
    def check(cls, spec: PairSpec, run: RunSetup) -> None:
        """Refuse, before anything loads, a run it cannot do here (one clear error, saying what it needs)."""

    @classmethod
    @abc.abstractmethod
    def load(
        cls, spec: PairSpec, run: RunSetup, *, weights_dir: str | None = None, verify: bool = False
    ) -> LoadedPair:
        """The pair, checked first (``check``), its ``engine`` the instance that decodes it."""

    @abc.abstractmethod
    def decode(self, pair: LoadedPair, prompt_ids: list[int], settings: GenerationSettings) -> Measurement:
        """One prompt decoded once, plainly or with assistance as ``settings`` say, and measured."""

    def gap(self, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> float | None:
        """The plain token's lead over ``other``'s at their first difference, in the engine's own
        logits (None: the caller reads the torch target's)."""
        return None

    def serve_concurrently(self, streams: int) -> None:  # noqa: B027 - one stream needs nothing set up
        """Make ``decode`` safe to call from ``streams`` threads at once, each request served in
        parallel with the others (a server's slots); ``max_concurrency`` bounds it."""

    def close(self) -> None:  # noqa: B027 - most engines hold nothing to stop
        """Stop what it holds (servers, pipelines): called when its pair is dropped."""
