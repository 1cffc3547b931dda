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
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harness import suite
from harness.base import backends, devices, platforms, tasks
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.experiments import acceptance as acceptance_tier
from harness.experiments import equivalence
from harness.pairs import models
from harness.settings import baselines, precision, results

DEFAULT_BACKENDS = "torch,onnxruntime"
TINY = [p.name for p in models.list_pairs() if p.target.is_tiny]
REAL = [p.name for p in models.list_pairs() if not p.target.is_tiny]
# Tiny pairs crossed with the ONNX Runtime target: the offline pair's family and Llama's (the
# exporter's two code paths the registry uses); more would only repeat them at more test time.
ORT_TINY = ("tiny-qwen2", "tiny-llama")


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's, whose --benchmark-compare help it rewrites
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
        "--prompts",
        default=None,
        metavar="SET[,SET]",
        help="the prompt sets the real tiers decode, taken in turn (general, code, mixed or a task category; "
        "see python assisted_generation.py --list-prompts); default: the mixed prompts, then HumanEval's",
    )
    group.addoption(
        "--acceptance-prompts",
        type=int,
        default=acceptance_tier.TIER_PROMPTS,
        help="prompts the acceptance tier runs per configuration (the mixed prompts, then HumanEval's); "
        "it is held to its reference over the prompts it ran",
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
        default=DEFAULT_BACKENDS,
        help="comma-separated target backends the decode, benchmark and HumanEval suites cross with "
        "(torch, onnxruntime; by default onnxruntime where its runtime is installed)",
    )
    group.addoption(
        "--execution-provider",
        default=backends.DEFAULT_PROVIDER,
        help="ONNX Runtime execution provider of the onnxruntime target (default: the CPU one)",
    )
    group.addoption(
        "--engines",
        default="all",
        metavar="NAME[,NAME]",
        help="the engines the engine-axis tests run (-m engine selects those tests; 'all': every "
        "registered engine with a loop of its own whose runtime is here)",
    )
    group.addoption(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="the llama-server binary the llama.cpp engine runs (also ASSISTED_GENERATION_LLAMA_SERVER; "
        "default: llama.cpp built once from source on first use)",
    )
    group.addoption(
        "--target-device",
        default="cpu",
        help="where the suites' torch targets run: cpu, cuda[:N] (the seeds' split: the target on the "
        "accelerator, the draft on the CPU)",
    )
    group.addoption("--draft-device", default="cpu", help="where the suites' torch drafts run: cpu, cuda[:N]")
    group.addoption(
        "--real-pairs",
        default="qwen2.5-coder-1.5b",
        help="comma-separated real pairs to include ('all' for every registered pair)",
    )
    group.addoption(
        "--local-pair",
        action="append",
        default=[],
        metavar="NAME=TARGET[,DRAFT][@PRECISION[,PRECISION]]",
        help="also run every pair test on a pair of your own files (Hugging Face folders, .gguf files, "
        "the model builder's output), named NAME in test ids (repeatable; without DRAFT the target drafts "
        "for itself; @q4k,q4k runs them at those precisions, on the batch-invariant kernels; default fp32)",
    )
    for option in group.options:
        attrs = option.attrs()
        if attrs.get("default") not in (None, False, [], "") and "default" not in str(attrs.get("help")):
            attrs["help"] = f"{attrs['help']} (default: {attrs['default']})"
    for option in parser.getgroup("benchmark").options:
        if "--benchmark-compare" in option.names():
            option.attrs()["help"] = (
                "compare this run with this platform's committed baseline, baselines/<platform>/ (the "
                "--platform slug, else this machine's), or with run NUM of --benchmark-storage when that "
                "is given; --benchmark-compare-fail=median:10%% fails on the gating ratio entries"
            )


