"""Benchmark one case: interleaved plain/assisted repetitions -> speedup with CI, theory, rows, baseline.

One repetition (a "round") decodes the same benchmark prompt plain and assisted, in alternating order
from round to round, so a slow phase of a shared machine hits both modes alike and order effects
(cache warmth, clock ramp) cancel over the rounds. The speedup is the paired ratio of mean tokens/s
(``stats.speedup_ci``), and the measured acceptance and per-forward costs give the speedup that
Leviathan et al.'s theory predicts, so a measured speedup can be read against what the draft could
deliver at best.

``inject_slowdown`` makes assisted runs genuinely slower (a busy-wait in a forward hook, on the
machine's real clock), which is how the tests show the gate catches a regression of known size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from harness.base import platforms, tasks
from harness.base.backends import DEFAULT_PROVIDER
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.decoding.generation import generate
from harness.experiments import experiment, runner
from harness.pairs.models import LoadedPair
from harness.settings import baselines, setup
from harness.settings.results import runs_dir
from harness.settings.setup import GenerationSettings, RunSetup
from harness.theory import analysis, stats
from harness.theory.timing import Measurement

TASK = "benchmark"


@dataclass(frozen=True)
class BenchCase:
    """One benchmark case: its assisted arm's run setup (the plain arm is the same run with mode
    plain), the prompt's length and the task. ``key()`` is the baseline identity
    (``baselines.CaseKey``); every setting lives in ``run``, which ``case`` resolves."""

    run: RunSetup
    prompt_tokens: int
    task: str = TASK

    @property
    def pair(self) -> str:
        return self.run.pair

    @property
    def new_tokens(self) -> int:
        return self.run.decoding.max_new_tokens

    @property
    def num_assistant_tokens(self) -> int:
        return self.run.decoding.num_assistant_tokens

    @property
    def do_sample(self) -> bool:
        return self.run.decoding.do_sample

    def key(self) -> baselines.CaseKey:
        return baselines.case_key(self.run.columns(), self.task, self.prompt_tokens)

    @property
    def case_id(self) -> str:
        return self.key().case_id

    def settings(self, mode: str) -> GenerationSettings:
        return replace(self.run.decoding, mode=mode).validate()


def case(
    pair: Any,
    prompt_tokens: int,
    new_tokens: int,
    *,
    sampling: Mapping[str, Any] | None = None,
    task: str = TASK,
    **settings: Any,
) -> BenchCase:
    """A benchmark case of ``pair`` (a name or ``models.PairSpec``): every setting not given is the
    pair's registered one (``engines.resolve``, with its keyword arguments); ``sampling`` holds
    ``do_sample``, ``temperature``, ``top_p``, ``top_k`` and ``seed``. Both arms decode exactly
    ``new_tokens`` (EOS ignored), so their tokens/s cover the same work."""
    from harness.pairs import models

    spec = models.get_pair(pair)
    own = {
        name: settings.pop(name)
        for name in [n for n in settings if n in _DECODING_FIELDS and n not in _RESOLVED_FIELDS]
    }
    decoding = GenerationSettings(
        mode="assisted", max_new_tokens=new_tokens, ignore_eos=True, **own, **(sampling or {})
    )
    return BenchCase(engines.resolve(spec, decoding=decoding, **settings), prompt_tokens, task)


# ``case``'s keywords that are decoding settings go into its ``GenerationSettings``, all but the
# ones ``resolve`` settles itself against the pair's registration (K and its schedule).
_DECODING_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationSettings))
_RESOLVED_FIELDS = frozenset({"num_assistant_tokens", "assistant_schedule"})


# The real cases perf/test_benchmark.py gates, by name: the prompt and budget of the CI subset. The
# stock fp32 case decodes half the budget: its 1.5B fp32 target reads 6 GB a token (~2.6 tokens/s on
# a 2-core host), so at 32 tokens its rounds alone took four minutes of CI, as long as all the
# quantized cases' together.
REAL_PROMPT_TOKENS, REAL_NEW_TOKENS, REAL_FP32_NEW_TOKENS = 128, 32, 16


def registered_case(spec: Any) -> BenchCase:
    """The pair as registered: for the offline pair, the configuration the CLI runs by default."""
    return case(spec, REAL_PROMPT_TOKENS, REAL_NEW_TOKENS)


# The token tree the offline pair's tree case verifies: the best tree of the planner's measured run
# (``python -m harness.trees --measure best``, FINDINGS).
REAL_TREE = "0+1+00"


def tree_case(spec: Any) -> BenchCase:
    """The registered configuration with the draft's guesses as a token tree (``REAL_TREE``) in the
    harness's own loop instead of a chain in transformers'."""
    return case(spec, REAL_PROMPT_TOKENS, REAL_NEW_TOKENS, draft_tree=REAL_TREE)


def chain_case(spec: Any) -> BenchCase:
    """The registered configuration without proposals from the context (``context_draft`` 0): the
    draft model's chain alone, in transformers' loop, which the registered case's gain is read
    against."""
    return case(spec, REAL_PROMPT_TOKENS, REAL_NEW_TOKENS, context_draft=0)


def fp32_case(spec: Any) -> BenchCase:
    """The stock fp32 pair: the plain reference, no quantization or hand-written kernel involved."""
    return case(spec, REAL_PROMPT_TOKENS, REAL_FP32_NEW_TOKENS, **setup.STOCK_FP32)


def ort_case(spec: Any, provider: str) -> BenchCase:
    """The registered case with the target exported to ONNX Runtime (int4, default settings) and the
    registered torch draft: what the seeds' NPU-target / CPU-draft users run."""
    return case(spec, REAL_PROMPT_TOKENS, REAL_NEW_TOKENS, target_backend="onnxruntime", provider=provider)


