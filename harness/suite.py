"""The state and work of one pytest session of the suite, under its plugin (``pytest_plugin``).

As pytest-benchmark keeps its plugin to options and hooks over a session object, the plugin here
reads options, checks them and parametrises tests; a ``SuiteSession`` holds what the session keeps
(the loaded pairs, the benchmark verdicts, the divergence table), prepares the weights before the
first real test, and says the end-of-run summaries. The plugin keeps one of these in one stash key.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.base import platforms
from harness.base.errors import UnsupportedError
from harness.decoding import engines
from harness.experiments import equivalence
from harness.pairs import models
from harness.settings import setup

# Where the suites' torch models run unless --target-device / --draft-device say otherwise.
DEFAULT_DEVICES = ("cpu", "cpu")


def devices_id(devices: tuple[str, str]) -> str | None:
    """What test ids carry of where a case's torch models run (``-k cuda`` selects): nothing on the
    default CPU, so the CPU's ids (and the baselines' case names) stay as they are."""
    if devices == DEFAULT_DEVICES:
        return None
    target, draft = (d.replace(":", "") for d in devices)
    return target if draft == "cpu" else f"{target}-draft_{draft}"


class PairCache:
    """Load each (pair, precisions, draft) once per session; skip cleanly when weights are absent."""

    def __init__(
        self, weights_dir: str | None, devices: tuple[str, str] = DEFAULT_DEVICES, provider: str | None = None
    ) -> None:
        self.weights_dir = weights_dir
        self.devices = devices  # (target, draft): where every torch pair of the session runs
        self.provider = provider  # ONNX Runtime's execution provider, for an engine that runs it
        self._loaded: dict[setup.RunSetup, models.LoadedPair] = {}

    def require_weights(self, name: str) -> None:
        spec = models.get_pair(name)
        for role, model in (("target", spec.target), ("draft", spec.draft)):
            where = models.locate_model(model, self.weights_dir)
            if not where.present:
                pytest.skip(
                    f"{role} weights for {spec.name} not present here ({where.detail}); "
                    "see README 'Model pairs' for where weights are looked for"
                )

    def get(
        self,
        name: str,
        target_precision: str | None = None,
        draft_precision: str | None = None,
        with_draft: bool = True,
        target_kernels: str | None = None,
        draft_vocab: int | None = None,
        draft_kernels: str | None = None,
        target_backend: tuple[str, str | None] = ("torch", None),
        engine: str = "transformers",
    ) -> models.LoadedPair:
        """A test's spelling of a run, resolved once: ``target_backend`` is (backend, execution
        provider), as the ``target_backend`` fixture gives; ``engine``: the pair as that engine runs
        it (its own files: exports, GGUF, IR)."""
        backend, provider = target_backend
        if engine != engines.BUILT_IN:
            # An engine with its own loop runs its own runtime, whatever backend the test is crossed with.
            backend = None
            provider = provider or (
                self.provider if engines.engine_class(engine).backend == "onnxruntime" else None
            )
        spec = models.get_pair(name)
        run = engines.resolve(
            spec,
            target_precision=target_precision,
            draft_precision=draft_precision,
            with_draft=with_draft,
            target_kernels=target_kernels,
            draft_vocab=draft_vocab,
            draft_kernels=draft_kernels,
            target_backend=backend,
            provider=provider,
            engine=engine,
        )
        return self.load(spec, run)

    def load(self, spec: models.PairSpec, run: setup.RunSetup) -> models.LoadedPair:
        """The pair loaded for ``run`` (its decoding settings aside): the run's target and draft are
        the cache's key, so two spellings of one configuration (a default given or left out) share
        one load."""
        key = dataclasses.replace(run, decoding=setup.GenerationSettings())
        if self.devices != DEFAULT_DEVICES:
            key = self._placed(spec, key)
        if key not in self._loaded:
            self.require_weights(spec.name)
            if not spec.target.is_tiny:
                # One real pair in memory at a time: a 1.5B fp32 pair is ~10 GB, a 7B one more.
                for other in [k for k in self._loaded if not models.get_pair(k.pair).target.is_tiny]:
                    _close(self._loaded.pop(other))
                gc.collect()
            self._loaded[key] = engines.load(spec, key, weights_dir=self.weights_dir)
        return self._loaded[key]

    def _placed(self, spec: models.PairSpec, key: setup.RunSetup) -> setup.RunSetup:
        """``key`` with its torch models on the session's devices. A case that cannot run there (an
        engine or ONNX Runtime target, which place their own models; kernels for the CPU only) is
        skipped, saying why; one that the CPU refuses too is the test's own failure, raised."""
        target, draft = self.devices
        if key.target.backend != "torch":
            pytest.skip(
                f"--target-device {target} / --draft-device {draft} apply to torch models in transformers' "
                f"loop; this case's target runs on its own runtime ({key.target.backend or 'its engine'}), "
                "which places its models itself"
            )
        placed = dataclasses.replace(
            key,
            target=dataclasses.replace(key.target, device=target),
            draft=dataclasses.replace(key.draft, device=draft) if key.draft is not None else None,
        )
        try:
            models.check_run(spec, placed)
        except UnsupportedError as exc:
            models.check_run(spec, key)
            pytest.skip(f"not runnable with --target-device {target} --draft-device {draft}: {exc}")
        return placed

    def clear(self) -> None:
        for pair in self._loaded.values():
            _close(pair)
        self._loaded.clear()


