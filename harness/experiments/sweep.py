"""Configuration sweep: which precision, draft, K and schedule make assisted generation pay off here?

One command measures several assisted-generation configurations on the same workload (greedy, the
first N HumanEval prompts, a fixed number of new tokens with EOS ignored so every mode decodes the
same tokens) and prints, per configuration, plain and assisted tokens/s, the paired speedup with its
95% CI, acceptance, the speedup Leviathan et al.'s theory predicts from the measured acceptance and
cost ratio, the share of time spent outside both models' forwards, and whether every assisted output
equalled plain greedy.

How it measures, and why:

* Configurations are grouped by target (precision, kernels): each target is loaded once, all its
  configurations run, and it is freed before the next target loads, so one real target is in memory
  at a time. The drafts a group needs are loaded beside it (they are small).
* For every prompt, plain decoding runs once per target and each configuration's assisted run
  follows, the order of these arms rotating from prompt to prompt: a slow phase of a shared machine
  then hits every arm alike instead of always the first one.
* Every finished run is appended to a JSONL row file before the next starts; a rerun with the same
  file skips finished runs (a target whose runs are all finished is not even loaded). The per-forward
  numbers the summary needs (acceptance steps, decode-forward costs) are stored in the row, so
  resumed rows summarise exactly like fresh ones.

The configurations are written in ``harness.settings.configs``' key=value syntax (``--sweep``).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from harness.base import files, llamacpp, platforms, vocab
from harness.base.errors import HarnessError
from harness.base.tasks import Prompt
from harness.decoding import engines
from harness.decoding.generation import generate
from harness.experiments import experiment, runner
from harness.pairs import models
from harness.settings import setup
from harness.settings.configs import SweepConfig, group_configs, plain_label
from harness.settings.results import Row, append_row, read_rows
from harness.settings.setup import GenerationSettings
from harness.theory import analysis, stats
from harness.theory.timing import MIN_TIMED_MS, Measurement
from harness.weights import tiny

TASK = "sweep"
DEFAULT_LIMIT = 20  # HumanEval prompts
DEFAULT_NEW_TOKENS = 128
# Tokens of the unrecorded warm-up run of every arm after a target loads (the measurement loop's).
WARMUP_TOKENS = experiment.WARMUP_TOKENS


def _plain_settings(new_tokens: int) -> GenerationSettings:
    return GenerationSettings(mode="plain", max_new_tokens=new_tokens, ignore_eos=True).validate()


# --------------------------------------------------------------------------- loading


Loader = Callable[..., Mapping[str | None, models.LoadedPair]]


# (draft precision, draft vocabulary restriction or None[, draft kernels when not stock])
DraftKey = tuple[str, int | None] | tuple[str, int | None, str]


def _extra_draft(pair: models.LoadedPair, key: DraftKey, weights_dir: str | None, device: str) -> Any:
    """Another draft for a loaded pair, made the way ``load_pair`` makes one, without reloading the target."""
    spec = pair.spec
    if spec.draft.is_tiny:
        # Tiny drafts are copied from the float target's first layers; rebuilding it takes milliseconds.
        draft = tiny.build_draft(spec.name.lower())
    else:
        path = models.resolve_model(spec.draft, weights_dir)
        draft = models._load_hf(path)
    draft_precision, draft_vocab, draft_kernels = (*key, "stock")[:3]
    return models.prepare_draft(
        draft,
        pair.tokenizer,
        vocab.vocab_size(pair.target),
        draft_precision,
        device,
        draft_vocab,
        draft_kernels,
    )


def _draft_key(item: str | DraftKey) -> DraftKey:
    return (item, None) if isinstance(item, str) else tuple(item)  # type: ignore[return-value]


def load_target_group(
    pair_name: str | models.PairSpec,
    *,
    target_precision: str,
    draft_precisions: Sequence[str | DraftKey],
    target_kernels: str = "stock",
    weights_dir: str | None = None,
    target_device: str = "cpu",
    draft_device: str = "cpu",
    verify: bool = False,
) -> dict[DraftKey | None, models.LoadedPair]:
    """Load one target once with every draft its configurations need (a draft precision, or a
    (precision, draft vocabulary) pair).

    Returns draft key -> pair; all pairs share the one target module. With no draft needed
    (prompt lookup only) the single pair, keyed None, has no draft.
    """
    drafts = list(dict.fromkeys(_draft_key(d) for d in draft_precisions))
    spec = models.get_pair(pair_name)
    # The group's first configuration as the run it loads: the sweep's spelling read once
    # (``SweepConfig.of``), on the devices the command line gave.
    first_draft = (*drafts[0], "stock")[:3] if drafts else (None, None, "stock")
    config = SweepConfig.of(
        target_precision,
        first_draft[0],
        target_kernels=target_kernels,
        draft_vocab=first_draft[1],
        draft_kernels=first_draft[2],
        engine_target=engines.sweep_target(spec),
    )
    run = dataclasses.replace(
        config.run(spec.name, 2, target_device, draft_device), decoding=GenerationSettings()
    )
    first = engines.load(spec, run, weights_dir=weights_dir, verify=verify)
    if run.target.engine != "transformers":
        # One draft at the target's settings serves every assisted configuration of this target.
        return {key: first for key in drafts} if drafts else {None: first}
    if not drafts:
        return {None: first}
    pairs: dict[DraftKey | None, models.LoadedPair] = {drafts[0]: first}
    for key in drafts[1:]:
        draft = _extra_draft(first, key, weights_dir, draft_device)
        pairs[key] = dataclasses.replace(
            first,
            draft=draft,
            draft_setup=dataclasses.replace(
                first.draft_setup, precision=key[0], vocab=key[1], kernels=key[2] if len(key) > 2 else "stock"
            ),
        )
    return pairs


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ConfigResult:
    """One configuration summarised over the prompts (each paired with its target's plain run)."""

    config: SweepConfig
    prompts: int
    plain_tokens_per_s: float
    assisted_tokens_per_s: float
    speedup: stats.Estimate
    vs_best_plain: float | None  # assisted tok/s over the fastest plain decoder of the sweep
    acceptance_rate: float | None  # accepted / drafted, pooled over prompts
    alpha: float | None  # per-token acceptance probability (analysis.alpha_mle)
    c: float  # draft decode-forward ms / target one-token forward ms (0 for prompt lookup)
    v: float  # target verify forward ms / target one-token forward ms
    predicted_speedup: float | None  # Leviathan with v = 1 (memory-bound verify)
    predicted_speedup_verify: float | None  # with the measured v (a CPU is compute-bound)
    non_forward_share: float  # assisted wall time outside both models' forwards / total
    identical: bool  # every assisted output equal to the plain greedy output of its prompt

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["label"] = self.config.label
        d["speedup"] = self.speedup.to_dict()
        return d


@dataclass(frozen=True)
class SweepResult:
    """Everything a sweep table and plot show: the machine, the workload and one result per config."""

    pair: str
    platform: str
    machine: platforms.PlatformInfo
    threads: int
    versions: dict[str, str]
    prompt_labels: tuple[str, ...]
    new_tokens: int
    rows_path: Path
    results: tuple[ConfigResult, ...]
    best_plain: tuple[str, float] | None  # (target label, mean plain tok/s) of the fastest target
    command: str = ""

    def result(self, label: str) -> ConfigResult:
        for r in self.results:
            if r.config.label == label:
                return r
        raise KeyError(label)


def _sweep_extra(row: Row) -> dict[str, Any]:
    return row.extra.get("sweep") or {}


def _prompt_digest(prompt: Prompt) -> str:
    # A prompt's identity without a tokenizer, so finished groups can be recognised before loading.
    return setup.prompt_digest(prompt.input_ids if prompt.input_ids is not None else prompt.text)


def _run_id(pair: str, config: SweepConfig, new_tokens: int, platform: str, threads: int) -> str:
    # One id per target and workload: plain and assisted rows of a target share it (so report tables
    # pair them), and a resumed run continues the same id. Thread count is part of it: rows measured
    # with other threads are a different run and must not be mixed in.
    plain = setup.RunSetup(pair, config.target, None, _plain_settings(new_tokens))
    return setup.run_id(
        plain.columns(),
        task=TASK,
        platform=platform,
        host=platforms.host_id(),
        code=platforms.code_version(),
        extra=[threads],
    )


def _forward_numbers(m: Measurement) -> dict[str, float | int]:
    """What the summary needs from a run's forwards, kept in its row so resumed rows carry it too."""
    target_ms, target_n = analysis.decode_totals(m, "target")
    draft_ms, draft_n = analysis.decode_totals(m, "draft")
    accepted, rejected = analysis.acceptance_steps(m)
    return {
        "accepted_steps": accepted,
        "rejected_steps": rejected,
        "target_decode_ms": target_ms,
        "target_decode_forwards": target_n,
        "draft_decode_ms": draft_ms,
        "draft_decode_forwards": draft_n,
    }


def _pooled_ms(rows: Sequence[Row], what: str) -> float:
    # Pooled over all forwards of all runs (sum / count), as bench's per-forward means are.
    total = sum(_sweep_extra(r).get(f"{what}_ms", 0.0) for r in rows)
    count = sum(_sweep_extra(r).get(f"{what}_forwards", 0) for r in rows)
    return total / count if count else math.nan


def summarize(
    config: SweepConfig, plain: Mapping[int, Row], assisted: Mapping[int, Row], best_plain: float | None
) -> ConfigResult:
    """One configuration's numbers from its rows and its target's plain rows (example -> row)."""
    examples = sorted(set(plain) & set(assisted))
    if not examples:
        raise HarnessError(f"{config.label}: no prompt has both a plain and an assisted row to pair")
    p = [plain[e] for e in examples]
    a = [assisted[e] for e in examples]
    # A decode too short to time has no rate ("not timed"): the rates pair the prompts that have one.
    timed = [
        (x.tokens_per_s, y.tokens_per_s)
        for x, y in zip(p, a, strict=True)
        if all(math.isfinite(t) and t > 0 for t in (x.tokens_per_s, y.tokens_per_s))
    ]
    if not timed:
        raise HarnessError(
            f"{config.label}: no prompt's decode was long enough to time (under {MIN_TIMED_MS} ms after its "
            "first token): raise --max_new_tokens"
        )
    plain_tps, assisted_tps = [t[0] for t in timed], [t[1] for t in timed]
    drafted = sum(r.drafted for r in a)
    steps = [_sweep_extra(r) for r in a]
    alpha = analysis.alpha_mle(
        sum(s.get("accepted_steps", 0) for s in steps), sum(s.get("rejected_steps", 0) for s in steps)
    )
    target_ms = _pooled_ms(p, "target_decode")
    # Prompt lookup has no draft model: its proposal cost is Python time, counted in the non-forward
    # share, so its c is 0 rather than undefined.
    c = 0.0 if config.mode == "prompt_lookup" else _pooled_ms(a, "draft_decode") / target_ms
    v = _pooled_ms(a, "target_decode") / target_ms
    # Leviathan's formula is a chain of K draft-model tokens: a tree, and proposals from the context
    # (of any length, at no draft forward), are outside it, so they get no prediction.
    k = None if config.context else config.decoding(2).chain_k
    assisted_mean = statistics.fmean(assisted_tps)
    return ConfigResult(
        config=config,
        prompts=len(examples),
        plain_tokens_per_s=statistics.fmean(plain_tps),
        assisted_tokens_per_s=assisted_mean,
        speedup=stats.speedup_ci(plain_tps, assisted_tps, paired=True),
        vs_best_plain=assisted_mean / best_plain if best_plain else None,
        acceptance_rate=sum(r.accepted for r in a) / drafted if drafted else None,
        alpha=alpha,
        c=c,
        v=v,
        predicted_speedup=analysis.predict_speedup(alpha, k, c, 1.0),
        predicted_speedup_verify=analysis.predict_speedup(alpha, k, c, v),
        non_forward_share=statistics.fmean(r.other_ms / (r.total_s * 1000.0) for r in a),
        identical=all(list(plain[e].output_ids) == list(assisted[e].output_ids) for e in examples),
    )


# --------------------------------------------------------------------------- measuring


def _read_done(path: Path) -> dict[tuple[Any, ...], Row]:
    try:
        stored = read_rows(path)
    except ValueError as exc:  # a damaged line mid-file: say which, rather than a traceback
        raise HarnessError(f"cannot resume from {path}: {exc}") from exc
    # A later row of the same result wins, as in report tables.
    return {row.key(): row for row in stored}


def _arm(target_key: tuple[str, str], config: SweepConfig | None) -> str:
    """A sweep arm's label: the target's plain decoding (``config`` None) or a configuration's."""
    return plain_label(*target_key) if config is None else config.label


def _measure_group(
    pair_name: str | models.PairSpec,
    target_key: tuple[str, str],
    jobs: Sequence[experiment.Job[Prompt, SweepConfig | None]],
    stored: Callable[[experiment.Job[Prompt, SweepConfig | None]], Row | None],
    *,
    loader: Loader,
    new_tokens: int,
    run_id: str,
    platform: str,
    threads: int,
    rows_path: Path,
    bar: Any,
    warmup_tokens: int,
    devices: tuple[str, str],
) -> list[Row]:
    """Load one target and run its jobs through the measurement loop (``experiment.run``: stored
    rows reused, each arm warmed up, each row written as it finishes); every job's row, in order.

    A function of its own so every reference to the models dies when it returns and the caller can
    free the target before loading the next.
    """
    target_precision, kernels = target_key
    pending = [j for j in jobs if stored(j) is None]  # only their drafts are loaded
    draft_keys = sorted(
        {j.arm.draft_key for j in pending if j.arm is not None and j.arm.mode == "assisted"},
        key=lambda k: (str(k[0]), k[1] or 0, k[2] if len(k) > 2 else ""),
    )
    pairs = loader(
        pair_name,
        target_precision=target_precision,
        draft_precisions=tuple(draft_keys),
        target_kernels=kernels,
        target_device=devices[0],
        draft_device=devices[1],
    )
    any_pair = next(iter(pairs.values()))

    def pair_for(config: SweepConfig | None) -> models.LoadedPair:
        if config is not None and config.mode == "assisted":
            # Loaders keyed by precision alone (no vocabulary restriction) are accepted too.
            key = config.draft_key
            return pairs[key] if key in pairs else pairs[config.draft_precision]
        return any_pair

    def settings_for(config: SweepConfig | None, tokens: int) -> GenerationSettings:
        return _plain_settings(tokens) if config is None else config.settings(tokens)

    def warmup(job: experiment.Job[Prompt, SweepConfig | None]) -> None:
        pair = pair_for(job.arm)
        generate(
            pair, runner.prompt_ids(pair, job.item), settings_for(job.arm, min(warmup_tokens, new_tokens))
        )

    def measure(job: experiment.Job[Prompt, SweepConfig | None]) -> Row:
        pair = pair_for(job.arm)
        arm = _arm(target_key, job.arm)
        settings = settings_for(job.arm, new_tokens)
        m = generate(pair, runner.prompt_ids(pair, job.item), settings)
        sha = _prompt_digest(job.item)
        sweep_fields = {
            "config": arm,
            "target_kernels": kernels,
            "prompt": job.item.label,
            "prompt_sha": sha,
            "example": job.index,
            "position": job.position,  # place of this arm in the prompt's rotated order
            "threads": threads,
            **_forward_numbers(m),
        }
        row = runner.record(
            rows_path,
            pair,
            m,
            settings,
            example=job.index,
            task=TASK,
            label=job.item.label,
            platform=platform,
            run_id=run_id,
            prompt_sha=sha,
            extra={"sweep": sweep_fields},
        )
        bar.update(1)
        bar.set_postfix(arm=arm, tok_s=f"{row.tokens_per_s:.2f}")
        return row

    return experiment.run(
        jobs, measure, stored=stored, progress=False, warmup=warmup if warmup_tokens > 0 else None
    )


def run_sweep(
    pair_name: str | models.PairSpec,
    configs: Sequence[SweepConfig],
    prompts: Sequence[Prompt],
    new_tokens: int,
    rows_path: str | Path,
    loader: Loader = load_target_group,
    progress: bool = True,
    *,
    platform: str | None = None,
    warmup_tokens: int = WARMUP_TOKENS,
    command: str = "",
    devices: tuple[str, str] = ("cpu", "cpu"),
) -> SweepResult:
    """Measure every configuration on every prompt (plain once per target and prompt) and summarise.

    ``loader(pair_name, target_precision=, draft_precisions=, target_kernels=, target_device=,
    draft_device=)`` returns draft precision -> LoadedPair sharing one target (``load_target_group``);
    it is called once per target that still has unfinished runs, with ``devices`` (target, draft).
    Rows go to ``rows_path`` as each run finishes; rows already there for the same run are reused,
    not re-measured.
    """
    spec = models.get_pair(pair_name)
    configs = list(configs)
    prompts = list(prompts)
    if not configs:
        raise HarnessError("a sweep needs at least one configuration")
    labels = [c.label for c in configs]
    if len(set(labels)) != len(labels):
        raise HarnessError(f"configurations repeat a label ({', '.join(labels)}); remove the duplicates")
    if not prompts:
        raise HarnessError("a sweep needs at least one prompt")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 2:
        # Tokens/s is measured after the first token, so it needs at least two.
        raise HarnessError(f"new_tokens must be an integer of at least 2 (got {new_tokens!r})")
    platform = platform or platforms.detect().name
    threads = torch.get_num_threads()
    rows_path = Path(rows_path)
    done = _read_done(rows_path)
    digests = [_prompt_digest(p) for p in prompts]

    def arm_run(config: SweepConfig | None, first: SweepConfig) -> setup.RunSetup:
        """The run an arm is on the devices given: a configuration, or its target's plain decoding."""
        if config is not None:
            return config.run(spec.name, new_tokens, *devices)
        run = first.run(spec.name, new_tokens, *devices)
        return dataclasses.replace(run, draft=None, decoding=_plain_settings(new_tokens))

    # Per target: its run id, and its plain arm and configurations interleaved prompt by prompt.
    plans = []
    for target_key, group in group_configs(configs).items():
        run_id = _run_id(spec.name, group[0], new_tokens, platform, threads)
        jobs = experiment.interleave(prompts, [None, *group])

        def stored(job, run_id=run_id, group=group) -> Row | None:
            # A finished run is known before anything loads (by the key its row has, from the run
            # the configuration is): a target with none left is not loaded.
            run = arm_run(job.arm, group[0])
            return done.get(
                setup.result_key(
                    run, run_id=run_id, task=TASK, example=job.index, prompt_sha=digests[job.index - 1]
                )
            )

        plans.append((target_key, run_id, jobs, stored))

    total = sum(len(jobs) for _, _, jobs, _ in plans)
    todo = sum(stored(job) is None for _, _, jobs, stored in plans for job in jobs)
    print(f"resumed {total - todo} of {total} runs from {rows_path}", file=sys.stderr)
    bar = tqdm(total=todo, desc=f"{spec.name} sweep", unit="run", file=sys.stderr, disable=not progress)
    rows: dict[tuple[str, int], Row] = {}  # (arm, example) -> row
    try:
        for target_key, run_id, jobs, stored in plans:
            ordered = experiment.by_item(jobs)
            if all(stored(job) is not None for job in jobs):
                got = [stored(job) for job in ordered]
            else:
                bar.set_description(f"{spec.name} target {target_key[0]} ({target_key[1]} kernels)")
                got = _measure_group(
                    spec.name,
                    target_key,
                    jobs,
                    stored,
                    loader=loader,
                    new_tokens=new_tokens,
                    run_id=run_id,
                    platform=platform,
                    threads=threads,
                    rows_path=rows_path,
                    bar=bar,
                    warmup_tokens=warmup_tokens,
                    devices=devices,
                )
                # The group's models are unreachable now; collect them before the next target loads.
                gc.collect()
            rows.update(
                {(_arm(target_key, j.arm), j.index): row for j, row in zip(ordered, got, strict=True)}
            )
    finally:
        bar.close()

    def rows_of(arm: str) -> dict[int, Row]:
        return {i: rows[arm, i] for i in range(1, len(prompts) + 1) if (arm, i) in rows}

    plain_by_target = {key: rows_of(plain_label(*key)) for key, _, _, _ in plans}
    plain_means = {
        key: statistics.fmean(r.tokens_per_s for r in got.values())
        for key, got in plain_by_target.items()
        if got
    }
    best = max(plain_means.items(), key=lambda kv: kv[1]) if plain_means else None
    results = tuple(
        summarize(c, plain_by_target[c.target_key], rows_of(c.label), best[1] if best else None)
        for c in configs
    )
    return SweepResult(
        pair=spec.name,
        platform=platform,
        machine=platforms.detect(),
        threads=threads,
        versions=platforms.library_versions(),
        prompt_labels=tuple(p.label for p in prompts),
        new_tokens=new_tokens,
        rows_path=rows_path,
        results=results,
        best_plain=(plain_label(*best[0]), best[1]) if best else None,
        command=command,
    )


def default_rows_path(results_dir: str | Path, platform: str, pair: str) -> Path:
    # In a folder of their own: --regen-tables reads results/rows/*.jsonl into the per-model tables,
    # where a sweep's many configurations would add sections whose printed commands do not reproduce them.
    return Path(results_dir) / "rows" / "sweep" / f"{files.file_name(pair)}-{files.file_name(platform)}.jsonl"


# --------------------------------------------------------------------------- llama.cpp around a sweep


def reference_path(rows_path: str | Path) -> Path:
    """Where the llama.cpp references measured around the sweeps of ``rows_path`` are kept: a store
    of their own beside it (the sweep's rows are all measured rows)."""
    rows_path = Path(rows_path)
    return rows_path.parent.parent / "llamacpp" / rows_path.name


def write_reference(
    rows_path: str | Path, ref: llamacpp.Reference, gguf: str, started: str, finished: str, platform: str
) -> None:
    """Append llama.cpp's plain decoding measured around a sweep (``llamacpp.around``'s reference),
    with the sweep's time window: the results page shows it under the table whose rows lie in it."""
    append_row(
        reference_path(rows_path),
        {
            "platform": platform,
            "gguf": gguf,
            "build": ref.build,
            "threads": ref.threads,
            "new_tokens": ref.new_tokens,
            "before": ref.before,
            "after": ref.after,
            "tokens_per_s": ref.tokens_per_s,
            "started": started,
            "finished": finished,
        },
    )


def covering_reference(
    references: Sequence[Mapping[str, Any]], rows: Sequence[Row]
) -> Mapping[str, Any] | None:
    """The newest reference whose time window holds every one of ``rows`` (measured around them),
    or None: a reference measured around another sweep says nothing about these rows."""
    stamps = [r.timestamp for r in rows if r.timestamp]
    if not stamps or len(stamps) < len(rows):
        return None
    first, last = min(stamps), max(stamps)
    around = [
        ref for ref in references if ref.get("started", "") <= first and last <= ref.get("finished", "")
    ]
    return max(around, key=lambda ref: ref["finished"], default=None)
