"""The command line's flags: every setting that changes speed or output, both spellings, defaults shown."""

from __future__ import annotations

import argparse
from typing import Any

from harness.base import backends, llamacpp, tasks
from harness.decoding import engines
from harness.experiments import sweep
from harness.kernels import invariant
from harness.pairs import models
from harness.settings import configs as sweep_spec
from harness.settings import precision, setup

EXIT_USAGE = 2
# HumanEval budget: the humaneval module's measurements used 384 new tokens per problem.
HUMANEVAL_NEW_TOKENS = 384
# --prompts files without --max_new_tokens.
PROMPTS_FILE_NEW_TOKENS = 128


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag prints one line (not the whole usage block) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every default shown, except where there is none to show or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # Identity, not equality: a default of 0 is shown, only "no default" (None, False) is not.
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return text
        if "default" in text:
            return text
        return super()._get_help_string(action)


def _add(group: argparse._ActionsContainer, *names: str, **kw: object) -> argparse.Action:
    """``add_argument`` taking each flag with underscores and with hyphens (``--model_name`` and
    ``--model-name``): the seeds' spelling and pytest's both work."""
    spellings = [
        n
        for name in names
        for n in (name, "--" + name[2:].replace("_", "-"), "--" + name[2:].replace("-", "_"))
    ]
    if "dest" not in kw:
        kw["dest"] = names[0][2:].replace("-", "_")
    return group.add_argument(*dict.fromkeys(spellings), **kw)


# The decoding and export settings' own defaults: the flags show and use them, never a second copy.
DECODING = setup.GenerationSettings()
# --task benchmark's synthetic prompts: every length with every budget.
BENCHMARK_PROMPT_LENGTHS = (256, 512, 1024, 2048)
BENCHMARK_NEW_TOKENS = (64, 128, 256)
ORT = backends.OrtSettings()


def _int_list(text: str) -> tuple[int, ...]:
    return tasks.parse_int_list(text)


