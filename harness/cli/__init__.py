"""``python assisted_generation.py``: the seeds' command line, kept, with every setting exposed.

The seeds' flags (``--model_name``, ``--task``, ``--assisted_generation``, ``--draft_precision``,
``--fast_attention``, ``--do_sample``, ``--temperature``) behave as users know them; the rest pin what
the originals left to library defaults. Errors in flags or inputs print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import report
from harness.base import backends, devices, files, llamacpp, platforms, tasks
from harness.base.errors import HarnessError, caused_by_interrupt
from harness.cli.parser import (
    BENCHMARK_NEW_TOKENS,
    BENCHMARK_PROMPT_LENGTHS,
    DECODING,
    EXIT_USAGE,
    HUMANEVAL_NEW_TOKENS,
    PROMPTS_FILE_NEW_TOKENS,
    build_parser,
)
from harness.decoding import engines
from harness.experiments import humaneval, runner, sweep
from harness.kernels import llama_build
from harness.pairs import models
from harness.report import sweep as sweep_report
from harness.settings import configs as sweep_spec
from harness.settings import results, setup
from harness.weights import packaged


def _prompts(
    args: argparse.Namespace, pair: models.LoadedPair, from_file: list[tasks.Prompt] | None
) -> list[tasks.Prompt]:
    if from_file is not None:
        prompts = from_file
    elif args.context_tokens is not None:
        return _long_contexts(args, pair.tokenizer, args.max_new_tokens or tasks.LONG_CONTEXT_NEW_TOKENS)
    elif args.task == "decode":
        # A registered pair's kind chooses; a pair of the user's own files gets both kinds, never a
        # guess from a folder name.
        own = pair.spec.target.path is not None
        kind = "mixed" if own else "code" if pair.spec.kind == "code" else "general"
        prompts = tasks.decode_prompts(kind)
        print(
            f"decode task: the {kind} prompt set ({len(prompts)} prompts, "
            + (
                "questions and code completions alternating, for a pair of your own files"
                if own
                else "the pair's kind"
            )
            + "); --prompts SET[,SET]|FILE chooses (--list-prompts lists the sets)",
            file=sys.stderr,
        )
    elif args.task == "benchmark":
        prompts = tasks.benchmark_prompts(pair.tokenizer, args.prompt_lengths, args.new_tokens)
    else:
        prompts = humaneval.prompts(args.limit, args.max_new_tokens or HUMANEVAL_NEW_TOKENS, pair.tokenizer)
    if args.limit is not None:
        prompts = prompts[: args.limit]
    for prompt in prompts:
        budget = args.max_new_tokens or prompt.max_new_tokens
        if args.min_new_tokens > budget:
            raise HarnessError(
                f"--min_new_tokens {args.min_new_tokens} exceeds the {budget}-token budget of prompt "
                f"{prompt.label!r}; lower it or raise --max_new_tokens"
            )
    return prompts


def _long_contexts(args: argparse.Namespace, tokenizer: Any, new_tokens: int) -> list[tasks.Prompt]:
    """``--context-tokens``: --limit prompts at each length, the lengths in turn."""
    count = args.limit or tasks.LONG_CONTEXT_PROMPTS
    by_length = (tasks.long_context_prompts(tokenizer, n, count, new_tokens) for n in args.context_tokens)
    return [p for prompts in by_length for p in prompts]


def _check_flags(args: argparse.Namespace) -> None:
    """Flag values argparse cannot judge, checked before anything slow (model loading) starts."""
    results.check_out_folder("--results_dir", getattr(args, "results_dir", None))
    for flag in ("limit", "max_new_tokens", "num_assistant_tokens", "prompt_lookup", "threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise HarnessError(f"--{flag} must be at least 1 (got {value})")
    if args.min_new_tokens < 0:
        raise HarnessError(f"--min_new_tokens must be 0 or more (got {args.min_new_tokens})")
    if args.concurrency is not None:
        if args.task != "decode":
            raise HarnessError("--concurrency runs the decode task's prompts: use it with --task decode")
        from harness.experiments import concurrency

        concurrency.check_concurrency(engines.engine_class(args.engine), args.concurrency)
    if args.context_tokens is not None:
        if min(args.context_tokens) < 64:
            raise HarnessError(f"--context-tokens must be at least 64 (got {min(args.context_tokens)})")
        if args.task not in ("decode", "sweep") or args.prompts is not None:
            raise HarnessError(
                "--context-tokens builds the prompts of --task decode or --task sweep: use it with one of "
                "them and without --prompts"
            )
    if args.weights_dir is not None and not Path(args.weights_dir).expanduser().is_dir():
        raise HarnessError(
            f"--weights_dir {args.weights_dir} is not a folder; pass the folder that holds the model "
            "folders (see --list-models for the names looked for)"
        )
    if args.json is not None:
        results.check_rows_path(Path(args.json))
    if not 0 <= args.seed < 2**63:
        raise HarnessError(f"--seed must be in [0, 2**63) (got {args.seed})")
    if args.draft_vocab is not None and args.draft_vocab < 0:
        raise HarnessError(
            f"--draft_vocab must be 0 (the whole vocabulary) or a positive count (got {args.draft_vocab})"
        )
    if args.platform is not None and args.platform != platforms.slug(args.platform):
        raise HarnessError(
            f"--platform {args.platform!r} must be a slug (lower-case letters, digits and '-'), e.g. "
            f"{platforms.slug(args.platform) or 'my-laptop-8c'!r}: it names folders"
        )
    if args.target_backend == "torch" and args.execution_provider != backends.DEFAULT_PROVIDER:
        raise HarnessError(
            f"--execution_provider {args.execution_provider} applies to ONNX Runtime targets only; add "
            "--target_backend onnxruntime or drop it"
        )
    if not engines.engine_class(args.engine).own_devices:
        # An engine that places its models on its own devices (NPU, GPU) checks them itself.
        devices.check_device(args.target_device)
        devices.check_device(args.draft_device)
    _check_threads(args.threads)
    _check_ignored(args)


def _check_threads(threads: int | None) -> None:
    # More threads than the machine has cores only slows a decode, and a count past what the thread
    # pools take ends in a native panic rather than an error: bound it by the machine.
    most = 4 * (os.cpu_count() or 1)
    if threads is not None and threads > most:
        raise HarnessError(
            f"--threads {threads} is more than this machine can use ({os.cpu_count()} cores); "
            f"pass at most {most} (or leave it out: one thread per core)"
        )


def _check_ignored(args: argparse.Namespace) -> None:
    """Flags the chosen run would not read are refused, never recorded as if they had effect."""
    if args.rows is not None and not args.regen_tables:
        raise HarnessError("--rows is read by --regen-tables only; add --regen-tables or drop --rows")
    if args.llama_bench is not None and args.task != "sweep":
        raise HarnessError(
            f"--llama-bench times llama.cpp's reference row of --task sweep; it does nothing for --task "
            f"{args.task}: drop it or add --task sweep"
        )
    for name in engines.names():
        cls = engines.engine_class(name)
        given = {option: getattr(args, option, None) for option in cls.options}
        for option in (o for o, value in given.items() if value is not None and name != args.engine):
            flag = "--" + option.replace("_", "-")
            raise HarnessError(f"{flag} is read by --engine {name} only: add that or drop the flag")
        if name == args.engine:
            cls.take_options(given)
    if args.target_backend == "torch":
        for flag in ("ort_block_size", "ort_accuracy_level"):
            if getattr(args, flag) is not None:
                raise HarnessError(
                    f"--{flag} sets the ONNX Runtime export; the torch target does not read it: add "
                    "--target_backend onnxruntime or drop it"
                )
    if args.engine != "transformers":
        # An engine with its own loop drafts a constant K: transformers' schedules are not run.
        for flag in ("assistant_schedule", "assistant_confidence_threshold"):
            if getattr(args, flag) is not None:
                raise HarnessError(
                    f"--{flag} is a setting of transformers' draft loop; --engine {args.engine} drafts "
                    "a constant --num_assistant_tokens: drop it"
                )
    if getattr(args, "draft_tree", None):
        # A tree proposes its own shape each round: K and the schedules shape a chain.
        for flag in ("num_assistant_tokens", "assistant_schedule", "assistant_confidence_threshold"):
            if getattr(args, flag) is not None:
                raise HarnessError(f"--{flag} shapes a chain of K; --draft_tree proposes a tree: drop one")
    if not args.do_sample:
        for flag in ("temperature", "top_p", "top_k"):
            if getattr(args, flag) != getattr(DECODING, flag):
                raise HarnessError(
                    f"--{flag} shapes sampling; without --do_sample the run decodes greedily and would "
                    "not read it: add --do_sample or drop it"
                )
    if not (
        args.compare or args.assisted_generation or args.prompt_lookup is not None or args.task == "sweep"
    ):
        for flag in (
            "num_assistant_tokens",
            "draft_tree",
            "assistant_schedule",
            "assistant_confidence_threshold",
            "synthetic_acceptance",
        ):
            if getattr(args, flag, None) is not None:
                raise HarnessError(
                    f"--{flag} shapes the draft's proposals; this run decodes plainly, without a draft: add "
                    "--assisted_generation (or --compare) or drop it"
                )
    if args.task != "benchmark":
        for flag, default in (
            ("prompt_lengths", BENCHMARK_PROMPT_LENGTHS),
            ("new_tokens", BENCHMARK_NEW_TOKENS),
        ):
            if tuple(getattr(args, flag)) != default:
                raise HarnessError(
                    f"--{flag} sets the synthetic prompts of --task benchmark; --task {args.task} does not "
                    "read it: add --task benchmark or drop it (--max_new_tokens sets any task's budget)"
                )
    if (
        args.assistant_confidence_threshold is not None
        and (args.assistant_schedule or "dynamic") != "dynamic"
    ):
        raise HarnessError(
            "--assistant_confidence_threshold is read by --assistant_schedule dynamic only; drop it or "
            "pass --assistant_schedule dynamic"
        )


def _run_setup(args: argparse.Namespace, spec: models.PairSpec, modes: Sequence[str]) -> setup.RunSetup:
    """The run the flags ask for, resolved once (its mode the last of ``modes``: the one that may
    need a draft)."""
    # Every decoding setting that has a flag of its own name (sampling, the new-token floor, any
    # setting added to FIELDS and GenerationSettings), as given.
    names = {f.name for f in dataclasses.fields(setup.GenerationSettings)}
    given = {
        f.column: getattr(args, f.column)
        for f in setup.FIELDS
        if f.flag == f"--{f.column}" and f.column in names and getattr(args, f.column, None) is not None
    }
    decoding = setup.GenerationSettings(
        **{
            **given,
            "mode": modes[-1],
            # Without --max_new_tokens each prompt's own budget applies (the runner replaces this per
            # prompt); the placeholder only has to pass validation.
            "max_new_tokens": args.max_new_tokens
            if args.max_new_tokens is not None
            else max(1, args.min_new_tokens),
            "assistant_confidence_threshold": setup.DEFAULT_CONFIDENCE_THRESHOLD
            if args.assistant_confidence_threshold is None
            else args.assistant_confidence_threshold,
            # Not `value or default`: an explicit 0 must reach validation and fail, not the default.
            "prompt_lookup_num_tokens": 10 if args.prompt_lookup is None else args.prompt_lookup,
            "ignore_eos": args.ignore_eos,
        }
    )
    run = engines.resolve(
        spec,
        target_precision=args.target_precision,
        target_kernels=args.target_kernels,
        # An engine with its own loop runs its own runtime's target (--target_backend is the harness's).
        target_backend=args.target_backend if args.engine == engines.BUILT_IN else None,
        provider=args.execution_provider,
        ort_block_size=args.ort_block_size,  # None: the export's default
        ort_accuracy_level=args.ort_accuracy_level,
        target_device=args.target_device,
        engine=args.engine,
        draft_precision=args.draft_precision,
        draft_kernels=args.draft_kernels,
        draft_vocab=args.draft_vocab,
        draft_device=args.draft_device,
        with_draft="assisted" in modes,
        decoding=decoding,
        num_assistant_tokens=args.num_assistant_tokens,
        assistant_schedule=args.assistant_schedule,
        endpoint=args.endpoint,
        speculative_endpoint=args.speculative_endpoint,
    )
    for mode in modes:
        dataclasses.replace(run.decoding, mode=mode).validate()
    return run


def _use_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _pair_spec(args: argparse.Namespace) -> models.PairSpec:
    """The registered pair, or one made of local folders (checked now, before anything loads)."""
    if args.model_name_or_path is None:
        if args.assistant_model is not None:
            raise HarnessError(
                "--assistant_model goes with --model_name_or_path (a registered pair has its draft)"
            )
        return models.get_pair(args.model_name)
    if args.model_name != models.DEFAULT_PAIR:
        raise HarnessError("--model_name and --model_name_or_path are alternatives: give one")
    return models.local_pair(args.model_name_or_path, args.assistant_model)


def _modes(args: argparse.Namespace) -> tuple[str, ...]:
    if args.prompt_lookup is not None and args.assisted_generation:
        raise HarnessError("--prompt_lookup and --assisted_generation are alternatives: choose one")
    if args.prompt_lookup is not None and args.assistant_model is not None:
        raise HarnessError(
            "--prompt_lookup proposes from the prompt, with no draft model; --assistant_model would not be "
            "read: drop one"
        )
    assisted = "prompt_lookup" if args.prompt_lookup is not None else "assisted"
    if args.compare:
        return ("plain", assisted)
    if args.assisted_generation or args.prompt_lookup is not None:
        return (assisted,)
    return ("plain",)


def _holds_rows(folder: Path) -> bool:
    return any(folder.glob("**/*.jsonl"))


def regen(args: argparse.Namespace) -> int:
    """``--regen-tables``: the per-model tables and the results page. Read from ``--rows`` files, else
    from ``--results_dir`` when it holds rows, else from the committed ``results/``; written into
    ``--results_dir`` (default ``results/``), so a page can be built into any folder and the
    committed one left untouched."""
    from harness.report import page

    out = Path(args.results_dir or "results")
    results.check_out_folder("--results_dir", str(out))
    missing = [p for p in args.rows or () if not Path(p).is_file()]
    if missing:
        raise HarnessError(f"--rows: no such file {', '.join(missing)}; pass JSONL row files of earlier runs")
    source = out if args.rows or _holds_rows(out) else Path("results")
    paths = [Path(p) for p in args.rows] if args.rows else sorted(Path(source, "rows").glob("*.jsonl"))
    if not paths:
        raise HarnessError(
            f"no row files found (looked for {Path(source, 'rows')}/*.jsonl); "
            "run with --json PATH first or pass --rows FILE ..."
        )
    rows_by_file: dict[str, list[results.Row]] = {}
    for path in paths:
        try:
            rows_by_file[str(path)] = results.read_rows(path)
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
            raise HarnessError(
                f"--rows {path} is not a rows file of this harness ({type(exc).__name__}: {exc}); pass the "
                "JSONL rows an earlier run wrote (--json, or under runs/)"
            ) from None
    written = report.regen_results([r for rows in rows_by_file.values() for r in rows], out)
    if args.rows:
        # The page of the rows given: their benchmark sections, machine by machine.
        written.append(page.write_rows_page(out, rows_by_file))
    else:
        # The results page covers every row file of the source folder (sweeps, divergence and
        # HumanEval rows too) and the baselines beside it.
        written.append(page.write_results_page(source, out=out))
    for path in written:
        print(path)
    return 0


def _say_fastest(args: argparse.Namespace, spec: models.PairSpec) -> None:
    """A pair of the user's own files runs fp32 on stock kernels unless flags say otherwise: say which
    flags run the fastest exact configuration the suite has for it, where none of them was given."""
    chosen = (args.target_precision, args.draft_precision, args.target_kernels, args.draft_kernels)
    flags = models.fastest_exact_flags(spec) if spec.target.path and args.engine == engines.BUILT_IN else None
    if flags and not any(chosen) and args.target_backend == "torch":
        print(
            f"note: a pair of your own files runs fp32 on stock kernels; the fastest exact configuration for "
            f"it: {flags}",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        print(report.pairs_table(models.list_pairs(), args.weights_dir, wide=args.wide))
        return 0
    if args.list_prompts:
        from tabulate import tabulate

        table = [[name, count, what] for name, count, what in tasks.list_prompt_sets()]
        print(tabulate(table, headers=["--prompts", "prompts", "what"], tablefmt="github"))
        print("several sets: --prompts chat,rag,code_editing (taken in turn, so --limit N spans them)")
        return 0
    if args.regen_tables:
        return regen(args)
    if args.task == "sweep" or args.sweep is not None:
        return run_sweep(args)
    modes = _modes(args)
    spec = _pair_spec(args)
    _check_flags(args)
    run = _run_setup(args, spec, modes)
    # Read before loading: a typo in the path should not cost a model load.
    from_file = (
        tasks.prompts_of(args.prompts, args.max_new_tokens or PROMPTS_FILE_NEW_TOKENS)
        if args.prompts
        else None
    )
    if args.fast_attention:
        print(
            "note: --fast_attention is a Ryzen AI NPU kernel option; not supported here, ignored.",
            file=sys.stderr,
        )
    models.offline_env()
    _use_threads(args.threads)
    _say_fastest(args, spec)
    pair = engines.load(spec, run, weights_dir=args.weights_dir, verify=args.verify)
    prompts = _prompts(args, pair, from_file)
    platform = args.platform or platforms.detect().name
    defaults = setup.defaults(pair.spec)
    if args.concurrency is not None:
        return run_concurrency(args, pair, prompts, run.decoding, modes, platform)
    try:
        rows = runner.run_prompts(
            pair,
            prompts,
            run.decoding,
            modes=modes,
            task=args.task,
            json_path=args.json,
            platform=platform,
            max_new_tokens=args.max_new_tokens,
            progress=False if args.no_progress else None,
        )
    except KeyboardInterrupt:
        where = f"; finished rows are in {args.json}" if args.json else ""
        print(f"interrupted{where}", file=sys.stderr)
        return 130
    command = reproduce(args, rows[-1], defaults)
    target, draft = pair.target_setup, pair.draft_setup
    for mode in modes:
        mode_rows = [r for r in rows if r.mode == mode]
        print(
            f"\n## {mode} ({pair.spec.name}, target {target.precision}"
            + (f" on onnxruntime {target.provider}" if target.backend == "onnxruntime" else "")
            + (f", draft {draft.precision}" if mode == "assisted" and draft else "")
            + ")\n"
        )
        print(f"```{command}```\n")
        print(report.seed_table(mode_rows, acceptance=mode != "plain", wide=args.wide))
    print()
    if args.compare:
        print(report.compare_table(rows, defaults, wide=args.wide, shown=command))
    # With --compare the table above has said the speedup (and its cautions): the rates only here.
    print(report.summary_line(rows, defaults, speedup=not args.compare))
    return 0


def run_concurrency(
    args: argparse.Namespace,
    pair: models.LoadedPair,
    prompts: list[tasks.Prompt],
    decoding: setup.GenerationSettings,
    modes: Sequence[str],
    platform: str,
) -> int:
    """``--concurrency``: each level in each mode, its table, and its plot."""
    from harness.experiments import concurrency
    from harness.report import concurrency as concurrency_report

    levels = concurrency.measure_levels(
        pair, prompts, decoding, args.concurrency, modes, json_path=args.json, platform=platform,
        max_new_tokens=args.max_new_tokens, progress=not args.no_progress,
    )  # fmt: skip
    engine = pair.engine.name if pair.engine is not None else engines.BUILT_IN
    title = concurrency_report.title(pair.spec.name, engine, platform)
    png = (
        Path(args.json).with_suffix(".png")
        if args.json
        else results.runs_dir() / platform / f"concurrency-{pair.spec.name}-{files.file_name(engine)}.png"
    )
    files.atomic_write(png, concurrency_report.plot(levels, title))
    print(f"\n## {title}\n")
    print(concurrency_report.table(levels))
    print(f"\nplot: {png}")
    return 0


def reproduce(args: argparse.Namespace, row: results.Row, defaults: dict) -> str:
    """The command that reruns this invocation: the row's settings (``setup.command``), the modes
    (``--compare`` when plain and assisted ran together), and what chose the prompts, their budget and
    the rows file, so that running it again resumes every row it printed beside."""
    words = shlex.split(setup.command(row, defaults))
    if args.compare:
        words = [w for w in words if w != "--assisted_generation"] + ["--compare"]
    for flag in ("limit", "max_new_tokens", "prompts", "json", "threads", "platform", "weights_dir"):
        value = getattr(args, flag)
        if value is not None:
            words += [f"--{flag}", str(value)]
    if args.context_tokens is not None:
        words += ["--context-tokens", ",".join(str(n) for n in args.context_tokens)]
    if args.task == "benchmark":
        words += ["--prompt_lengths", ",".join(map(str, args.prompt_lengths))]
        words += ["--new_tokens", ",".join(map(str, args.new_tokens))]
    if args.ignore_eos:
        words.append("--ignore_eos")
    return shlex.join(words)


# Flags that set one decoding configuration; a sweep takes its configurations from --sweep instead.
_NOT_FOR_SWEEP = (
    ("assisted_generation", "--assisted_generation"),
    ("compare", "--compare"),
    ("prompt_lookup", "--prompt_lookup"),
    ("num_assistant_tokens", "--num_assistant_tokens"),
    ("target_precision", "--target_precision"),
    ("draft_precision", "--draft_precision"),
    ("draft_vocab", "--draft_vocab"),
)


def _sweep_configs(args: argparse.Namespace, spec: models.PairSpec) -> list[sweep_spec.SweepConfig]:
    """Check every sweep flag and configuration before any model loads."""
    if args.task != "sweep":
        raise HarnessError(f"--sweep is used with --task sweep, not --task {args.task}; add --task sweep")
    for attr, flag in _NOT_FOR_SWEEP:
        if getattr(args, attr) not in (None, False):
            raise HarnessError(
                f"{flag} does not apply to --task sweep: each configuration sets it in --sweep "
                "(e.g. --sweep 't=fp32,d=w8af32,k=3;t=fp32,mode=prompt_lookup,k=10')"
            )
    if args.assistant_schedule is not None:
        raise HarnessError("--assistant_schedule does not apply to --task sweep: write sched=... in --sweep")
    for flag in ("target_kernels", "draft_kernels"):
        if getattr(args, flag) not in (None, "stock"):
            key = "kernels" if flag == "target_kernels" else "dk"
            raise HarnessError(f"--{flag} does not apply to --task sweep: write {key}=... in --sweep")
    if args.do_sample:
        # Greedy only: whether assistance changed the output is one of the things a sweep reports.
        raise HarnessError(
            "--task sweep decodes greedily (it checks outputs equal plain greedy); drop --do_sample"
        )
    _check_flags(args)
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        raise HarnessError(f"--task sweep needs --max_new_tokens of at least 2 (got {args.max_new_tokens})")
    configs = sweep_spec.parse_configs(
        sweep_spec.DEFAULT_SPEC if args.sweep is None else args.sweep, engines.sweep_target(spec)
    )
    for config in configs:
        # Each configuration as the run it loads, checked as every run is (its engine's check).
        engines.check(spec, config.run(spec.name, 2, args.target_device, args.draft_device))
    return configs


def run_sweep(args: argparse.Namespace) -> int:
    """``--task sweep``: measure every --sweep configuration, print the table, write .md/.png and rows."""
    spec = _pair_spec(args)
    configs = _sweep_configs(args, spec)
    gguf = models.gguf_file(spec.target, None)
    bench_binary = llama_build.reference_binary(args.llama_bench, gguf, packaged.cache_root())
    new_tokens = args.max_new_tokens or sweep.DEFAULT_NEW_TOKENS
    limit = args.limit or sweep.DEFAULT_LIMIT
    if args.prompts:
        prompts = tasks.prompts_of(args.prompts, new_tokens)[:limit]
    elif args.context_tokens is not None:
        limit = args.limit or tasks.LONG_CONTEXT_PROMPTS
        prompts = _long_contexts(args, models.tokenizer_of(spec.target, args.weights_dir), new_tokens)
    else:
        prompts = humaneval.prompts(limit, new_tokens)
    platform = args.platform or platforms.detect().name
    given_dir = args.results_dir
    # An ordinary run never writes the committed results/: publishing is --regen-tables.
    args.results_dir = args.results_dir or str(results.runs_dir())
    rows_path = (
        Path(args.json) if args.json else sweep.default_rows_path(args.results_dir, platform, spec.name)
    )
    command = ["python", "assisted_generation.py", "--model_name", spec.name, "--task", "sweep"]
    command += ["--sweep", sweep_spec.DEFAULT_SPEC if args.sweep is None else args.sweep]
    command += ["--limit", str(limit), "--max_new_tokens", str(new_tokens)]
    if args.prompts:
        command += ["--prompts", args.prompts]
    if args.context_tokens is not None:
        command += ["--context-tokens", ",".join(str(n) for n in args.context_tokens)]
    # Where its rows are, so the command, run again, resumes them.
    for flag, value in (("--json", args.json), ("--results_dir", given_dir), ("--platform", args.platform)):
        if value is not None:
            command += [flag, value]
    models.offline_env()
    _use_threads(args.threads)
    loader = functools.partial(sweep.load_target_group, verify=args.verify, weights_dir=args.weights_dir)

    def measure() -> sweep.SweepResult:
        return sweep.run_sweep(
            spec,
            configs,
            prompts,
            new_tokens,
            rows_path,
            loader=loader,
            progress=not args.no_progress,
            platform=platform,
            command=shlex.join(command),
            devices=(args.target_device, args.draft_device),
        )

    started = results.utc_now()
    try:
        result, ref, line = llamacpp.around(
            bench_binary, gguf, spec.target.name, measure, threads=torch_threads(), new_tokens=new_tokens
        )
    except KeyboardInterrupt:
        print(
            f"interrupted; finished runs are in {rows_path}; rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    if ref is not None and gguf is not None:
        sweep.write_reference(rows_path, ref, gguf.name, started, results.utc_now(), platform)
    reference = llama_reference(ref, line, result)
    md_path, png_path = sweep_report.write_sweep(result, args.results_dir, reference)
    print(sweep_report.sweep_table(result, wide=args.wide))
    print(f"\n{reference}")
    print(f"\nwrote {md_path} and {png_path}; rows in {rows_path}")
    return 0


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def llama_reference(ref: llamacpp.Reference | None, line: str, result: sweep.SweepResult) -> str:
    """The llama.cpp line (measured around the sweep, or why there is none) with this sweep's fastest
    plain and fastest exact assisted decoding as multiples of it."""
    if ref is None:
        return line
    if result.best_plain:
        line += f"; fastest plain here {result.best_plain[1] / ref.tokens_per_s:.2f}x of it"
    exact = [r.assisted_tokens_per_s for r in result.results if r.identical and r.assisted_tokens_per_s]
    if exact:
        line += f"; fastest exact assisted here {max(exact) / ref.tokens_per_s:.2f}x of it"
    return line


def _interruptible(seen: list[int]) -> None:
    """Ctrl-C (SIGINT) always stops a run, its finished rows kept. A process started with SIGINT
    ignored (a shell script's ``cmd &``, some job runners) inherits that, and Python then leaves it
    ignored: such a run would decode on to the end, whatever an interrupt asked. Each interrupt is
    noted in ``seen``: while a library loads, it can surface as that library's own error."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    interrupts: list[int] = []
    _interruptible(interrupts)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except HarnessError as exc:
        # Same shape as argparse's own errors, so every usage problem reads alike.
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Exception, KeyboardInterrupt) as exc:
        # Outside the decoding loops (which say where their rows are): an interrupt while loading
        # or preparing, as itself or as a library's error it caused.
        if not interrupts and not caused_by_interrupt(exc):
            raise
        print("interrupted while preparing; no row was being written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
