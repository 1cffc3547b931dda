"""What runs a pair's decoding loop, chosen in one place.

``transformers``: transformers' ``generate`` over a torch target or an ONNX Runtime target behind an
adapter (``models.load_pair``). ``onnxruntime-genai``: that library's own Generator, plain and
speculative, over the model builder's exports (``harness.genai``). Either way the caller gets a
``LoadedPair``; ``generation.generate`` runs it (a pair with a ``decoder`` of its own is decoded by
it). The CLI, the sweep and the pytest plugin load through ``load``, so a new engine is a name in
``setup.ENGINES`` and a branch here.
"""

from __future__ import annotations

from typing import Any

from harness import backends, models
from harness.errors import HarnessError
from harness.setup import ENGINES, GENAI, GenerationSettings

# Settings of transformers' loop that the engine does not take (it runs the builder's exports, the
# draft at the target's settings): refused when given, rather than silently ignored.
NOT_FOR_GENAI = ("draft_precision", "draft_vocab", "draft_kernels", "target_kernels")


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise HarnessError(f"engine {engine!r}: choose one of {', '.join(ENGINES)}")
    return engine


def check_settings(engine: str, settings: GenerationSettings) -> None:
    """Refuse, before anything loads, decoding settings the engine cannot run."""
    if check_engine(engine) == GENAI:
        from harness import genai

        genai.check_settings(settings)


def load(
    spec: str | models.PairSpec,
    *,
    engine: str = "transformers",
    with_draft: bool = True,
    weights_dir: str | None = None,
    verify: bool = False,
    target_precision: str | None = None,
    execution_provider: str | None = None,
    ort_block_size: int = backends.OrtSettings.block_size,
    ort_accuracy_level: int = backends.OrtSettings.accuracy_level,
    **settings: Any,
) -> models.LoadedPair:
    """Pair ``spec`` as ``engine`` runs it; ``settings`` are ``models.load_pair``'s (precisions,
    kernels, draft vocabulary, devices, target backend). onnxruntime-genai always runs an ONNX
    Runtime target on ``execution_provider``, at ``target_precision`` int4 (default) or fp32."""
    spec = models.get_pair(spec)
    provider = execution_provider or backends.DEFAULT_PROVIDER
    if check_engine(engine) == GENAI:
        from harness import genai

        for name in NOT_FOR_GENAI:
            if settings.get(name) is not None:
                raise HarnessError(
                    f"--{name} applies to --engine transformers; onnxruntime-genai runs the builder's "
                    "exports (set their precision with --target_precision int4|fp32 and --ort_*)"
                )
        ort = backends.OrtSettings(
            target_precision or "int4", ort_block_size, ort_accuracy_level, provider
        ).validate()
        pair, _ = genai.prepare(spec, ort, with_draft=with_draft, weights_dir=weights_dir, verify=verify)
        return pair
    return models.load_pair(
        spec,
        target_precision=target_precision,
        execution_provider=provider,
        ort_block_size=ort_block_size,
        ort_accuracy_level=ort_accuracy_level,
        with_draft=with_draft,
        weights_dir=weights_dir,
        verify=verify,
        **settings,
    )
