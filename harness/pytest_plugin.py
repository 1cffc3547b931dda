"""The suite's pytest plugin (entry point ``pytest11: assisted_generation``): options, markers,
parametrisation over registered pairs and target backends, the session's pair cache, weight
preparation and the end-of-run summaries.

Installed with the harness, it serves this repository's ``tests/`` and ``perf/`` and any other
repository's tests alike (``pytest --help`` lists its options under "assisted generation").

Test IDs carry the pair name (``pytest perf -k codellama`` selects tiny-codellama and
CodeLlama-7b-hf). Pairs are parametrised from the registry: tiny stand-ins always run; real pairs
carry the ``real`` and ``slow`` markers and skip with the place their weights were looked for when
they are absent. Loaded pairs are cached per session by the ``pairs`` fixture, not globally.

Tests that take a ``target_backend`` fixture are crossed with the target backends of
``--target-backends``: torch keeps the plain pair id, ONNX Runtime adds ``-onnxruntime-<provider>``
(``-k onnxruntime`` selects those). Pairs whose architecture the ONNX exporter does not write are
not crossed with it.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harness import backends, engines, equivalence, models, platforms, precision, results, setup
from harness.errors import HarnessError

TINY = [p.name for p in models.list_pairs() if p.target.is_tiny]
REAL = [p.name for p in models.list_pairs() if not p.target.is_tiny]
# Tiny pairs crossed with the ONNX Runtime target: the offline pair's family and Llama's (the
# exporter's two code paths the registry uses); more would only repeat them at more test time.
ORT_TINY = ("tiny-qwen2", "tiny-llama")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("assisted generation")
    group.addoption(
        "--weights_dir",
        "--weights-dir",
        default=None,
        help="folder holding real model folders (also ASSISTED_GENERATION_WEIGHTS)",
    )
    group.addoption(
        "--platform",
        default=None,
        help="platform name keying baselines/ and results/ (default: detected from this machine)",
    )
    group.addoption(
        "--update-baselines",
        action="store_true",
        help="rewrite baselines/<platform>/ from this run's measurements instead of gating",
    )
    group.addoption(
        "--regen-tables",
        action="store_true",
        help="rewrite results/<platform>/<model>.md and speedup PNGs from stored rows",
    )
    group.addoption(
        "--real-prompts",
        type=int,
        default=1,
        help="prompts per real-weights case (CI keeps this short; raise it for a full run)",
    )
    group.addoption(
        "--divergence-out",
        default=None,
        help="JSONL file that gets one row per precision-tier prompt as it finishes (appended)",
    )
    group.addoption(
        "--allow-inconclusive",
        action="store_true",
        help="let a benchmark case whose speedup gate stays inconclusive (a noisy or busy run) pass with a "
        "warning, even when its estimate lies beyond the margin (by default the estimate then decides)",
    )
    group.addoption(
        "--perf-repetitions",
        type=int,
        default=5,
        help="interleaved plain/assisted repetitions per benchmark case",
    )
    group.addoption(
        "--humaneval-limit",
        type=int,
        default=2,
        help="HumanEval problems for the real-pair pass@1 test (164 for the full run)",
    )
    group.addoption(
        "--humaneval-precision",
        default=None,
        metavar="TARGET[,DRAFT]",
        help="precisions of the real-pair HumanEval run, both on the batch-invariant kernels (default: "
        "the pair's registered configuration); its rows are named by them",
    )
    group.addoption(
        "--humaneval-out",
        default=None,
        help="folder for HumanEval rows (JSONL, resumable) and the speedup plot; default: a temp dir",
    )
    group.addoption(
        "--target-backends",
        default="torch,onnxruntime",
        help="comma-separated target backends the decode, benchmark and HumanEval suites cross with "
        "(torch, onnxruntime)",
    )
    group.addoption(
        "--execution-provider",
        default=backends.DEFAULT_PROVIDER,
        help="ONNX Runtime execution provider of the onnxruntime target (default: the CPU one)",
    )
    group.addoption(
        "--real-pairs",
        default="qwen2.5-coder-1.5b",
        help="comma-separated real pairs to include ('all' for every registered pair)",
    )
    group.addoption(
        "--local-pair",
        action="append",
        default=[],
        metavar="NAME=TARGET[,DRAFT]",
        help="also run every pair test on a pair of local Hugging Face folders, named NAME in test ids "
        "(repeatable; without DRAFT the target drafts for itself)",
    )


MARKERS = (
    "slow: takes more than a few seconds (real models, long sweeps)",
    "real: needs real weights (the offline pair after set-up, or 7B pairs present locally)",
    "perf: timing benchmark; runs serially, never under xdist",
    "pairs(tiny=True, real=True): which registered pairs a pair_name test is parametrised over",
    "backends(*names): the target backends a target_backend test is crossed with (default: all selected)",
)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    models.offline_env()
    _register_local_pairs(config)
    _check_options(config)
    config.stash[THREADS] = _threads_for_real_models()


def _check_options(config: pytest.Config) -> None:
    """Option values that would make a run test less than it says, refused before collection."""
    problems = []
    for option in ("--real-prompts", "--humaneval-limit"):
        value = config.getoption(option)
        if value < 1:
            problems.append(f"{option} must be at least 1 (got {value})")
    if config.getoption("--perf-repetitions") < 2:
        problems.append("--perf-repetitions must be at least 2: a confidence interval needs two rounds")
    chosen = [b.strip() for b in config.getoption("--target-backends").split(",") if b.strip()]
    if not chosen:
        problems.append("--target-backends names no backend; give torch, onnxruntime or both")
    for name in chosen:
        try:
            backends.check_backend(name)
        except HarnessError as exc:
            problems.append(f"--target-backends: {exc}")
    provider = config.getoption("--execution-provider")
    if provider != backends.DEFAULT_PROVIDER:
        try:
            backends.check_provider(provider)
        except HarnessError as exc:
            problems.append(f"--execution-provider: {exc}")
    problems += _path_problems(config)
    wanted = config.getoption("--real-pairs")
    if wanted.strip().lower() != "all":
        names = [w.strip() for w in wanted.split(",") if w.strip()]
        unknown = [n for n in names if n.lower() not in {r.lower() for r in REAL}]
        if unknown or not names:
            problems.append(
                f"--real-pairs {wanted!r}: unknown {', '.join(unknown) or '(empty)'}; choose from "
                f"{', '.join(REAL)} or 'all'"
            )
    try:
        humaneval_precisions(config.getoption("--humaneval-precision"))
    except HarnessError as exc:
        problems.append(str(exc))
    value = config.getoption("--weights_dir")
    if value is not None and not Path(value).expanduser().is_dir():
        problems.append(f"--weights_dir {value} is not a folder")
    if problems:
        raise pytest.UsageError("; ".join(problems))


def _path_problems(config: pytest.Config) -> list[str]:
    """Where the run would write, checked as the command line checks its own flags."""
    out = []
    divergence = config.getoption("--divergence-out")
    if divergence is not None:
        try:
            results.check_rows_path(Path(divergence), "--divergence-out", equivalence.ROW_KEYS)
        except HarnessError as exc:
            out.append(str(exc))
    try:
        results.check_out_folder("--humaneval-out", config.getoption("--humaneval-out"))
    except HarnessError as exc:
        out.append(str(exc))
    name = config.getoption("--platform")
    if name is not None and name != platforms.slug(name):
        # It names a folder under baselines/ and results/: nothing else may reach outside them.
        out.append(
            f"--platform {name!r} must be a slug (lower-case letters, digits and '-'), e.g. "
            f"{platforms.slug(name) or 'my-laptop-8c'!r}: it names folders under baselines/ and results/"
        )
    return out


def humaneval_precisions(value: str | None) -> dict[str, str]:
    """``--humaneval-precision TARGET[,DRAFT]`` as ``PairCache.get`` settings (the draft at the
    target's precision unless named), both on the batch-invariant kernels, which keep assisted
    output token for token plain's; {} when not given."""
    if value is None:
        return {}
    names = [v.strip() for v in value.split(",")]
    known = (*precision.PRECISIONS, *precision.BLOCK_PRECISIONS)
    if not 1 <= len(names) <= 2 or any(n not in known for n in names):
        raise HarnessError(
            f"--humaneval-precision {value!r}: give TARGET or TARGET,DRAFT, each one of {', '.join(known)}"
        )
    target, draft = names[0], names[-1]
    return dict(
        target_precision=target, draft_precision=draft, target_kernels="invariant", draft_kernels="invariant"
    )


THREADS = pytest.StashKey[int]()


def _threads_for_real_models() -> int:
    # Two cores: more threads than that only adds contention. Under xdist each worker gets one, so
    # workers do not fight over cores (OpenMP spin-waits make oversubscription very slow).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, os.cpu_count() or 1) // workers)


@pytest.fixture(autouse=True)
def _torch_threads(request: pytest.FixtureRequest) -> None:
    """Tiny models run fastest on one thread (their matmuls are too small to split, and a second
    thread only spins); real models get the cores."""
    real = request.node.get_closest_marker("real") is not None
    torch.set_num_threads(request.config.stash[THREADS] if real else 1)


def _real_selected(config: pytest.Config) -> list[str]:
    wanted = config.getoption("--real-pairs")
    local = config.stash.get(LOCAL_PAIRS, [])
    if wanted.strip().lower() == "all":
        return REAL + local
    names = {w.strip().lower() for w in wanted.split(",") if w.strip()}
    return [n for n in REAL if n.lower() in names] + local


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What a run with a local pair will also do, said before it starts."""
    local = config.stash.get(LOCAL_PAIRS, [])
    if local and "onnxruntime" in dict(target_backends(config)):
        return [
            f"local pair(s) {', '.join(local)}: their ONNX Runtime cases export each target once (about "
            "17 GB of memory and 1.5 min for a 1.5B model); --target-backends torch leaves them out"
        ]
    return []


def real_pairs_left_out(config: pytest.Config) -> list[str]:
    """Registered real pairs a ``-k`` expression names that this run does not collect (not in
    ``--real-pairs``): ``pytest perf -k codellama`` would otherwise pass on the tiny stand-in alone
    without a word about the real CodeLlama cases."""
    import re

    words = {w for w in re.findall(r"[\w.\-]+", (config.getoption("keyword") or "").lower())}
    words -= {"and", "or", "not"}
    selected = {n.lower() for n in _real_selected(config)}
    return [n for n in REAL if n.lower() not in selected and any(w in n.lower() for w in words)]


LOCAL_PAIRS = pytest.StashKey[list]()


def _register_local_pairs(config: pytest.Config) -> None:
    """``--local-pair NAME=TARGET[,DRAFT]``: pairs of the user's own folders, registered under NAME
    for this run (their configs are read now: a wrong folder is a usage error, not 40 failed tests)."""
    import dataclasses

    names = []
    for text in config.getoption("--local-pair"):
        name, eq, folders = (part.strip() for part in text.partition("="))
        paths = [f.strip() for f in folders.split(",") if f.strip()]
        if not eq or not name or not 1 <= len(paths) <= 2:
            raise pytest.UsageError(f"--local-pair {text!r}: write NAME=TARGET_FOLDER[,DRAFT_FOLDER]")
        try:
            spec = models.local_pair(paths[0], paths[1] if len(paths) > 1 else None)
            models.register_pair(dataclasses.replace(spec, name=name))
        except HarnessError as exc:
            raise pytest.UsageError(f"--local-pair {text!r}: {exc}") from None
        names.append(name)
    config.stash[LOCAL_PAIRS] = names


def pair_params(config: pytest.Config, *, tiny: bool = True, real: bool = True) -> list:
    """Every pair as a pytest param whose id is the pair name; real ones marked real+slow."""
    params = [pytest.param(n, id=n) for n in TINY] if tiny else []
    if real:
        params += [
            pytest.param(n, id=n, marks=[pytest.mark.real, pytest.mark.slow]) for n in _real_selected(config)
        ]
    return params


def target_backends(config: pytest.Config) -> list[tuple[str, str | None]]:
    """(backend, provider) pairs selected by --target-backends, checked up front."""
    out = []
    for name in (b.strip() for b in config.getoption("--target-backends").split(",") if b.strip()):
        backends.check_backend(name)
        provider = config.getoption("--execution-provider") if name == "onnxruntime" else None
        out.append((name, provider))
    return out


def backend_params(config: pytest.Config, params: list, only: tuple[str, ...] | None = None) -> list:
    """``params`` (pair params) crossed with the selected target backends (those in ``only``, the
    ``backends`` marker's, if given), ids carrying both."""
    crossed = []
    for backend, provider in target_backends(config):
        if only is not None and backend not in only:
            continue
        for p in params:
            name = p.values[0]
            if backend == "onnxruntime":
                spec = models.get_pair(name)
                if spec.family not in backends.ORT_FAMILIES or (spec.target.is_tiny and name not in ORT_TINY):
                    continue
                crossed.append(
                    pytest.param(name, (backend, provider), id=f"{p.id}-{backend}-{provider}", marks=p.marks)
                )
            else:
                crossed.append(pytest.param(name, (backend, None), id=p.id, marks=p.marks))
    return crossed


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pair_name" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("pairs")
        kinds = marker.kwargs if marker else {}
        params = pair_params(metafunc.config, tiny=kinds.get("tiny", True), real=kinds.get("real", True))
        if "target_backend" in metafunc.fixturenames:
            only = metafunc.definition.get_closest_marker("backends")
            crossed = backend_params(metafunc.config, params, only.args if only else None)
            metafunc.parametrize("pair_name,target_backend", crossed)
        else:
            metafunc.parametrize("pair_name", params)


class PairCache:
    """Load each (pair, precisions, draft) once per session; skip cleanly when weights are absent."""

    def __init__(self, weights_dir: str | None) -> None:
        self.weights_dir = weights_dir
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
        """``target_backend``: (backend, execution provider), as the ``target_backend`` fixture gives;
        ``engine="onnxruntime-genai"``: the pair as that engine runs it (the builder's exports)."""
        backend, provider = target_backend
        spec = models.get_pair(name)
        run = setup.resolve(
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
        if key not in self._loaded:
            self.require_weights(spec.name)
            if not spec.target.is_tiny:
                # One real pair in memory at a time: a 1.5B fp32 pair is ~10 GB, a 7B one more.
                for other in [k for k in self._loaded if not models.get_pair(k.pair).target.is_tiny]:
                    del self._loaded[other]
                gc.collect()
            self._loaded[key] = engines.load(spec, key, weights_dir=self.weights_dir)
        return self._loaded[key]

    def clear(self) -> None:
        self._loaded.clear()


@pytest.fixture(scope="session")
def pairs(pytestconfig: pytest.Config) -> Iterator[PairCache]:
    cache = PairCache(pytestconfig.getoption("--weights_dir"))
    yield cache
    cache.clear()


@pytest.fixture(scope="session")
def selected_target_backends(pytestconfig: pytest.Config) -> list[tuple[str, str | None]]:
    return target_backends(pytestconfig)


@pytest.fixture(scope="session")
def platform_name(pytestconfig: pytest.Config) -> str:
    return pytestconfig.getoption("--platform") or platforms.detect().name


@pytest.fixture(scope="session")
def real_prompts(pytestconfig: pytest.Config) -> int:
    return pytestconfig.getoption("--real-prompts")


# --------------------------------------------------------------------------- timed benchmarks (harness.bench)

BENCH_RESULTS = pytest.StashKey[list]()


def under_xdist(config: pytest.Config) -> bool:
    """True inside a pytest-xdist worker (its env var, or the workerinput xdist gives each worker)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) or hasattr(config, "workerinput")


@pytest.fixture(autouse=True)
def _perf_runs_serially(request: pytest.FixtureRequest) -> None:
    # Parallel workers share the cores, so every timing they took would measure each other.
    if request.node.get_closest_marker("perf") is not None and under_xdist(request.config):
        pytest.skip("perf benchmarks are timed and must run serially; run without -n")


@pytest.fixture(scope="session")
def bench_results(pytestconfig: pytest.Config) -> list:
    """(CaseMeasurement, gate verdict) of every benchmark case; printed as one table at the end."""
    return pytestconfig.stash.setdefault(BENCH_RESULTS, [])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    _divergence_summary(terminalreporter, config)
    left_out = real_pairs_left_out(config)
    if left_out:
        terminalreporter.section("real pairs not collected")
        terminalreporter.write_line(
            f"-k {config.getoption('keyword')!r} names real pairs this run did not collect: "
            f"{', '.join(left_out)} (real cases run for --real-pairs only, here "
            f"{', '.join(_real_selected(config)) or 'none'}); add --real-pairs {','.join(left_out)} and "
            "--weights_dir DIR (where their weights are; see README 'Model pairs') to include them"
        )
    entries = config.stash.get(BENCH_RESULTS, None)
    if entries:
        from harness import platforms
        from harness.report import bench as bench_report

        terminalreporter.section("benchmark: plain vs assisted decoding")
        terminalreporter.write_line(f"machine: {platforms.detect().describe()}")
        terminalreporter.write_line(bench_report.summary_table(entries))
    if config.getoption("--regen-tables") and not under_xdist(config):
        from harness import report, results

        # After the tests, so rows this session wrote are in the tables; no model is run here.
        terminalreporter.section("regenerated tables (--regen-tables)")
        rows_dir = config.rootpath / "results" / "rows"
        files = sorted(rows_dir.glob("*.jsonl"))
        if not files:
            terminalreporter.write_line(
                f"no row files under {rows_dir}; run a benchmark, or the CLI with --json, first"
            )
            return
        for path in report.regen_results(results.iter_rows(files), config.rootpath / "results"):
            terminalreporter.write_line(str(path))
        from harness.report import page

        terminalreporter.write_line(str(page.write_results_page(config.rootpath / "results")))


@pytest.fixture(scope="session", autouse=True)
def _convert_packaged_weights(request: pytest.FixtureRequest) -> None:
    """On a fresh machine, convert the packaged pair once before any real test runs, so tests that
    check "loads from the cache in seconds" or skip when unconverted see the state after set-up."""
    if not any(item.get_closest_marker("real") for item in request.session.items):
        return
    from harness import packaged

    for key in packaged.PACKAGED:
        model = packaged.get_model(key)
        if packaged.parts_status(model).complete and not packaged.is_converted(model):
            packaged.ensure_converted(key)  # file-locked: safe under xdist workers too
    _export_onnx_targets(request.config, request.session.items)


def _export_onnx_targets(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Export the offline pair for the ONNX Runtime tests now, before any test holds a model: the
    exporter peaks at ~17 GB for the 1.5B, which must not meet loaded pairs in 24 GB. The draft is
    exported too when the onnxruntime-genai engine's tests run (its speculation needs both)."""
    from harness import packaged
    from harness.backends import OrtSettings

    spec = models.get_pair(models.DEFAULT_PAIR)
    roles = [spec.target] if "onnxruntime" in dict(target_backends(config)) else []
    if any("onnxruntime_genai" in item.nodeid for item in items):
        roles = [spec.target, spec.draft]
    for role in roles:
        model = packaged.get_model(role.packaged_key)
        if packaged.is_converted(model):
            gc.collect()  # whatever a conversion or export just left behind, before the next exporter
            models.export_ort_target(
                role.name, packaged.converted_dir(model), OrtSettings(provider=backends.DEFAULT_PROVIDER)
            )


# --------------------------------------------------------------------------- divergence table

DIVERGENCE = pytest.StashKey[equivalence.DivergenceTable]()


@pytest.fixture(scope="session")
def divergence_table(pytestconfig: pytest.Config) -> equivalence.DivergenceTable:
    """Collects every precision-tier case; the table is printed in the terminal summary."""
    out = pytestconfig.getoption("--divergence-out")
    table = equivalence.DivergenceTable(rows_path=Path(out) if out else None)
    return pytestconfig.stash.setdefault(DIVERGENCE, table)


def _divergence_summary(terminalreporter, config: pytest.Config) -> None:
    table = config.stash.get(DIVERGENCE, None)
    if table is not None and table.counts:
        terminalreporter.section("divergence of assisted from plain greedy output, per target precision")
        terminalreporter.write_line(table.markdown())