def _close(pair: models.LoadedPair) -> None:
    # An engine that holds processes (llama.cpp's servers) stops them when its pair is dropped.
    if pair.engine is not None:
        pair.engine.close()


def threads_for_real_models() -> int:
    # Two cores: more threads than that only adds contention. Under xdist each worker gets one, so
    # workers do not fight over cores (OpenMP spin-waits make oversubscription very slow).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, os.cpu_count() or 1) // workers)


@dataclass
class SuiteSession:
    """One pytest session of the suite: its settings, as the plugin read them, and its state."""

    weights_dir: str | None
    platform: str | None  # --platform; None: this machine's detected kind
    real_pairs: list[str]  # the real pairs this session collects (--real-pairs, --local-pair)
    local_pairs: list[str]
    target_backends: list[tuple[str, str | None]]
    divergence_out: Path | None = None
    devices: tuple[str, str] = DEFAULT_DEVICES  # --target-device, --draft-device
    provider: str | None = None  # --execution-provider
    engines: tuple[str, ...] = ()  # --engines: the engines the engine-axis tests run
    left_out: dict[str, str] = field(default_factory=dict)  # what the engine axis leaves out, and why
    threads: int = field(default_factory=threads_for_real_models)
    pairs: PairCache = field(init=False)
    bench_results: list[Any] = field(default_factory=list)  # (CaseMeasurement, gate verdict)
    _divergence: equivalence.DivergenceTable | None = None

    def __post_init__(self) -> None:
        self.pairs = PairCache(self.weights_dir, self.devices, self.provider)

    @property
    def platform_name(self) -> str:
        return self.platform or platforms.detect().name

    def divergence_table(self) -> equivalence.DivergenceTable:
        """Collects every precision-tier case; the table is said at the end of the session."""
        if self._divergence is None:
            self._divergence = equivalence.DivergenceTable(rows_path=self.divergence_out)
        return self._divergence

    def prepare_weights(self, engines_used: set[str]) -> None:
        """Before any real test: the packaged pair converted, and what each engine the run uses reads
        of it (ONNX exports, IR) made while no model is loaded (the exporter holds ~16 GB resident for
        the 1.5B, which must not meet loaded pairs in 24 GB); the ONNX Runtime target's export when
        that backend runs.

        The compiles, an engine's (llama.cpp's: minutes on a fresh machine) and the harness's own
        kernels' (one compiler process each, a minute or two), run beside the rest, which is mostly
        one Python thread: on 2 cores they overlap instead of adding up. Built, each is a cache lookup."""
        import concurrent.futures

        classes = [engines.engine_class(name) for name in sorted(engines_used)]
        spec = models.get_pair(models.DEFAULT_PAIR)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            builds = [pool.submit(self._build_kernels), *(pool.submit(cls.build) for cls in classes)]
            models.prepare_packaged(export_target="onnxruntime" in dict(self.target_backends))
            for cls in classes:
                if cls.unfit(spec) is None:
                    cls.prepare(spec, self.weights_dir)
            for build in builds:
                build.result()  # before any test times anything; a failed build raises here

    @staticmethod
    def _build_kernels() -> None:
        """The batch-invariant and k-quant kernels built (once per machine and torch version); where
        they cannot be, the tests that use them say why, as they would without this."""
        from harness.kernels import fused, invariant, kquants

        try:
            for kernels in (invariant, kquants, fused):
                kernels.extension()
        except UnsupportedError:
            return

    def summaries(self) -> list[tuple[str, list[str]]]:
        """The end-of-run sections: (title, lines)."""
        sections = []
        table = self._divergence
        if table is not None and table.counts:
            title = "divergence of assisted from plain greedy output, per target precision"
            sections.append((title, [table.markdown()]))
        if self.bench_results:
            from harness.report import bench as bench_report

            lines = [
                f"machine: {platforms.detect().describe()}",
                bench_report.summary_table(self.bench_results),
            ]
            sections.append(("benchmark: plain vs assisted decoding", lines))
        return sections

    def close(self) -> None:
        self.pairs.clear()