MARKERS = (
    "slow: takes more than a few seconds (real models, long sweeps)",
    "real: needs real weights (the offline pair after set-up, or 7B pairs present locally)",
    "perf: timing benchmark; runs serially, never under xdist",
    "pairs(tiny=True, real=True): which registered pairs a pair_name test is parametrised over",
    "backends(*names): the target backends a target_backend test is crossed with (default: all selected)",
    "engine: an engine-axis test, crossed with the engines of --engines (each case also carries its "
    "engine's own marker, e.g. llama_cpp, openvino, onnxruntime_genai)",
    "engines(mode=None, built_in=False): what an engine-axis test needs of an engine (mode: a decoding "
    "mode it must run; built_in: transformers' loop is crossed too)",
)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    for name in engines.names():
        config.addinivalue_line("markers", f"{engines.test_id(name)}: runs the {name} engine")
    models.offline_env()
    local = _register_local_pairs(config)
    _check_options(config)
    out = config.getoption("--divergence-out")
    _benchmark_storage(config)
    chosen, left_out = selected_engines(config)
    config.stash[SESSION] = suite.SuiteSession(
        weights_dir=config.getoption("--weights_dir"),
        platform=config.getoption("--platform"),
        real_pairs=_real_selected(config, local),
        local_pairs=local,
        target_backends=target_backends(config, left_out),
        divergence_out=Path(out) if out else None,
        devices=(config.getoption("--target-device"), config.getoption("--draft-device")),
        provider=config.getoption("--execution-provider"),
        engines=chosen,
        left_out=left_out,
    )


def selected_engines(config: pytest.Config) -> tuple[tuple[str, ...], dict[str, str]]:
    """The engines of ``--engines`` and, for ``all``, the registered ones left out with why (said
    once at the end of the run, never as a skip per test). An engine named on purpose that cannot run here
    is a usage error."""
    wanted = config.getoption("--engines").strip()
    left_out: dict[str, str] = {}
    try:
        if wanted.lower() != "all":
            names = [n.strip() for n in wanted.split(",") if n.strip()]
            if not names:
                raise HarnessError("--engines names no engine")
            for name in names:
                cls = engines.engine_class(name)
                why = cls.missing() or (None if cls.in_suites else f"the suites cannot run {cls.runs}")
                if why:
                    raise HarnessError(f"--engines {name}: {why}")
            return tuple(names), left_out
        chosen = []
        for name in engines.names():
            try:
                cls = engines.engine_class(name)
            except HarnessError as exc:
                left_out[f"engine {name} not run here"] = str(exc)
                continue
            if not cls.own_draft:
                continue  # the harness's own loop: its tiers run over precisions, kernels and backends
            why = cls.missing() or (None if cls.in_suites else f"the suites cannot run {cls.runs}")
            if why:
                left_out[f"engine {name} not run here"] = why
            else:
                chosen.append(name)
        return tuple(chosen), left_out
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None


# The session's state and work (harness.suite); the plugin keeps only this.
SESSION = pytest.StashKey[suite.SuiteSession]()


def session_of(config: pytest.Config) -> suite.SuiteSession:
    return config.stash[SESSION]


def _check_options(config: pytest.Config) -> None:
    """Option values that would make a run test less than it says, refused before collection."""
    problems = []
    sets = config.getoption("--prompts")
    if sets:
        names = [n.strip() for n in sets.split(",") if n.strip()]
        unknown = [n for n in names if n not in tasks.PROMPT_SETS]
        if unknown or not names:
            problems.append(
                f"--prompts {sets!r}: unknown prompt set {', '.join(unknown) or sets!r}; use "
                f"{', '.join(tasks.PROMPT_SETS)}, several joined by commas"
            )
    for option in ("--real-prompts", "--humaneval-limit", "--acceptance-prompts"):
        value = config.getoption(option)
        if value < 1:
            problems.append(f"{option} must be at least 1 (got {value})")
    if config.getoption("--perf-repetitions") < 2:
        problems.append("--perf-repetitions must be at least 2: a confidence interval needs two rounds")
    for option in ("--target-device", "--draft-device"):
        try:
            devices.check_device(config.getoption(option))
        except HarnessError as exc:
            problems.append(f"{option}: {exc}")
    chosen = [b.strip() for b in config.getoption("--target-backends").split(",") if b.strip()]
    if not chosen:
        problems.append("--target-backends names no backend; give torch, onnxruntime or both")
    for name in chosen:
        try:
            backends.check_backend(name)
        except HarnessError as exc:
            if config.getoption("--target-backends") != DEFAULT_BACKENDS:  # the default leaves it out
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
    for name in engines.names():
        try:
            cls = engines.engine_class(name)
            cls.take_options({option: config.getoption(option, None) for option in cls.options})
        except HarnessError as exc:
            if config.getoption("--engines").strip().lower() != "all" or "failed to import" not in str(exc):
                problems.append(str(exc))  # a broken plug-in is said once by the engine axis instead
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