def setting_flags() -> dict[str, tuple[str, dict[str, Any]]]:
    """How each run setting's flag is offered: ``setup.FIELDS`` names the settings and their flags
    (the columns rows carry, the reproduce command's spelling); here each gets its group, type,
    choices, default and help. ``build_parser`` adds the flags from ``FIELDS`` in its order, so a
    setting is one entry there and one here (a test holds the two lists equal)."""
    return {
        "model": (
            "run",
            dict(
                default=models.DEFAULT_PAIR,
                help="registered pair (see --list-models)",
            ),
        ),
        "target_precision": (
            "models",
            dict(
                choices=(
                    *precision.PRECISIONS,
                    *precision.BLOCK_PRECISIONS,
                    *(set(backends.ORT_PRECISIONS) - set(precision.PRECISIONS)),
                ),
                help="default: the pair's (torch) or int4 (onnxruntime, which offers int4 and fp32); gguf:"
                " the model's GGUF file's own 4/6-bit blocks on batch-invariant kernels; q4k: its "
                "weights quantized to Q4_K blocks on those kernels",
            ),
        ),
        "target_kernels": (
            "models",
            dict(
                choices=invariant.KERNELS,
                help="default: the pair's. Target kernels: stock (torch/BLAS) or invariant "
                "(batch-invariant: every verification row equals the one-token decode step bit for "
                "bit, so assisted == plain at every precision)",
            ),
        ),
        "target_backend": (
            "models",
            dict(
                choices=backends.BACKENDS,
                default="torch",
                help="what runs the target: torch, or onnxruntime (the target exported to ONNX once, "
                "cached, run on --execution_provider; the draft stays in torch on the CPU)",
            ),
        ),
        "execution_provider": (
            "models",
            dict(
                default=backends.DEFAULT_PROVIDER,
                help="ONNX Runtime execution provider for the target (onnxruntime backend); one this build"
                " lacks fails with the list of those it has",
            ),
        ),
        "target_device": (
            "models",
            dict(
                default="cpu",
                help="cpu, cuda[:N] (npu: not available here)",
            ),
        ),
        "engine": (
            "models",
            dict(
                choices=engines.names(),
                default="transformers",
                help="what runs the decoding loop: transformers' generate (torch or ONNX Runtime target), "
                "or onnxruntime-genai's own Generator and speculative decoding (target and draft "
                "exported by its model builder at --target_precision int4|fp32 and the --ort_* "
                "settings; greedy or sampled), or llama.cpp's own llama-server and speculative "
                "decoding over the pair's GGUF files (--llama-server PATH, or built once on first use), or a "
                "served deployment's plain and speculative endpoints (--endpoint, --speculative-endpoint)",
            ),
        ),
        "endpoint": (
            "models",
            dict(
                default=None,
                metavar="URL",
                help="--engine served: the base URL of a deployment's plain decoding (llama-server, vLLM, "
                "SGLang, TGI: its OpenAI-compatible /v1/completions); an API key is read from "
                "ASSISTED_GENERATION_API_KEY",
            ),
        ),
        "speculative_endpoint": (
            "assistance",
            dict(
                default=None,
                metavar="URL",
                help="--engine served: the base URL of the same model's speculative decoding (K and draft "
                "as that deployment serves them)",
            ),
        ),
        "draft_precision": (
            "models",
            dict(
                choices=(*precision.PRECISIONS, *precision.BLOCK_PRECISIONS),
                help="default: the pair's; q4k: the draft's weights as Q4_K blocks (with --draft_kernels "
                "invariant)",
            ),
        ),
        "draft_kernels": (
            "models",
            dict(
                choices=invariant.KERNELS,
                help="default: the pair's. Draft kernels: stock, or invariant (the harness's small-M "
                "kernels: chosen for speed, a draft's output is only a proposal)",
            ),
        ),
        "draft_vocab": (
            "models",
            dict(
                type=int,
                help="default: the pair's. The draft scores only the first N token ids plus the special "
                "tokens (a smaller output layer: faster drafts, same output; byte-level BPE ids are "
                "ordered by frequency); 0 = the whole vocabulary",
            ),
        ),
        "draft_device": (
            "models",
            dict(
                default="cpu",
                help="cpu, cuda[:N]",
            ),
        ),
        "num_assistant_tokens": (
            "assistance",
            dict(
                type=int,
                help="draft tokens K per step (default: the pair's)",
            ),
        ),
        "assistant_schedule": (
            "assistance",
            dict(
                choices=tuple(setup.SCHEDULES),
                help="default: the pair's. How K evolves: constant, heuristic (+2 on full accept, -1 "
                "otherwise), dynamic (draft stops early below a confidence threshold)",
            ),
        ),
        "assistant_confidence_threshold": (
            "assistance",
            dict(
                type=float,
                help="threshold for the dynamic schedule (default "
                f"{DECODING.assistant_confidence_threshold})",
            ),
        ),
        "draft_tree": (
            "assistance",
            dict(
                metavar="PATHS",
                help="greedy assisted decoding with a static token tree instead of a chain of K: its nodes "
                "as rank paths joined by + (0+1+00+000: the draft's first and second choice, then its "
                "first choices under the first), verified in one target forward; the harness's own loop, "
                "on the batch-invariant kernels",
            ),
        ),
        "context_draft": (
            "assistance",
            dict(
                type=int,
                metavar="N",
                help="propose from the context (the prompt and the output so far) where it holds the "
                "continuation, up to N tokens a round, cut to the length expected to gain most per ms at "
                "this host's measured cost of a row, and from the draft model where no proposal beats a "
                "plain step; greedy, exact, the harness's own loop on the batch-invariant kernels (0: off; "
                "default: the pair's, for a greedy chain on those kernels)",
            ),
        ),
        "synthetic_acceptance": (
            "assistance",
            dict(
                type=float,
                metavar="P",
                help="synthetic acceptance: accept each proposed token with probability P (a seeded draw, "
                "not the target's verdict) to time a round at a chosen acceptance; the output is not the "
                "target's and is not compared (rows carry the setting); the harness's own loop, greedy, on "
                "the batch-invariant kernels",
            ),
        ),
        "prompt_lookup_num_tokens": (
            "assistance",
            dict(
                type=int,
                metavar="N",
                help="prompt-lookup decoding proposing N tokens (instead of a draft model)",
            ),
        ),
        "do_sample": (
            "sampling",
            dict(
                action="store_true",
                help="sample instead of greedy decoding",
            ),
        ),
        "temperature": (
            "sampling",
            dict(
                type=float,
                default=DECODING.temperature,
                help="sampling temperature",
            ),
        ),
        "top_p": (
            "sampling",
            dict(
                type=float,
                default=DECODING.top_p,
                help="nucleus sampling mass",
            ),
        ),
        "top_k": (
            "sampling",
            dict(
                type=int,
                default=DECODING.top_k,
                help="top-k sampling (0: off)",
            ),
        ),
        "seed": (
            "sampling",
            dict(
                type=int,
                default=DECODING.seed,
                help="random seed, set before every generate call",
            ),
        ),
        "max_new_tokens": (
            "run",
            dict(
                type=int,
                help="override every prompt's new-token budget (decode: 30 general / 200 code; "
                f"benchmark: --new_tokens; benchmark_code: {HUMANEVAL_NEW_TOKENS}; --prompts: "
                f"{PROMPTS_FILE_NEW_TOKENS}; sweep: {sweep.DEFAULT_NEW_TOKENS})",
            ),
        ),
        "min_new_tokens": (
            "run",
            dict(
                type=int,
                default=DECODING.min_new_tokens,
                help="decode at least this many tokens",
            ),
        ),
    }


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="assisted_generation.py",
        formatter_class=_Help,
        description="Decode prompts with or without an assistant (draft) model and print the seeds' table "
        "(--wide: its column names and unrounded numbers).",
    )
    g = p.add_argument_group("what to run")
    _add(
        g,
        "--model_name_or_path",
        metavar="FOLDER",
        help="a local Hugging Face folder as the target, instead of a registered pair (rows are named by "
        "the folder); its config is read before anything loads",
    )
    _add(
        g,
        "--assistant_model",
        metavar="FOLDER",
        help="with --model_name_or_path: the draft's local folder (without it the target drafts for "
        "itself: exact, accepts everything, and slow)",
    )
    _add(
        g,
        "--threads",
        type=int,
        help="CPU threads torch uses (default: torch's, one per core); recorded with every row",
    )
    _add(
        g,
        "--task",
        default="decode",
        choices=(*tasks.TASKS, "sweep"),
        help="prompt set to decode; 'sweep' measures the --sweep configurations on HumanEval prompts",
    )
    _add(
        g,
        "--sweep",
        metavar="SPEC",
        help="with --task sweep: configurations separated by ';', each key=value items separated by "
        "',' (t=target precision, d=draft precision, mode=assisted|prompt_lookup, k=K, "
        "sched=constant|dynamic|heuristic, kernels=stock|invariant), e.g. "
        "'t=fp32,d=fp32,k=5;t=w8af32,d=w8af32,k=3,sched=dynamic;t=fp32,mode=prompt_lookup,k=10'; "
        f"default: '{sweep_spec.DEFAULT_SPEC}'. Prints plain/assisted tok/s, speedup [95%% CI], acceptance, "
        "predicted speedup and more per configuration; writes "
        "<results_dir>/<platform>/sweep-<model>-<digest>.md and .png (--results_dir: default runs/) and "
        "its rows under <results_dir>/rows/sweep/",
    )
    _add(
        g,
        "--list-models",
        action="store_true",
        help="list the registered pairs, whether each one's weights are here, and exit",
    )
    _add(
        g,
        "--list-prompts",
        action="store_true",
        help="list the prompt sets --prompts takes (the task categories among them), each with its count, "
        "and exit",
    )
    _add(
        g,
        "--regen-tables",
        action="store_true",
        help="rebuild results/<platform>/<model>.md and plots from stored JSONL rows, then exit",
    )
    _add(
        g,
        "--results_dir",
        default=None,
        help="output folder: --task sweep writes its rows, table and plot there (default: runs/, or "
        "$ASSISTED_GENERATION_RUNS; never the committed results/); --regen-tables reads "
        "<dir>/rows/*.jsonl where that folder holds rows, else the committed results/rows/, and writes the "
        "published tables into <dir> (default: results/)",
    )
    _add(
        g,
        "--rows",
        nargs="*",
        default=None,
        help="JSONL row files for --regen-tables (default: results/rows/*.jsonl)",
    )
    _add(
        g,
        "--prompts",
        help="prompt sets by name, several joined by commas and taken in turn (general, code, mixed, or a "
        "task category: chat, translation, summarization, qa, math, rag, code_completion, code_editing; "
        "see --list-prompts), or your own prompts file: one JSON string per line, or plain text lines",
    )
    _add(
        g, "--limit", type=int, help=f"decode only the first N prompts (--task sweep: {sweep.DEFAULT_LIMIT})"
    )
    _add(
        g,
        "--concurrency",
        type=_int_list,
        metavar="N[,N]",
        help="a serving engine (--engine llama.cpp: a server with N slots; --engine served) under N "
        "concurrent streams, each level in each mode: aggregate and per-request tokens/s, written as rows "
        "and drawn (PNG beside --json, else under runs/)",
    )
    _add(
        g,
        "--context-tokens",
        dest="context_tokens",
        type=_int_list,
        metavar="N[,N]",
        help="the decode task or the sweep on long contexts: prompts of exactly N tokens, each the standard "
        "library's sources (a different module each) followed by a task on them (summarize, answer, edit), "
        f"--limit of them at each length (default {tasks.LONG_CONTEXT_PROMPTS})",
    )
    _add(
        g,
        "--prompt_lengths",
        type=_int_list,
        default=BENCHMARK_PROMPT_LENGTHS,
        help="benchmark prompt lengths in tokens, comma separated",
    )
    _add(
        g,
        "--new_tokens",
        type=_int_list,
        default=BENCHMARK_NEW_TOKENS,
        help="benchmark new-token counts, comma separated",
    )
    _add(g, "--ignore_eos", action="store_true", help="decode the whole budget even past EOS")

    a = p.add_argument_group("assistance")
    _add(a, "--assisted_generation", action="store_true", help="decode with the pair's draft model")
    _add(
        a,
        "--compare",
        action="store_true",
        help="run plain and assisted interleaved per prompt and print the speedup",
    )

    s = p.add_argument_group("sampling")

    m = p.add_argument_group("models, precisions, devices")
    _add(
        m,
        "--ort_block_size",
        type=int,
        default=None,
        help=f"int4 export: MatMulNBits quantization block size (16-256, default {ORT.block_size}), recorded "
        "with every row; ONNX Runtime targets only",
    )
    _add(
        m,
        "--ort_accuracy_level",
        type=int,
        default=None,
        help="int4 export: MatMulNBits accuracy level, the type activations are computed in "
        f"(1 fp32, 2 fp16, 3 bf16, 4 int8; default {ORT.accuracy_level}); ONNX Runtime targets only",
    )
    _add(m, "--weights_dir", help="folder holding model folders (also ASSISTED_GENERATION_WEIGHTS)")
    _add(
        m,
        "--verify",
        action="store_true",
        help="check every cached file (converted weights, ONNX export) by content before use and "
        "rebuild what changed; without it sizes are checked always and contents when a file was "
        "modified since it was written",
    )
    _add(
        m,
        "--fast_attention",
        action="store_true",
        help="accepted for compatibility with the seeds; not supported here (ignored with a note)",
    )

    o = p.add_argument_group("output")
    _add(o, "--platform", help="platform name for rows and baselines (default: detected)")
    _add(o, "--json", metavar="PATH", help="append one JSON row per finished prompt and mode (resumable)")
    _add(o, "--no_progress", action="store_true", help="hide the progress bar")
    _add(
        o,
        "--wide",
        action="store_true",
        help="tables with the seeds' column names and unrounded numbers (default: short names and "
        "rounded numbers, to fit 120 columns)",
    )
    _add(
        o,
        "--llama-bench",
        default=None,
        help="--task sweep: llama.cpp's llama-bench binary, to time its plain decoding of the same GGUF "
        f"in the same run as a reference row (or set {llamacpp.ENV}; absent: the suite's own build of "
        "llama.cpp, made once on first use)",
    )
    _add(
        o,
        "--llama-server",
        default=None,
        metavar="PATH",
        help="--engine llama.cpp: the llama-server binary to run (or set ASSISTED_GENERATION_LLAMA_SERVER; "
        "absent: llama.cpp built from source once, on first use, and cached)",
    )
    groups = {"run": g, "assistance": a, "sampling": s, "models": m}
    options = setting_flags()
    for f in setup.FIELDS:
        if f.flag is not None:
            group, kw = options.get(f.column) or _generic(f)
            _add(groups[group], f.flag, **kw)
    return p


def _generic(f: setup.Field) -> tuple[str, dict[str, Any]]:
    """The flag of a setting ``setting_flags`` has no entry for: typed by its default, in the group
    of its side (a new setting works from its ``FIELDS`` entry alone; an entry here adds its help)."""
    group = {"target": "models", "draft": "assistance", "sampling": "sampling"}.get(f.side, "run")
    if isinstance(f.default, bool):
        return group, dict(action="store_true", help=f"the run setting {f.column}")
    kind = type(f.default) if f.default is not None else str
    return group, dict(type=kind, help=f"the run setting {f.column} (default {f.default})")
