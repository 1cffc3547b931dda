"""The engines a run can name: every class registered under the entry-point group
``assisted_generation.engines``, the built-in ones included (this package's ``pyproject.toml``).

Built in: ``transformers`` (transformers' ``generate``, and the harness's own token-tree loop, over a
torch target or an ONNX Runtime target behind an adapter; ``harness.decoding.generation``),
``onnxruntime-genai`` (its Generator over the model builder's exports; ``genai``), ``llama.cpp`` (its
server over GGUF files; ``llama_server``), ``openvino`` (OpenVINO GenAI's pipelines over GGUF files
converted to IR; ``openvino``) and ``served`` (a deployment's OpenAI-compatible endpoints; ``served``).
Another package adds one by naming its ``harness.decoding.base.Engine`` subclass in the same group;
its runtime is imported only when a run names it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import metadata
from typing import Any

from harness.base.errors import HarnessError
from harness.decoding.base import Engine, test_id
from harness.pairs import models
from harness.settings.setup import RunSetup, Target

__all__ = ["GROUP", "Engine", "check", "engine_class", "load", "names", "resolve", "sweep_target", "test_id"]

GROUP = "assisted_generation.engines"
BUILT_IN = "transformers"  # always registered by the harness itself


@functools.cache
def _registered() -> dict[str, metadata.EntryPoint]:
    found: dict[str, metadata.EntryPoint] = {}
    for point in metadata.entry_points(group=GROUP):
        if point.name in found and found[point.name].value != point.value:
            raise HarnessError(
                f"two installed packages register the engine {point.name!r} ({found[point.name].value} and "
                f"{point.value}): uninstall one of them"
            )
        found[point.name] = point
    if BUILT_IN not in found:
        raise HarnessError(
            f"no engines are registered (entry-point group {GROUP}): install the harness with "
            "python -m pip install --no-deps --no-build-isolation -e ."
        )
    return found


def names() -> tuple[str, ...]:
    """Every registered engine's name: the harness's own loop first, then the others by name."""
    return (BUILT_IN, *sorted(n for n in _registered() if n != BUILT_IN))


@functools.cache
def engine_class(name: str) -> type[Engine]:
    """The class registered as ``name``, imported now (a failure is one line saying which package)."""
    registered = _registered()
    if name not in registered:
        raise HarnessError(f"unknown engine {name!r}: choose one of {', '.join(names())}")
    point = registered[name]
    try:
        cls = point.load()
    except Exception as exc:  # noqa: BLE001 - any import failure of a plug-in is the user's to mend
        where = f" (package {point.dist.name})" if point.dist is not None else ""
        raise HarnessError(
            f"engine {name!r} from {point.value}{where} failed to import: {type(exc).__name__}: {exc}; "
            "mend or reinstall that package, or leave the engine out"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Engine)) or cls.name != name:
        raise HarnessError(
            f"engine {name!r} names {point.value}, which is not a harness.decoding.base.Engine subclass "
            f"whose name is {name!r}"
        )
    return cls


def resolve(spec: str | models.PairSpec, *, engine: str = BUILT_IN, **given: Any) -> RunSetup:
    """A run of pair ``spec`` on ``engine``, every setting not given the pair's registered one (the
    keywords of ``harness.settings.setup.resolve``; an engine refuses those it does not read)."""
    return engine_class(engine).resolve(models.get_pair(spec), **given)


def sweep_target(spec: str | models.PairSpec) -> Callable[[str, str | None], Target]:
    """How the sweep reads ``engine=NAME`` (with ``t``, or without) for pair ``spec``: that engine's
    own target (``settings.configs.EngineTarget``)."""
    spec = models.get_pair(spec)

    def target(name: str, precision: str | None) -> Target:
        cls = engine_class(name)
        if cls.name == BUILT_IN:
            raise HarnessError(
                "engine=transformers is the sweep's own loop: leave engine out and choose kernels"
            )
        return cls.target_of(spec, target_precision=precision)

    return target


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