# --------------------------------------------------------------------------- pytest-benchmark


def baselines_root(config: pytest.Config) -> Path:
    """Where the committed per-platform baselines are (pytest-benchmark storages, one per platform)."""
    return config.rootpath / "baselines"


def _benchmark_storage(config: pytest.Config) -> None:
    """``--benchmark-compare`` against this platform's committed baseline unless told otherwise, and
    every compare input checked before anything runs (pytest-benchmark itself would create a missing
    storage folder and warn, or compare nothing). Runs before pytest-benchmark's own configure (it
    is a ``trylast`` hook), which reads the storage option."""
    compare = config.getoption("benchmark_compare", None)
    if not compare:
        return
    args = config.invocation_params.args
    told = any(str(a).startswith("--benchmark-storage") for a in args)
    saving = config.getoption("benchmark_save", None) or config.getoption("benchmark_autosave", None)
    if not told and not saving:
        platform = config.getoption("--platform") or platforms.detect().name
        root = baselines_root(config)
        if not baselines.storage_file(root, platform).is_file():
            have = [p.parent.name for p in baselines.list_baselines(root)]
            raise pytest.UsageError(
                f"--benchmark-compare: platform {platform!r} has no committed baseline "
                f"({baselines.storage_file(root, platform)} does not exist; platforms with one: "
                f"{', '.join(have) or 'none'}). Record this platform's with `pytest perf/test_benchmark.py "
                "--update-baselines` on an idle machine, name another with --platform, or compare "
                "against your own history with --benchmark-storage"
            )
        config.option.benchmark_storage = str(baselines.storage_file(root, platform).parent)
    try:
        baselines.check_compare(config.getoption("benchmark_storage"), compare)
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from exc


def record_rounds(benchmark, rounds: list[float], group: str, extra_info: dict) -> None:
    """Put rounds measured by the suite's loop into a pytest-benchmark entry, as its own rounds.

    pytest-benchmark times one callable per entry, round after round; a case's plain and assisted
    arms are timed interleaved, round by round, by the suite's one measurement loop (with
    ``time.perf_counter``, pytest-benchmark's default timer), so their rounds are handed to its
    statistics the way its runner hands its own: one ``update`` per round. Its storage, JSON,
    compare, histogram and ``--benchmark-compare-fail`` then read real rounds."""
    benchmark.group = group
    benchmark.extra_info.update(extra_info)
    # The fixture's own bookkeeping (pytest-benchmark 5): its mode says it was used, and its stats
    # object takes rounds one by one, as the fixture's runner feeds it.
    benchmark._mode = "rounds of the suite's interleaved measurement"
    stats = benchmark._make_stats(1)
    for seconds in rounds:
        stats.update(seconds)


def compared_entries(config: pytest.Config, fullname: str) -> list[tuple[str, dict]]:
    """The entries ``--benchmark-compare`` loaded for the test ``fullname``, with their files."""
    session = getattr(config, "_benchmarksession", None)
    mapping = getattr(session, "compared_mapping", None) or {}
    return [(str(path), found[fullname]) for path, found in mapping.items() if fullname in found]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_benchmark_scale_unit(config, unit, benchmarks, best, worst, sort):  # noqa: ARG001
    """A ratio table is shown as the ratio itself, not scaled as if it were seconds."""
    arms = {(b.get("extra_info") or {}).get("arm") for b in benchmarks}
    if unit == "seconds" and arms == {"ratio"}:
        return "", 1.0
    return None


