"""Prompts for each task: written here or cut from texts that ship with Python, so runs need no network.

Everything is deterministic: the same arguments give the same prompts (and, for benchmark prompts, the
same token ids for a given tokenizer), so rows from different runs and machines are comparable.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.base import categories
from harness.base.errors import HarnessError

TASKS: tuple[str, ...] = ("decode", "benchmark", "benchmark_code")

# New-token budgets the seeds used: 30 for the llama-2 chat questions, 200 for the CodeLlama completions.
GENERAL_NEW_TOKENS = 30
CODE_NEW_TOKENS = 200


@dataclass(frozen=True)
class Prompt:
    label: str
    text: str
    max_new_tokens: int
    # Set when the exact prompt length matters (benchmark prompts): generate from these, not from text,
    # because re-encoding decoded text can merge or split tokens at the cut edges.
    input_ids: tuple[int, ...] | None = None


class IntListError(HarnessError, argparse.ArgumentTypeError):
    """Also an ArgumentTypeError so argparse prints the message as a usage error when used as ``type=``."""


# Short questions, 5-10 tokens each with common tokenizers, like the seeds' llama-2 decode prompts.
_GENERAL: tuple[tuple[str, str], ...] = (
    ("capital", "What is the capital of France?"),
    ("sky", "Why is the sky blue?"),
    ("vaccines", "How do vaccines train the immune system?"),
    ("copper", "Name three common uses of copper."),
    ("austen", "Who wrote Pride and Prejudice?"),
    ("tides", "What causes ocean tides?"),
    ("recursion", "Explain recursion in one sentence."),
    ("moon", "How far away is the Moon?"),
    ("prime", "What is a prime number?"),
    ("rainbow", "Describe how a rainbow forms."),
)

# The decode task's own sets, then the categories (``harness.base.categories``).
PROMPT_SETS = ("general", "code", "mixed", *(c.name for c in categories.CATEGORIES))


def decode_prompts(kind: str) -> list[Prompt]:
    """The decode task's prompts: "general" (ten short questions), "code" (a dozen completions),
    "mixed" (the two alternating, the longer list's tail last), or a category's (labelled
    ``category-name``, each at the budget its kind of answer takes)."""
    if kind == "general":
        return [Prompt(f"general-{name}", text, GENERAL_NEW_TOKENS) for name, text in _GENERAL]
    if kind == "code":
        return [Prompt(f"code-{name}", text, CODE_NEW_TOKENS) for name, text in categories.CODE_COMPLETION]
    if kind == "mixed":
        general, code = decode_prompts("general"), decode_prompts("code")
        n = min(len(general), len(code))
        return [p for both in zip(general[:n], code[:n], strict=True) for p in both] + general[n:] + code[n:]
    for category in categories.CATEGORIES:
        if category.name == kind:
            return [Prompt(f"{kind}-{name}", text, category.new_tokens) for name, text in category.prompts]
    raise HarnessError(
        f"unknown prompt set {kind!r}; use one of {', '.join(PROMPT_SETS)} (--list-prompts describes "
        "them), several joined by commas, or a prompts file"
    )


def prompts_of(choice: str, max_new_tokens: int) -> list[Prompt]:
    """``--prompts``: prompt sets by name (``PROMPT_SETS``; several joined by commas are taken in
    turn, one prompt of each), else a prompts file (``load_prompts_file``)."""
    names = [n.strip() for n in choice.split(",") if n.strip()]
    if names and all(n in PROMPT_SETS for n in names):
        # Taken in turn, one of each set, so --limit N spans the sets named.
        sets = [decode_prompts(n) for n in names]
        return [p for row in itertools.zip_longest(*sets) for p in row if p is not None]
    unknown = [n for n in names if n not in PROMPT_SETS]
    if len(names) > 1 or not Path(choice).suffix and not Path(choice).exists():
        # Not a file's name: a set misspelled is said as one, not as a missing file.
        decode_prompts(unknown[0] if unknown else choice)
    return load_prompts_file(choice, max_new_tokens)


def list_prompt_sets() -> list[tuple[str, int, str]]:
    """(name, prompts, what it holds) of every prompt set, for ``--list-prompts``."""
    out = [
        ("general", len(_GENERAL), "short questions, 5-10 tokens (the seeds' chat decode prompts)"),
        (
            "code",
            len(categories.CODE_COMPLETION),
            "the same as code_completion (the seeds' code decode prompts)",
        ),
        ("mixed", len(_GENERAL) + len(categories.CODE_COMPLETION), "general and code, alternating"),
    ]
    return out + [(c.name, len(c.prompts), c.what) for c in categories.CATEGORIES]


def _positive_int(value: Any, what: str) -> int:
    # bool is an int subclass; True as a length is a bug in the caller, not a length of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HarnessError(f"{what} must be a positive integer, got {value!r}; pass e.g. 256")
    return value


def _benchmark_text() -> str:
    # pydoc_data ships with every CPython, so the benchmark text is real English prose and code that
    # is present offline and identical on every machine running the same Python minor version.
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def _leading_tokens(tokenizer: Any, text: str, needed: int) -> list[int]:
    """Token ids of the start of ``text``, at least ``needed`` of them unless the whole text is shorter.

    Tokenizing all ~470k characters costs seconds with a byte-level tokenizer, so tokenize a growing
    prefix instead. Tokens near the cut can differ from a full tokenization, so keep a margin of tokens
    past ``needed``; the ids returned for the first ``needed`` positions then do not depend on the cut.
    """
    margin = 64
    limit = 16 * (needed + margin)
    while True:
        ids = list(tokenizer(text[:limit], add_special_tokens=False, verbose=False)["input_ids"])
        if limit >= len(text):
            return ids
        if len(ids) >= needed + margin:
            return ids[: len(ids) - margin]
        limit *= 4


# Long contexts are assembled from this Python's own standard library sources (every machine has
# them; rows record the Python version and each prompt's digest): modules that are single files on
# every supported Python, taken from the prompt's own module on, followed by one of three tasks a
# user asks of a long document.
LONG_CONTEXT_SOURCES = (
    "difflib", "argparse", "statistics", "textwrap", "shlex", "heapq",
    "fractions", "calendar", "configparser", "tarfile", "gettext", "pprint",
)  # fmt: skip
LONG_CONTEXT_TASKS = (
    ("summarize", "Summarize what the code above does in three sentences.\nSummary:"),
    ("question", "Question: Which classes and functions does the code above define first, and what does the "
     "first of them do?\nAnswer:"),
    ("edit", "Rewrite the first function defined above with type hints and return the whole function.\n"
     "Answer:\n"),
)  # fmt: skip
LONG_CONTEXT_NEW_TOKENS = 64
LONG_CONTEXT_PROMPTS = 3  # at each length, unless --limit says otherwise


def _stdlib_source(name: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        raise HarnessError(f"the standard library's {name}.py is not here to build a long context from")
    return Path(origin).read_text(encoding="utf-8")


def long_context_prompts(tokenizer: Any, context_tokens: int, count: int, new_tokens: int) -> list[Prompt]:
    """``count`` prompts of exactly ``context_tokens`` tokens (``--context-tokens``): the standard
    library's sources from a different module each, then a task on them (``LONG_CONTEXT_TASKS``,
    in turn), as token ids, so the length holds whatever the tokenizer makes of the cut."""
    _positive_int(context_tokens, "context length")
    out = []
    for i in range(count):
        first = i % len(LONG_CONTEXT_SOURCES)
        order = LONG_CONTEXT_SOURCES[first:] + LONG_CONTEXT_SOURCES[:first]
        task, instruction = LONG_CONTEXT_TASKS[i % len(LONG_CONTEXT_TASKS)]
        tail = list(tokenizer("\n\n" + instruction, add_special_tokens=False)["input_ids"])
        needed = context_tokens - len(tail)
        if needed < 16:
            raise HarnessError(
                f"--context-tokens {context_tokens} leaves no room for a document before the task's "
                f"{len(tail)} tokens: give at least {len(tail) + 16}"
            )
        corpus = ""
        for name in order:  # as many modules as the length needs
            corpus += _stdlib_source(name) + "\n\n"
            if len(corpus) > 8 * needed:
                break
        head = _leading_tokens(tokenizer, corpus, needed)
        if len(head) < needed:
            raise HarnessError(
                f"--context-tokens {context_tokens}: the standard library sources give only "
                f"{len(head)} tokens"
            )
        ids = [*head[:needed], *tail]
        text = tokenizer.decode(ids)
        out.append(Prompt(f"ctx{context_tokens}-{order[0]}-{task}", text, new_tokens, tuple(ids)))
    return out


def benchmark_prompts(
    tokenizer: Any,
    lengths: tuple[int, ...] = (256, 512, 1024, 2048),
    new_tokens: tuple[int, ...] = (64, 128, 256),
) -> list[Prompt]:
    """One prompt of exactly ``length`` tokens per (length, new_tokens) pair, cut from Python's docs.

    Every prompt starts at the beginning of the text, so prompts of one length are the same tokens
    whatever the new-token budget, and a prompt does not change when other lengths are added to a run.
    Special tokens the tokenizer adds (a BOS) count towards the length, as they would for the model.
    """
    lengths = tuple(_positive_int(n, "prompt length") for n in lengths)
    new_tokens = tuple(_positive_int(n, "new token count") for n in new_tokens)
    if not lengths or not new_tokens:
        raise HarnessError("benchmark_prompts needs at least one prompt length and one new-token count")
    try:
        body = _leading_tokens(tokenizer, _benchmark_text(), max(lengths))
        # Tokenizing the empty string with specials shows exactly what the tokenizer wraps text with.
        prefix = list(tokenizer("", add_special_tokens=True)["input_ids"])
    except Exception as exc:  # any tokenizer failure means the caller passed a bad one
        raise HarnessError(
            f"could not tokenize the benchmark text with {type(tokenizer).__name__} ({exc}); "
            "pass a Hugging Face tokenizer (callable, returning a dict with 'input_ids')"
        ) from exc
    available = len(prefix) + len(body)
    prompts: list[Prompt] = []
    for length in lengths:
        if length > available or length <= len(prefix):
            raise HarnessError(
                f"prompt length {length} is outside what the benchmark text gives with this tokenizer "
                f"({len(prefix) + 1}..{available} tokens); choose a smaller --prompt_lengths value"
            )
        ids = tuple(prefix + body[: length - len(prefix)])
        text = tokenizer.decode(list(ids), skip_special_tokens=True)
        for budget in new_tokens:
            prompts.append(Prompt(f"bench-{length}-{budget}", text, budget, ids))
    return prompts


# Bounds on a prompts file, far past what any registered model's context holds (32K tokens, a few
# characters each), so a real file never meets them.
MAX_PROMPTS_FILE_BYTES = 64 << 20
MAX_PROMPT_CHARS = 1_000_000


def load_prompts_file(path: str | os.PathLike[str], max_new_tokens: int) -> list[Prompt]:
    """Prompts from a file: one JSON string or object (``{"prompt": ...}``) per line (for prompts with
    newlines), or plain text lines.

    The format is decided per file: if every non-empty line parses as JSON the file is JSON lines and
    each must be a string or an object with a prompt; a line that opens like a JSON object and does
    not parse is refused by its number; otherwise each non-empty line is one prompt, taken verbatim.
    """
    max_new_tokens = _positive_int(max_new_tokens, "max_new_tokens")
    path = Path(path)
    how = "write one prompt per line, or one JSON string per line for prompts that contain newlines"
    try:
        # Read with a bound: a device or pipe that never ends (/dev/zero) is refused, not read to
        # memory's end. utf-8-sig: a byte-order mark (Windows editors write one) is not a prompt's.
        with path.open("rb") as fh:
            raw = fh.read(MAX_PROMPTS_FILE_BYTES + 1)
        if len(raw) > MAX_PROMPTS_FILE_BYTES:
            raise HarnessError(
                f"prompts file {path} holds more than {MAX_PROMPTS_FILE_BYTES >> 20} MiB (or never ends); "
                f"pass a text file of prompts ({how})"
            )
        content = raw.decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise HarnessError(f"prompts file {path} does not exist; create it ({how})") from exc
    except IsADirectoryError as exc:
        raise HarnessError(f"prompts file {path} is a directory; pass a text file ({how})") from exc
    except UnicodeDecodeError as exc:
        raise HarnessError(f"prompts file {path} is not UTF-8 text ({exc}); save it as UTF-8") from exc
    except OSError as exc:
        raise HarnessError(f"cannot read prompts file {path} ({exc}); check its permissions") from exc

    lines = [(number, line) for number, line in enumerate(content.splitlines(), 1) if line.strip()]
    if not lines:
        raise HarnessError(f"prompts file {path} has no prompts; {how}")
    too_long = [number for number, line in lines if len(line) > MAX_PROMPT_CHARS]
    if too_long:
        # Refused here, before a tokenizer spends minutes on text no model's context holds.
        raise HarnessError(
            f"{path}: line(s) {', '.join(map(str, too_long[:5]))} hold more than {MAX_PROMPT_CHARS:,} "
            f"characters, past any registered model's context; {how}"
        )

    parsed: list[tuple[int, Any]] = []
    broken: list[int] = []
    for number, line in lines:
        try:
            parsed.append((number, json.loads(line)))
        except json.JSONDecodeError:
            broken.append(number)
    # A line that opens like a JSON object is one, whatever the other lines are: decoded as text it
    # would send its braces, key and quotes to the model as the prompt.
    objects = [n for n, line in lines if line.lstrip().lstrip("\ufeff").startswith("{")]
    broken_objects = [n for n in broken if n in objects]
    if broken_objects:
        raise HarnessError(
            f"{path}: line(s) {', '.join(map(str, broken_objects[:5]))} open a JSON object but are not valid "
            'JSON; fix them (each line one object such as {"prompt": "def f(x):"}) or write plain text lines'
        )
    quoted = [n for n, line in lines if line.lstrip().startswith('"')]
    if broken and len(quoted) + len(objects) > len(lines) // 2:
        # Mostly JSON strings with a few lines that fail to parse: a broken JSON file, not plain text
        # (read as text, every prompt would be the literal JSON, quotes and escapes included).
        raise HarnessError(
            f"{path}: lines {', '.join(map(str, broken[:5]))} are not valid JSON while most lines are JSON "
            "strings; fix those lines (or write the whole file as plain text lines)"
        )
    if broken:
        if objects:
            raise HarnessError(
                f"{path}: line(s) {', '.join(map(str, objects[:5]))} are JSON objects while line(s) "
                f"{', '.join(map(str, broken[:5]))} are not JSON; write every line as JSON or none"
            )
        # One line that is not JSON makes this a plain-text file.
        return [Prompt(f"{path.name}:{n}", text, max_new_tokens) for n, text in lines]

    prompts = []
    for number, value in parsed:
        if isinstance(value, dict):
            value = _prompt_of(value, f"{path}:{number}")
        if not isinstance(value, str):
            raise HarnessError(
                f"{path}:{number}: every line of this file is JSON, but this one is a "
                f"{type(value).__name__}, not a string; write each prompt as a JSON string "
                '(e.g. "def f():\\n"), an object with a "prompt" key, or use plain text lines'
            )
        if not value.strip():
            raise HarnessError(f"{path}:{number}: the prompt is empty; remove the line or give it text")
        prompts.append(Prompt(f"{path.name}:{number}", value, max_new_tokens))
    return prompts


PROMPT_KEYS = ("prompt", "text")  # what a JSON-object line names its prompt (HumanEval's and datasets')


def _prompt_of(obj: dict[str, Any], where: str) -> Any:
    found = [k for k in PROMPT_KEYS if k in obj]
    if not found:
        raise HarnessError(
            f"{where}: a JSON object without a prompt; give it a {' or '.join(repr(k) for k in PROMPT_KEYS)} "
            f"key (it has {', '.join(map(repr, list(obj)[:5])) or 'no keys'})"
        )
    return obj[found[0]]


def parse_int_list(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of positive integers, e.g. ``--prompt_lengths 256,512``."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise IntListError(f"expected comma-separated positive integers such as 256,512, got {text!r}")
    values = []
    for item in items:
        if not item:
            raise IntListError(f"empty item in {text!r}; write positive integers separated by commas")
        try:
            value = int(item)
        except ValueError:
            raise IntListError(f"{item!r} in {text!r} is not an integer; write e.g. 256,512") from None
        if value <= 0:
            raise IntListError(f"{value} in {text!r} must be positive; write e.g. 256,512")
        values.append(value)
    return tuple(values)
