"""What runs a pair's decoding loop: one class per engine, registered in one table.

An engine checks a ``RunSetup`` before anything loads (``check``), loads a pair for it (``load``) and
decodes one prompt of that pair into a ``timing.Measurement`` (``decode``), as transformers keeps one
class per draft strategy. ``transformers``: transformers' ``generate`` over a torch target or an ONNX
Runtime target behind an adapter (``models.load_pair``, ``generation``). ``onnxruntime-genai``: that
library's own Generator, plain and speculative, over the model builder's exports (``harness.decoding.genai``).
``llama.cpp``: llama.cpp's own server, plain and speculative, over the pair's GGUF files
(``harness.decoding.llama_server``). ``openvino``: OpenVINO GenAI's own pipelines, plain and
speculative, over the pair's GGUF files converted to IR (``harness.decoding.openvino``).
``served``: a deployment's plain and speculative endpoints over the OpenAI-compatible completions
API (``harness.decoding.served``).

Adding an engine is a module with such a class and one line in ``REGISTRY`` (the CLI's ``--engine``
offers its names). Everything above loads through ``load``.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Protocol

from harness.base.errors import HarnessError
from harness.decoding import generation
from harness.pairs import models
from harness.settings.setup import GENAI, LLAMACPP, OPENVINO, SERVED, RunSetup
from harness.theory.timing import Measurement

__all__ = ["GENAI", "LLAMACPP", "OPENVINO", "SERVED", "Engine", "REGISTRY", "check", "engine_class", "load"]


class Engine(Protocol):
    """The interface every engine class has (``load`` and ``check`` are class methods: nothing is
    held before a pair loads; the loaded pair carries the engine object that decodes it)."""

    name: ClassVar[str]

    @classmethod
    def check(cls, spec: models.PairSpec, run: RunSetup) -> None: ...

    @classmethod
    def load(
        cls, spec: models.PairSpec, run: RunSetup, *, weights_dir: str | None, verify: bool
    ) -> models.LoadedPair:
        """The pair, checked first (``check``), its ``engine`` the object that decodes it."""
        ...

    def decode(self, pair: models.LoadedPair, prompt_ids: list[int], settings: Any) -> Measurement: ...


class Transformers:
    """transformers' own ``generate`` with ``assistant_model``: what users ship."""

    name: ClassVar[str] = "transformers"

    @classmethod
    def check(cls, spec: models.PairSpec, run: RunSetup) -> None:
        models.check_run(spec, run)

    @classmethod
    def load(
        cls, spec: models.PairSpec, run: RunSetup, *, weights_dir: str | None = None, verify: bool = False
    ) -> models.LoadedPair:
        # No engine object on the pair: ``generation.generate`` runs transformers' loop itself.
        return models.load_pair(spec, run, weights_dir=weights_dir, verify=verify)  # checks the run

    def decode(self, pair: models.LoadedPair, prompt_ids: list[int], settings: Any) -> Measurement:
        return generation.generate(pair, prompt_ids, settings)


# Engine name -> "module:Class", imported when first used (an engine's runtime loads only if it runs).
REGISTRY: dict[str, str] = {
    "transformers": "harness.decoding.engines:Transformers",
    GENAI: "harness.decoding.genai:GenaiEngine",
    LLAMACPP: "harness.decoding.llama_server:LlamaCppEngine",
    OPENVINO: "harness.decoding.openvino:OpenVinoEngine",
    SERVED: "harness.decoding.served:ServedEngine",
}


def engine_class(name: str) -> type[Engine]:
    if name not in REGISTRY:
        raise HarnessError(f"engine {name!r}: choose one of {', '.join(REGISTRY)}")
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def check(spec: str | models.PairSpec, run: RunSetup) -> None:
    """Refuse, before anything loads, a run its engine cannot do here."""
    engine_class(run.target.engine).check(models.get_pair(spec), run)


def load(
    spec: str | models.PairSpec, run: RunSetup, *, weights_dir: str | None = None, verify: bool = False
) -> models.LoadedPair:
    """Pair ``spec`` loaded for ``run`` by the run's engine (which checks it first)."""
    spec = models.get_pair(spec)
    if run.pair != spec.name:
        raise HarnessError(f"a run of {run.pair} cannot load pair {spec.name}")
    return engine_class(run.target.engine).load(spec, run, weights_dir=weights_dir, verify=verify)