def engine_case(
    spec: Any,
    engine: str,
    provider: str = DEFAULT_PROVIDER,
    prompt_tokens: int = REAL_PROMPT_TOKENS,
    k: int | None = None,
) -> BenchCase:
    """The registered case's prompt and budget through an engine's own loop: its plain decoding against
    its own speculative decoding with its own draft, at the engine's constant K (``Engine.default_k``:
    llama.cpp's default, 3, for the built-in ones), on its own files of the pair."""
    cls = engines.engine_class(engine)
    return case(
        spec,
        prompt_tokens,
        REAL_NEW_TOKENS,
        provider=provider if cls.backend == "onnxruntime" else None,
        engine=engine,
        num_assistant_tokens=k or cls.default_k,
    )


def real_case_command(pair: Any, case_id: str, rounds: int, provider: str) -> str | None:
    """The pytest command that measures the real case ``case_id`` of ``pair`` today, or None when no
    current case is that one (a pair's registered configuration, or a case's budget, has changed
    since)."""
    from harness.pairs import models

    spec = models.get_pair(pair)
    selections = {
        registered_case(spec).case_id: f"test_benchmark_real and {spec.name}-registered",
        ort_case(spec, provider).case_id: "test_benchmark_real_onnxruntime",
    }
    for name in engines.names():
        cls = engines.engine_class(name)
        if cls.own_draft and cls.in_suites:
            selections[engine_case(spec, name, provider).case_id] = (
                f"test_benchmark_real_engine and {cls.test_id()}"
            )
    if spec.name == models.DEFAULT_PAIR:
        selections[fp32_case(spec).case_id] = f"test_benchmark_real and {spec.name}-fp32"
        selections[tree_case(spec).case_id] = f"test_benchmark_real and {spec.name}-tree"
        selections[chain_case(spec).case_id] = f"test_benchmark_real and {spec.name}-chain"
    selection = selections.get(case_id)
    if selection is None:
        return None
    command = f'pytest perf/test_benchmark.py -k "{selection}" --perf-repetitions {rounds}'
    return command if spec.name == models.DEFAULT_PAIR else f"{command} --real-pairs {spec.name}"


# --------------------------------------------------------------------------- slowdown injection


def _busy_wait(seconds: float) -> None:
    # Spinning, not sleeping: the wait occupies a core like real compute would, so a slowed run
    # behaves like a slower build on a shared machine rather than an idle pause.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _check_fraction(fraction: float) -> None:
    if not 0.0 <= fraction < 1.0:
        raise HarnessError(f"inject_slowdown must be in [0, 1), got {fraction}; 0.15 means 15% slower")