@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):  # noqa: ARG001
    """One line when the compared run was taken on another machine, saying which parts differ, in
    place of pytest-benchmark's own note: both machine descriptions whole (~3 KB of cpuinfo flags
    and kernel releases on every compare), and on a storage outside the working folder a failure
    (``Path.relative_to``). Its note finds the descriptions equal, being handed the same one twice."""
    theirs = compared_benchmark.get("machine_info") or {}
    differ = sorted(k for k in {*theirs, *machine_info} if theirs.get(k) != machine_info.get(k))
    compared_benchmark["machine_info"] = machine_info
    try:
        return (yield)
    finally:
        compared_benchmark["machine_info"] = theirs
        if differ:
            cpu = theirs.get("cpu") or {}
            kind = f"family {cpu.get('family', '?')} model {cpu.get('model', '?')}"
            slug = theirs.get("platform") or "another"
            benchmarksession.logger.warning(
                f"the compared run in {benchmarksession.storage} was taken on the {slug} machine "
                f"({cpu.get('brand_raw', '?')}, {kind}); differing: {', '.join(differ)}. Absolute times are "
                "that machine's; the ratio entries compare across machines"
            )


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info) -> None:
    """The platform slug beside pytest-benchmark's own machine description."""
    machine_info["platform"] = config.getoption("--platform") or platforms.detect().name


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


@pytest.fixture(autouse=True)
def _torch_threads(request: pytest.FixtureRequest) -> None:
    """Tiny models run fastest on one thread (their matmuls are too small to split, and a second
    thread only spins); real models get the cores."""
    real = request.node.get_closest_marker("real") is not None
    torch.set_num_threads(session_of(request.config).threads if real else 1)


