"""Prompts for each task: written here or cut from texts that ship with Python, so runs need no network.

Everything is deterministic: the same arguments give the same prompts (and, for benchmark prompts, the
same token ids for a given tokenizer), so rows from different runs and machines are comparable.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

# Signature + docstring to complete, 60-160 tokens each, like the seeds' CodeLlama decode prompts.
_CODE: tuple[tuple[str, str], ...] = (
    (
        "merge_intervals",
        '''\
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals.

    The input may be unsorted. Intervals that touch, such as (1, 3) and (3, 5), are merged.
    Return the merged intervals sorted by their start.

    >>> merge_intervals([(5, 8), (1, 3), (2, 4)])
    [(1, 4), (5, 8)]
    """
''',
    ),
    (
        "parse_duration",
        '''\
def parse_duration(text: str) -> int:
    """Convert a duration such as "1h30m", "45s" or "2d4h" to a number of seconds.

    Units are d (days), h (hours), m (minutes) and s (seconds); each may appear at most once,
    in that order. Raise ValueError for anything else.

    >>> parse_duration("1h30m")
    5400
    """
''',
    ),
    (
        "rolling_mean",
        '''\
from collections.abc import Iterable, Iterator


def rolling_mean(values: Iterable[float], window: int) -> Iterator[float]:
    """Yield the mean of each full window of `window` consecutive values.

    Keep a running sum so each step costs O(1), and never hold more than `window` values.

    >>> list(rolling_mean([1, 2, 3, 4], 2))
    [1.5, 2.5, 3.5]
    """
''',
    ),
    (
        "slugify",
        '''\
import re
import unicodedata


def slugify(title: str, max_length: int = 50) -> str:
    """Turn a title into a lowercase URL slug.

    Strip accents, replace runs of non-alphanumeric characters with a single hyphen, trim
    hyphens from both ends and cut at a hyphen so the slug is at most `max_length` long.

    >>> slugify("Héllo, World!  2024")
    'hello-world-2024'
    """
''',
    ),
    (
        "topological_sort",
        '''\
def topological_sort(deps: dict[str, set[str]]) -> list[str]:
    """Order tasks so that every task comes after the tasks it depends on.

    `deps` maps a task to the set of tasks it needs. Tasks that only appear as dependencies
    are included too. Ties are broken alphabetically so the result is deterministic.
    Raise ValueError naming one task on a cycle if there is no valid order.
    """
''',
    ),
    (
        "chunked",
        '''\
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Split an iterable into lists of `size` items; the last list may be shorter.

    >>> list(chunked(range(7), 3))
    [[0, 1, 2], [3, 4, 5], [6]]
    """
''',
    ),
    (
        "levenshtein",
        '''\
def levenshtein(a: str, b: str) -> int:
    """Return the edit distance between two strings.

    Insertions, deletions and substitutions each cost 1. Use two rows of the dynamic
    programming table so memory is O(min(len(a), len(b))).

    >>> levenshtein("kitten", "sitting")
    3
    """
''',
    ),
    (
        "column_stats",
        '''\
import csv
import statistics
from pathlib import Path


def column_stats(path: Path, column: str) -> dict[str, float]:
    """Read a CSV file with a header row and summarise one numeric column.

    Return a dict with keys "count", "mean", "median", "min" and "max". Skip empty cells;
    raise KeyError if the column does not exist and ValueError if a cell is not a number.
    """
''',
    ),
    (
        "roman_to_int",
        '''\
def roman_to_int(numeral: str) -> int:
    """Convert a Roman numeral such as "MCMXCIV" to an integer.

    Accept upper or lower case. A smaller symbol before a larger one is subtracted.

    >>> roman_to_int("MCMXCIV")
    1994
    """
''',
    ),
    (
        "flatten_dict",
        '''\
from typing import Any


def flatten_dict(data: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """Flatten nested dictionaries into one level with joined keys.

    Lists are left as values. An empty nested dict becomes an empty dict value.

    >>> flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": 3})
    {'a.b': 1, 'a.c.d': 2, 'e': 3}
    """
''',
    ),
    (
        "bisect_left",
        '''\
from collections.abc import Sequence


def bisect_left(items: Sequence[int], target: int) -> int:
    """Return the first index at which `target` could be inserted keeping `items` sorted.

    `items` is sorted ascending and may contain duplicates; the index returned is before any
    existing entries equal to `target`. Do not use the bisect module.
    """
''',
    ),
    (
        "top_words",
        '''\
import re
from collections import Counter


def top_words(text: str, k: int = 10, stopwords: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """Return the `k` most frequent words in `text` with their counts.

    Words are runs of letters and apostrophes, compared case-insensitively. Words in
    `stopwords` are ignored. Ties are ordered alphabetically.
    """
''',
    ),
)


PROMPT_SETS = ("general", "code", "mixed")


def decode_prompts(kind: str) -> list[Prompt]:
    """The decode task's prompts: "general" (ten short questions), "code" (a dozen completions) or
    "mixed" (the two alternating, the longer list's tail last)."""
    if kind == "general":
        return [Prompt(f"general-{name}", text, GENERAL_NEW_TOKENS) for name, text in _GENERAL]
    if kind == "code":
        return [Prompt(f"code-{name}", text, CODE_NEW_TOKENS) for name, text in _CODE]
    if kind == "mixed":
        general, code = decode_prompts("general"), decode_prompts("code")
        n = min(len(general), len(code))
        return [p for both in zip(general[:n], code[:n], strict=True) for p in both] + general[n:] + code[n:]
    raise HarnessError(f"unknown prompt set {kind!r}; use {', '.join(PROMPT_SETS)}, or a prompts file")


def prompts_of(choice: str, max_new_tokens: int) -> list[Prompt]:
    """``--prompts``: a prompt set by name (``PROMPT_SETS``), else a prompts file (``load_prompts_file``)."""
    if choice in PROMPT_SETS:
        return decode_prompts(choice)
    return load_prompts_file(choice, max_new_tokens)


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