@contextlib.contextmanager
def slowed(module: torch.nn.Module, fraction: float) -> Iterator[None]:
    """Make decoding with ``module`` as target lose about ``fraction`` of its tokens/s, for real.

    Before each target forward after the first, a hook spins for ``1/(1 - fraction) - 1`` times the
    wall time since the previous target forward started (that forward, the draft steps and the
    bookkeeping), so the decode loop up to its last forward stretches by that factor. The spin sits
    before the forward's own timing (the timing hooks are registered later, inside ``generate``), so
    it lands in the non-forward time: a slower loop, which the host-adjusted speedup gate must catch,
    not a slower forward, which it attributes to the host.
    """
    _check_fraction(fraction)
    if fraction == 0.0:
        yield
        return
    factor = 1.0 / (1.0 - fraction) - 1.0
    mark: list[float] = []

    def pre(_m: torch.nn.Module, _args: tuple) -> None:
        if mark:
            _busy_wait(factor * (time.perf_counter() - mark[0]))
            mark[0] = time.perf_counter()
        else:
            mark.append(time.perf_counter())

    handles = [module.register_forward_pre_hook(pre)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# --------------------------------------------------------------------------- results


@dataclass
class CaseMeasurement:
    """One case measured in ``repetitions`` interleaved rounds; lists hold one value per round."""

    case: BenchCase
    platform: str
    run_id: str
    inject_slowdown: float
    threads: int
    plain: list[Measurement] = field(repr=False)
    assisted: list[Measurement] = field(repr=False)
    rows_path: Path | None = None

    # -- per-round samples
    @property
    def repetitions(self) -> int:
        return len(self.plain)

    def extended(self, more: CaseMeasurement) -> CaseMeasurement:
        """This measurement with ``more`` rounds of the same case, arm and machine appended (the
        rows keep each batch's own run id)."""
        same = (more.case, more.platform, more.inject_slowdown, more.threads)
        if same != (self.case, self.platform, self.inject_slowdown, self.threads):
            raise HarnessError("only rounds of the same case, arm and machine extend a measurement")
        return dataclasses.replace(
            self, plain=self.plain + more.plain, assisted=self.assisted + more.assisted
        )

    @property
    def plain_tps(self) -> list[float]:
        return [m.tokens_per_s for m in self.plain]

    @property
    def assisted_tps(self) -> list[float]:
        return [m.tokens_per_s for m in self.assisted]

    # -- summaries
    @property
    def speedup(self) -> stats.Estimate:
        return stats.speedup_ci(self.plain_tps, self.assisted_tps, paired=True)

    def mean(self, mode: str, attr: str) -> float:
        return statistics.fmean(getattr(m, attr) for m in getattr(self, mode))

    def non_forward_share(self, mode: str) -> float:
        """Share of wall time outside both models' forwards (Python, sampling, cache bookkeeping)."""
        return statistics.fmean(m.other_ms / (m.total_s * 1000.0) for m in getattr(self, mode))

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted, pooled over rounds (the rows' acceptance column)."""
        drafted = sum(m.drafted for m in self.assisted)
        return sum(m.accepted for m in self.assisted) / drafted if drafted else None

    @property
    def acceptance_by_position(self) -> list[list[int]]:
        """Drafted/accepted per draft position, summed over the assisted rounds."""
        total: list[list[int]] = []
        for m in self.assisted:
            for i, (drafted, accepted) in enumerate(analysis.acceptance_by_position(m)):
                while len(total) <= i:
                    total.append([0, 0])
                total[i][0] += drafted
                total[i][1] += accepted
        return total

    @property
    def deterministic(self) -> bool:
        """Greedy decoding whose outputs repeated exactly in every round: its acceptance counts are
        a property of the code, gated exactly."""
        return not self.case.do_sample and self.identical_outputs

    @property
    def alpha(self) -> float | None:
        steps = [analysis.acceptance_steps(m) for m in self.assisted]
        return analysis.alpha_mle(sum(a for a, _ in steps), sum(r for _, r in steps))

    @property
    def target_forward_ms(self) -> float:
        """One-token target forward (plain decode steps; ``analysis.decode_ms``): the theory's unit."""
        return analysis.decode_ms(self.plain, "target")

    @property
    def verify_forward_ms(self) -> float:
        """Target verify forward of the assisted runs (K+1 tokens), first (prefill) one excluded."""
        return analysis.decode_ms(self.assisted, "target")

    @property
    def draft_forward_ms(self) -> float:
        """Draft forward of the assisted runs, the draft's prompt prefill excluded."""
        return analysis.decode_ms(self.assisted, "draft")

    @property
    def c(self) -> float:
        return self.draft_forward_ms / self.target_forward_ms

    @property
    def v(self) -> float:
        return self.verify_forward_ms / self.target_forward_ms

    @property
    def pair_costs(self) -> list[tuple[float, float]]:
        """``(c, v)`` of each interleaved plain/assisted pair, from that pair's own steps: what the
        speedup gate adjusts each pair's ratio by (``baselines.pair_adjustments``)."""
        costs = []
        for plain, assisted in zip(self.plain, self.assisted, strict=True):
            step = analysis.decode_ms([plain], "target")
            draft, verify = (analysis.decode_ms([assisted], role) for role in ("draft", "target"))
            costs.append((draft / step, verify / step))
        return costs

    def _predict(self, v: float) -> float | None:
        return analysis.predict_speedup(self.alpha, self.case.run.decoding.chain_k, self.c, v)

    @property
    def predicted_speedup(self) -> float | None:
        """Leviathan's prediction with a verify forward costing one target forward (memory-bound)."""
        return self._predict(1.0)

    @property
    def predicted_speedup_verify(self) -> float | None:
        """The prediction with the measured verify cost v (a CPU is compute-bound: v grows with K)."""
        return self._predict(self.v)

    @property
    def identical_outputs(self) -> bool:
        first = self.plain[0].output_ids
        return all(m.output_ids == first for m in self.plain + self.assisted)

    def summary(self) -> dict[str, Any]:
        """Flat numbers for pytest-benchmark's extra_info, the session table and reports."""
        sp = self.speedup
        return {
            "case_id": self.case.case_id,
            "pair": self.case.pair,
            "platform": self.platform,
            "run_id": self.run_id,
            "repetitions": self.repetitions,
            "threads": self.threads,
            "inject_slowdown": self.inject_slowdown,
            "num_assistant_tokens": self.case.num_assistant_tokens,
            "draft_tree": self.case.run.decoding.draft_tree or None,
            "plain_tokens_per_s": self.mean("plain", "tokens_per_s"),
            "assisted_tokens_per_s": self.mean("assisted", "tokens_per_s"),
            "plain_tokens_per_s_samples": self.plain_tps,
            "assisted_tokens_per_s_samples": self.assisted_tps,
            "speedup": sp.value,
            "speedup_low": sp.low,
            "speedup_high": sp.high,
            "plain_time_per_token_ms": self.mean("plain", "time_per_token_ms"),
            "assisted_time_per_token_ms": self.mean("assisted", "time_per_token_ms"),
            "plain_prefill_ms": self.mean("plain", "prefill_ms"),
            "assisted_prefill_ms": self.mean("assisted", "prefill_ms"),
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "tokens_per_target_forward": self.mean("assisted", "tokens_per_target_forward"),
            "target_forward_ms": self.target_forward_ms,
            "verify_forward_ms": self.verify_forward_ms,
            "draft_forward_ms": self.draft_forward_ms,
            "c": self.c,
            "v": self.v,
            "predicted_speedup": self.predicted_speedup,
            "predicted_speedup_verify": self.predicted_speedup_verify,
            "plain_non_forward_share": self.non_forward_share("plain"),
            "assisted_non_forward_share": self.non_forward_share("assisted"),
            "identical_outputs": self.identical_outputs,
        }

    def record(self) -> baselines.BaselineRecord:
        """The baseline record of this measurement (samples kept, so the gate can use Mann-Whitney)."""
        s = self.summary()
        keep = (
            "alpha",
            "c",
            "v",
            "predicted_speedup",
            "predicted_speedup_verify",
            "assisted_non_forward_share",
            "plain_non_forward_share",
            "repetitions",
            "threads",
            "run_id",
        )
        extra = {k: baselines.rounded(s[k]) if isinstance(s[k], float) else s[k] for k in keep}
        extra["pair_costs"] = [[baselines.rounded(c), baselines.rounded(v)] for c, v in self.pair_costs]
        if self.deterministic:
            extra["acceptance_by_position"] = self.acceptance_by_position
            extra["rounds"] = self.repetitions
        return baselines.make_record(
            self.case.key(),
            self.plain_tps,
            self.assisted_tps,
            time_per_token_ms={
                "plain": s["plain_time_per_token_ms"],
                "assisted": s["assisted_time_per_token_ms"],
            },
            prefill_ms={"plain": s["plain_prefill_ms"], "assisted": s["assisted_prefill_ms"]},
            acceptance=self.acceptance_rate,
            extra=extra,
        )

    def gate(self, root: str | os.PathLike[str], platform: str | None = None) -> dict[str, stats.GateResult]:
        """Speedup and tokens/s gates against the case's baseline in ``root/<platform>`` (its
        pytest-benchmark storage, ``baselines.storage_file``), and, for a
        deterministic case whose baseline holds them, the exact acceptance-per-position gate."""
        gates = baselines.compare_to_baseline(
            root,
            platform or self.platform,
            self.case.key(),
            self.plain_tps,
            self.assisted_tps,
            forward_costs=self.pair_costs,
            cpu_id=platforms.detect().cpu_id,
        )
        if self.deterministic:
            record = baselines.load_baseline(root, platform or self.platform, self.case.key())
            exact = baselines.acceptance_gate(record, self.acceptance_by_position, self.repetitions)
            if exact is not None:
                gates["acceptance_by_position"] = exact
        return gates


# --------------------------------------------------------------------------- measuring


def default_rows_path(platform: str, results_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where benchmark rows go: ``<runs>/rows/benchmark-<platform>.jsonl`` (``results.runs_dir()``,
    outside the committed results unless a folder is given)."""
    return Path(results_dir or runs_dir()) / "rows" / f"{TASK}-{platform}.jsonl"


def _check_pair(pair: LoadedPair, case: BenchCase) -> None:
    if pair.spec.name.lower() != case.pair.lower():
        raise HarnessError(f"case is for {case.pair} but pair {pair.spec.name} was passed; load {case.pair}")
    if pair.draft_setup is None:
        raise HarnessError(f"{pair.spec.name} was loaded without a draft; a benchmark needs both models")
    wanted = case.run.columns()
    got = pair.run_setup(case.settings("assisted")).columns()
    # Devices are where the case runs, not what it is.
    differ = [
        c
        for c in setup.column_names()
        if c not in ("model", "target_device", "draft_device") and wanted[c] != got[c]
    ]
    if differ:
        diff = ", ".join(f"{c} {wanted[c]!r} (loaded: {got[c]!r})" for c in differ)
        raise HarnessError(f"case {case.case_id} wants {diff}; load the pair with those settings")


def _run_id(pair: LoadedPair, case: BenchCase, platform: str, arm: str) -> str:
    # The configuration hash says what ran; the time makes each measurement its own run, so report
    # tables never pair a plain round of one measurement with an assisted round of another.
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    base = runner.run_id_for(pair, case.task, case.settings("assisted"), platform)
    return f"{base}-{stamp}" + (f"-{arm}" if arm else "")


def measure_arms(
    pair: LoadedPair,
    case: BenchCase,
    arms: Mapping[str, float],
    repetitions: int,
    warmup: int = 1,
    *,
    rows_path: str | os.PathLike[str] | None = None,
    write_rows: bool = True,
    platform: str | None = None,
) -> dict[str, CaseMeasurement]:
    """Measure several variants ("arms", name -> injected slowdown of assisted decoding) of one case
    in shared rounds.

    Every round runs each arm once (plain and assisted), rotating the arms' order and alternating
    plain/assisted from round to round, so machine drift spreads over all arms alike. This is how
    two measurements taken in one run can be compared fairly (A/B in the same run).
    """
    if repetitions < 2:
        raise HarnessError(f"repetitions must be at least 2 for a confidence interval (got {repetitions})")
    if warmup < 0:
        raise HarnessError(f"warmup must be >= 0 (got {warmup})")
    if not arms:
        raise HarnessError("measure_arms needs at least one arm")
    _check_pair(pair, case)
    for fraction in arms.values():
        _check_fraction(fraction)
    platform = platform or platforms.detect().name
    path = Path(rows_path) if rows_path is not None else default_rows_path(platform)
    prompt = tasks.benchmark_prompts(pair.tokenizer, (case.prompt_tokens,), (case.new_tokens,))[0]
    ids = list(prompt.input_ids or ())
    digest = setup.prompt_digest(ids)
    names = list(arms)
    run_ids = {a: _run_id(pair, case, platform, a) for a in names}
    got: dict[str, dict[str, list[Measurement]]] = {a: {"plain": [], "assisted": []} for a in names}

    def once(arm: str, mode: str) -> Measurement:
        with slowed(pair.target, arms[arm] if mode == "assisted" else 0.0):
            return generate(pair, ids, case.settings(mode))

    for _ in range(warmup):
        for arm in names:
            once(arm, "plain")
            once(arm, "assisted")

    def measure(job: experiment.Job[int, str]) -> None:
        # Within a round each arm runs plain and assisted back to back, which comes first alternating.
        modes = ("plain", "assisted") if (job.index + job.position) % 2 else ("assisted", "plain")
        for mode in modes:
            m = once(job.arm, mode)
            got[job.arm][mode].append(m)
            if write_rows:
                runner.record(
                    path,
                    pair,
                    m,
                    case.settings(mode),
                    example=job.index,
                    task=case.task,
                    label=prompt.label,
                    platform=platform,
                    run_id=run_ids[job.arm],
                    prompt_sha=digest,
                    extra={
                        "bench": {
                            "case_id": case.case_id,
                            "repetition": job.index,
                            "order": "-".join(modes),
                            "arm": job.arm,
                            "inject_slowdown": arms[job.arm],
                        }
                    },
                )

    # One round per repetition runs every arm, the arms' order rotating from round to round: the
    # measurement loop every experiment shares (nothing to resume: each measurement is its own run).
    experiment.run(experiment.interleave(range(repetitions), names), measure, progress=False)
    return {
        arm: CaseMeasurement(
            case=case,
            platform=platform,
            run_id=run_ids[arm],
            inject_slowdown=arms[arm],
            threads=torch.get_num_threads(),
            plain=got[arm]["plain"],
            assisted=got[arm]["assisted"],
            rows_path=path if write_rows else None,
        )
        for arm in names
    }


def gate_with_more_rounds(
    m: CaseMeasurement,
    gate: Callable[[CaseMeasurement], dict[str, Any]],
    more: Callable[[], CaseMeasurement],
    batches: int,
) -> tuple[CaseMeasurement, dict[str, Any]]:
    """``gate(m)``; while its speedup answer is inconclusive (this run's spread cannot tell an
    unchanged build from a regression), measure ``more()`` rounds, up to ``batches`` times, and
    answer on all of them. More rounds are what an inconclusive answer asks for; a pass or a
    regression stops it."""
    gates = gate(m)
    for _ in range(batches):
        if gates["speedup"].conclusive:
            break
        m = m.extended(more())
        gates = gate(m)
    return m, gates


def measure_case(
    pair: LoadedPair,
    case: BenchCase,
    repetitions: int,
    warmup: int = 1,
    *,
    inject_slowdown: float = 0.0,
    rows_path: str | os.PathLike[str] | None = None,
    write_rows: bool = True,
    platform: str | None = None,
) -> CaseMeasurement:
    """Warm up, then ``repetitions`` interleaved plain/assisted rounds of one case; rows are appended
    to ``rows_path`` (default ``results/rows/benchmark-<platform>.jsonl``) as each run finishes."""
    return measure_arms(
        pair,
        case,
        {"": inject_slowdown},
        repetitions,
        warmup,
        rows_path=rows_path,
        write_rows=write_rows,
        platform=platform,
    )[""]