def _real_selected(config: pytest.Config, local: list[str]) -> list[str]:
    wanted = config.getoption("--real-pairs")
    if wanted.strip().lower() == "all":
        return REAL + local
    names = {w.strip().lower() for w in wanted.split(",") if w.strip()}
    return [n for n in REAL if n.lower() in names] + local


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What a run with a local pair will also do, and the engines it leaves out, said before it starts."""
    session = session_of(config)
    lines = [
        f"engines: {', '.join(session.engines) or 'none'} (--engines; the run's end says what it left out)"
    ]
    local = session.local_pairs
    if local and "onnxruntime" in dict(session.target_backends):
        lines.append(
            f"local pair(s) {', '.join(local)}: their ONNX Runtime cases export each target once (about "
            "16 GB resident and a minute for a 1.5B model); --target-backends torch leaves them out"
        )
    return lines


def real_pairs_left_out(config: pytest.Config) -> list[str]:
    """Registered real pairs a ``-k`` expression names that this run does not collect (not in
    ``--real-pairs``): ``pytest perf -k codellama`` would otherwise pass on the tiny stand-in alone
    without a word about the real CodeLlama cases."""
    import re

    words = {w for w in re.findall(r"[\w.\-]+", (config.getoption("keyword") or "").lower())}
    words -= {"and", "or", "not"}
    selected = {n.lower() for n in session_of(config).real_pairs}
    return [n for n in REAL if n.lower() not in selected and any(w in n.lower() for w in words)]


def _register_local_pairs(config: pytest.Config) -> list[str]:
    """``--local-pair NAME=TARGET[,DRAFT]``: pairs of the user's own folders, registered under NAME
    for this run (their configs are read now: a wrong folder is a usage error, not 40 failed tests)."""

    names = []
    for text in config.getoption("--local-pair"):
        name, eq, rest = (part.strip() for part in text.partition("="))
        folders, at, chosen = rest.rpartition("@") if "@" in rest else (rest, "", "")
        paths = [f.strip() for f in folders.split(",") if f.strip()]
        precisions = [p.strip() for p in chosen.split(",") if p.strip()]
        if not eq or not name or not 1 <= len(paths) <= 2 or (at and not 1 <= len(precisions) <= 2):
            raise pytest.UsageError(
                f"--local-pair {text!r}: write NAME=TARGET[,DRAFT][@TARGET_PRECISION[,DRAFT_PRECISION]]"
            )
        try:
            spec = models.local_pair(
                paths[0],
                paths[1] if len(paths) > 1 else None,
                (precisions[0], precisions[-1]) if precisions else None,
            )
            models.register_pair(dataclasses.replace(spec, name=name))
        except HarnessError as exc:
            raise pytest.UsageError(f"--local-pair {text!r}: {exc}") from None
        names.append(name)
    return names


def pair_params(config: pytest.Config, *, tiny: bool | tuple[str, ...] = True, real: bool = True) -> list:
    """Every pair (or the tiny ones ``tiny`` names) as a pytest param whose id is the pair name;
    real ones marked real+slow."""
    names = TINY if tiny is True else [n for n in TINY if n in tiny] if tiny else []
    params = [pytest.param(n, id=n) for n in names]
    if real:
        params += [
            pytest.param(n, id=n, marks=[pytest.mark.real, pytest.mark.slow])
            for n in session_of(config).real_pairs
        ]
    return params


def target_backends(
    config: pytest.Config, left_out: dict[str, str] | None = None
) -> list[tuple[str, str | None]]:
    """(backend, provider) pairs selected by --target-backends, checked up front; by default a
    backend whose runtime is not installed is left out (into ``left_out``, with why)."""
    out = []
    for name in (b.strip() for b in config.getoption("--target-backends").split(",") if b.strip()):
        try:
            backends.check_backend(name)
        except HarnessError as exc:
            if config.getoption("--target-backends") != DEFAULT_BACKENDS or left_out is None:
                raise
            left_out[f"target backend {name} not run here"] = str(exc)
            continue
        provider = config.getoption("--execution-provider") if name == "onnxruntime" else None
        out.append((name, provider))
    return out


def backend_params(config: pytest.Config, params: list, only: tuple[str, ...] | None = None) -> list:
    """``params`` (pair params) crossed with the selected target backends (those in ``only``, the
    ``backends`` marker's, if given), ids carrying both."""
    crossed = []
    for backend, provider in session_of(config).target_backends:
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
    if "run_devices" in metafunc.fixturenames and not _parametrized(metafunc, "run_devices"):
        devices = session_of(metafunc.config).devices
        tag = suite.devices_id(devices)
        if tag is not None:
            metafunc.parametrize("run_devices", [devices], ids=[tag], scope="session")
    if "sampling_engine" in metafunc.fixturenames and not _parametrized(metafunc, "sampling_engine"):
        metafunc.parametrize("sampling_engine", sampling_params(metafunc.config), scope="module")
    if "pair_name" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("pairs")
        kinds = marker.kwargs if marker else {}
        params = pair_params(metafunc.config, tiny=kinds.get("tiny", True), real=kinds.get("real", True))
        if "engine" in metafunc.fixturenames:
            needs = metafunc.definition.get_closest_marker("engines")
            kwargs = needs.kwargs if needs else {}
            crossed = engine_params(
                metafunc.config, params, kwargs.get("mode"), built_in=kwargs.get("built_in", False)
            )
            metafunc.parametrize("pair_name,engine", crossed)
        elif "target_backend" in metafunc.fixturenames:
            only = metafunc.definition.get_closest_marker("backends")
            crossed = backend_params(metafunc.config, params, only.args if only else None)
            metafunc.parametrize("pair_name,target_backend", crossed)
        else:
            metafunc.parametrize("pair_name", params)


def _parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    return any(name in str(m.args[0]).split(",") for m in metafunc.definition.iter_markers("parametrize"))


def sampling_params(config: pytest.Config) -> list:
    """What speculative sampling's chi-square tier runs: transformers' loop on each selected target
    backend, then each engine of the session that runs models built in memory (``from_built_models``)."""
    session = session_of(config)
    params = [pytest.param(backend, id=backend) for backend, _ in session.target_backends]
    for name in session.engines:
        cls = engines.engine_class(name)
        if cls.from_built_models:
            params.append(
                pytest.param(
                    name, id=cls.test_id(), marks=[pytest.mark.engine, getattr(pytest.mark, cls.test_id())]
                )
            )
    return params


def engine_params(config: pytest.Config, params: list, mode: str | None, *, built_in: bool = False) -> list:
    """``params`` (pair params) crossed with the session's engines (``built_in``: transformers' loop
    first, as the pair is registered), ids carrying both (``-k llama_cpp``), each case marked
    ``engine`` and with its engine's own marker. A pair an engine cannot run, or a mode it does not
    have, is left out and said once at the end."""
    session = session_of(config)
    crossed = []
    names = [engines.BUILT_IN] if built_in else []
    names += [name for name in session.engines if name not in names]
    for name in names:
        cls = engines.engine_class(name)
        if mode is not None and mode not in cls.modes:
            continue
        for p in params:
            why = cls.unfit(models.get_pair(p.values[0]))
            if why is not None:
                session.left_out.setdefault(f"{name} on {p.values[0]}", why)
                continue
            marks = [*p.marks, pytest.mark.engine, getattr(pytest.mark, cls.test_id())]
            crossed.append(pytest.param(p.values[0], name, id=f"{p.id}-{cls.test_id()}", marks=marks))
    return crossed


@pytest.fixture(scope="session")
def run_devices(pytestconfig: pytest.Config) -> tuple[str, str]:
    """(target, draft): where the session's torch models run (--target-device, --draft-device). Off
    the CPU, ``pytest_generate_tests`` parametrizes it, so every case that loads a pair carries the
    devices in its id."""
    return session_of(pytestconfig).devices


@pytest.fixture(scope="session")
def pairs(pytestconfig: pytest.Config, run_devices: tuple[str, str]) -> Iterator[suite.PairCache]:  # noqa: ARG001
    session = session_of(pytestconfig)
    yield session.pairs
    session.close()


@pytest.fixture(scope="session")
def selected_target_backends(pytestconfig: pytest.Config) -> list[tuple[str, str | None]]:
    return session_of(pytestconfig).target_backends


@pytest.fixture(scope="session")
def platform_name(pytestconfig: pytest.Config) -> str:
    return session_of(pytestconfig).platform_name


@pytest.fixture(scope="session")
def real_prompts(pytestconfig: pytest.Config) -> int:
    return pytestconfig.getoption("--real-prompts")


@pytest.fixture(scope="session")
def tier_prompts(pytestconfig: pytest.Config) -> list[tasks.Prompt]:
    """What a real tier decodes: the first ``--real-prompts`` of ``--prompts`` (prompt sets, taken in
    turn), by default the mixed prompts then HumanEval's (``--real-prompts 186`` covers them all)."""
    n = pytestconfig.getoption("--real-prompts")
    sets = pytestconfig.getoption("--prompts")
    if sets:
        return tasks.prompts_of(sets, acceptance_tier.TIER_NEW_TOKENS)[:n]
    return acceptance_tier.tier_prompts(n)


# ------------------------------------------------------------ timed benchmarks (harness.experiments.bench)


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
    return session_of(pytestconfig).bench_results


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    session = config.stash.get(SESSION, None)
    if session is None:  # the options were refused at configure time
        return
    if session.left_out:
        terminalreporter.section("engines left out")
        for what, why in session.left_out.items():
            terminalreporter.write_line(f"{what}: {why}")
    left_out = real_pairs_left_out(config)
    if left_out:
        terminalreporter.section("real pairs not collected")
        terminalreporter.write_line(
            f"-k {config.getoption('keyword')!r} names real pairs this run did not collect: "
            f"{', '.join(left_out)} (real cases run for --real-pairs only, here "
            f"{', '.join(session.real_pairs) or 'none'}); add --real-pairs {','.join(left_out)} and "
            "--weights_dir DIR (where their weights are; see README 'Model pairs') to include them"
        )
    for title, lines in session.summaries():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
    if config.getoption("--regen-tables") and not under_xdist(config):
        from harness import report
        from harness.settings import results

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
def _prepare_weights(request: pytest.FixtureRequest) -> None:
    """On a fresh machine, convert the packaged pair (and make its exports) once before any real test
    runs, so tests that check "loads from the cache in seconds" see the state after set-up."""
    items = request.session.items
    if any(item.get_closest_marker("real") for item in items):
        session_of(request.config).prepare_weights(engines_used(items))


def engines_used(items: list[pytest.Item]) -> set[str]:
    """The engines the collected tests run: an engine-axis case's, and any test marked with, or
    named for, an engine's test id."""
    used = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "engine" in callspec.params:
            used.add(callspec.params["engine"])
    for name in engines.names():
        test_id = engines.test_id(name)
        if any(item.get_closest_marker(test_id) or test_id in item.nodeid for item in items):
            used.add(name)
    return used - {engines.BUILT_IN}


# --------------------------------------------------------------------------- divergence table


@pytest.fixture(scope="session")
def divergence_table(pytestconfig: pytest.Config) -> equivalence.DivergenceTable:
    """Collects every precision-tier case; the table is printed in the terminal summary."""
    return session_of(pytestconfig).divergence_table()
