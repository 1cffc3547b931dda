"""Prompts: deterministic, offline, exact lengths, clear errors for bad input."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from harness.base import tasks
from harness.base.errors import HarnessError
from harness.base.tasks import (
    TASKS,
    Prompt,
    benchmark_prompts,
    decode_prompts,
    load_prompts_file,
    parse_int_list,
)


def _byte_tokenizer(bos: bool = False) -> PreTrainedTokenizerFast:
    """A real HF fast tokenizer built offline: byte-level BPE with no merges, so one token per byte."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<s>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
        )
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def byte_tok() -> PreTrainedTokenizerFast:
    return _byte_tokenizer()


def test_tasks_constant() -> None:
    assert TASKS == ("decode", "benchmark", "benchmark_code")


def test_general_decode_prompts() -> None:
    prompts = decode_prompts("general")
    assert len(prompts) == 10
    assert all(p.max_new_tokens == 30 and p.input_ids is None for p in prompts)
    assert len({p.label for p in prompts}) == 10 and len({p.text for p in prompts}) == 10
    # Short questions: a handful of words each, as in the seeds' llama-2 runs.
    assert all(3 <= len(p.text.split()) <= 8 and p.text.endswith(("?", ".")) for p in prompts)


def test_code_decode_prompts_are_python_to_complete() -> None:
    prompts = decode_prompts("code")
    assert len(prompts) == 12
    assert all(p.max_new_tokens == 200 for p in prompts)
    assert len({p.label for p in prompts}) == 12
    for p in prompts:
        compile(p.text + "    pass\n", p.label, "exec")  # a valid signature + docstring, body to come
        assert "def " in p.text and p.text.rstrip().endswith('"""')
        # 60-160 tokens with code tokenizers is roughly 200-650 characters.
        assert 200 <= len(p.text) <= 650, (p.label, len(p.text))


def test_decode_prompts_are_deterministic_and_reject_unknown_kind() -> None:
    assert decode_prompts("code") == decode_prompts("code")
    with pytest.raises(HarnessError, match="unknown prompt set 'poetry'; use one of general, code, mixed"):
        decode_prompts("poetry")


def test_benchmark_prompts_exact_lengths(byte_tok: PreTrainedTokenizerFast) -> None:
    prompts = benchmark_prompts(byte_tok, lengths=(256, 512, 1024, 2048), new_tokens=(64, 128, 256))
    assert [(len(p.input_ids), p.max_new_tokens) for p in prompts] == [
        (n, k) for n in (256, 512, 1024, 2048) for k in (64, 128, 256)
    ]
    assert len({p.label for p in prompts}) == len(prompts)
    for p in prompts:
        # Byte-level: the text is exactly the bytes the ids stand for.
        assert len(p.text.encode("utf-8")) == len(p.input_ids)
        assert list(byte_tok(p.text, add_special_tokens=False)["input_ids"]) == list(p.input_ids)
    assert prompts[0].text.startswith('The "assert" statement')
    assert benchmark_prompts(byte_tok, lengths=(300,), new_tokens=(8,)) == benchmark_prompts(
        byte_tok, lengths=(300,), new_tokens=(8,)
    )


def test_benchmark_prompt_does_not_depend_on_other_lengths(byte_tok: PreTrainedTokenizerFast) -> None:
    alone = benchmark_prompts(byte_tok, lengths=(256,), new_tokens=(64,))[0]
    with_long = benchmark_prompts(byte_tok, lengths=(256, 4096), new_tokens=(64,))[0]
    assert alone == with_long


def test_benchmark_prompts_count_bos_towards_length() -> None:
    tok = _byte_tokenizer(bos=True)
    (prompt,) = benchmark_prompts(tok, lengths=(100,), new_tokens=(10,))
    assert len(prompt.input_ids) == 100
    assert prompt.input_ids[0] == tok.bos_token_id
    assert "<s>" not in prompt.text and len(prompt.text) == 99


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "256"])
def test_benchmark_prompts_reject_bad_length(byte_tok: PreTrainedTokenizerFast, bad: object) -> None:
    with pytest.raises(HarnessError, match="positive integer"):
        benchmark_prompts(byte_tok, lengths=(bad,), new_tokens=(8,))  # type: ignore[arg-type]
    with pytest.raises(HarnessError, match="positive integer"):
        benchmark_prompts(byte_tok, lengths=(8,), new_tokens=(bad,))  # type: ignore[arg-type]


def test_benchmark_prompts_reject_length_beyond_text(byte_tok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(HarnessError, match="smaller --prompt_lengths"):
        benchmark_prompts(byte_tok, lengths=(10_000_000,), new_tokens=(8,))


def test_benchmark_prompts_reject_non_tokenizer() -> None:
    with pytest.raises(HarnessError, match="Hugging Face tokenizer"):
        benchmark_prompts(object(), lengths=(8,), new_tokens=(8,))


def test_prompts_file_json_lines(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps("def f(x):\n    ") + "\n\n" + json.dumps("Hello, world") + "\n")
    prompts = load_prompts_file(path, 40)
    assert prompts == [Prompt("p.jsonl:1", "def f(x):\n    ", 40), Prompt("p.jsonl:3", "Hello, world", 40)]


def test_prompts_file_plain_lines(tmp_path) -> None:
    path = tmp_path / "p.txt"
    # The second line happens to be valid JSON; one non-JSON line makes the whole file plain text.
    path.write_text('What is 2+2?\n"quoted"\n\n  indented prompt\n')
    prompts = load_prompts_file(path, 16)
    assert [p.text for p in prompts] == ["What is 2+2?", '"quoted"', "  indented prompt"]
    assert [p.label for p in prompts] == ["p.txt:1", "p.txt:2", "p.txt:4"]


def test_prompts_file_json_non_string_names_line(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('"fine"\n[1, 2]\n')
    with pytest.raises(HarnessError, match=r"p\.jsonl:2: .*list, not a string"):
        load_prompts_file(path, 16)
    path.write_text('"fine"\n{"id": 3}\n')
    with pytest.raises(HarnessError, match=r"p\.jsonl:2: a JSON object without a prompt"):
        load_prompts_file(path, 16)


def test_prompts_file_json_objects_give_their_prompt(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f(x):\\n", "id": 1}\n{"text": "second"}\n')
    assert [p.text for p in load_prompts_file(path, 16)] == ["def f(x):\n", "second"]


@pytest.mark.parametrize(
    "content",
    [
        '{"prompt": "def f(x):"\n',  # an object that never closes: not a text prompt
        '\ufeff{"prompt": "a"}\n{"prompt": "b"\n',  # a byte-order mark, then a broken object
        'plain words\n{"prompt": "x"}\n',  # objects mixed with text lines
    ],
    ids=["unclosed", "bom-then-broken", "mixed"],
)
def test_prompts_file_lines_that_look_like_json_objects_are_json_or_refused(tmp_path, content) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(HarnessError, match=r"p\.jsonl: line\(s\) [12]"):
        load_prompts_file(path, 16)


def test_prompts_file_empty_json_string(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('"fine"\n"  "\n')
    with pytest.raises(HarnessError, match=r"p\.jsonl:2: the prompt is empty"):
        load_prompts_file(path, 16)


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_prompts_file_empty(tmp_path, content: str) -> None:
    path = tmp_path / "p.txt"
    path.write_text(content)
    with pytest.raises(HarnessError, match="no prompts; write one prompt per line"):
        load_prompts_file(path, 16)


def test_prompts_file_missing_or_bad(tmp_path) -> None:
    with pytest.raises(HarnessError, match="does not exist; create it"):
        load_prompts_file(tmp_path / "nope.txt", 16)
    with pytest.raises(HarnessError, match="is a directory"):
        load_prompts_file(tmp_path, 16)
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(HarnessError, match="not UTF-8"):
        load_prompts_file(binary, 16)
    ok = tmp_path / "ok.txt"
    ok.write_text("hi\n")
    with pytest.raises(HarnessError, match="max_new_tokens"):
        load_prompts_file(ok, 0)


def test_parse_int_list() -> None:
    assert parse_int_list("256,512") == (256, 512)
    assert parse_int_list(" 64 , 128,256 ") == (64, 128, 256)
    assert parse_int_list("7") == (7,)
    for bad, fragment in [
        ("", "comma-separated"),
        ("256,,512", "empty item"),
        ("256,abc", "'abc'"),
        ("1.5", "not an integer"),
        ("0,4", "must be positive"),
        ("-3", "must be positive"),
    ]:
        with pytest.raises(HarnessError, match=fragment):
            parse_int_list(bad)


def test_parse_int_list_as_argparse_type(capsys) -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--prompt_lengths", type=parse_int_list)
    assert parser.parse_args(["--prompt_lengths", "256,1024"]).prompt_lengths == (256, 1024)
    with pytest.raises(SystemExit):
        parser.parse_args(["--prompt_lengths", "256,x"])
    # argparse shows our message, not a generic "invalid value".
    assert "'x' in '256,x' is not an integer" in capsys.readouterr().err


def test_prompts_file_with_a_broken_json_line_is_an_error_not_text(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('"def f():\\n"\n"def g(x):\\n"\n"def h(: broken\n')
    with pytest.raises(HarnessError, match="lines 3 are not valid JSON"):
        load_prompts_file(path, 16)


def test_prompts_file_byte_order_mark_is_not_part_of_the_prompt(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes('\ufeff"def f():\\n"\n"def g():\\n"\n'.encode())
    prompts = load_prompts_file(path, 16)
    assert [p.text for p in prompts] == ["def f():\n", "def g():\n"]
    plain = tmp_path / "p.txt"
    plain.write_bytes("\ufeffwrite a sort\n".encode())
    assert load_prompts_file(plain, 16)[0].text == "write a sort"


def test_a_prompts_source_that_never_ends_is_refused_at_once() -> None:
    with pytest.raises(HarnessError, match=r"/dev/zero holds more than 64 MiB \(or never ends\)"):
        load_prompts_file("/dev/zero", 16)


def test_a_line_past_any_context_is_refused_before_tokenizing(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("short one\n" + "x" * (tasks.MAX_PROMPT_CHARS + 1) + "\n")
    with pytest.raises(HarnessError, match=r"line\(s\) 2 hold more than 1,000,000 characters"):
        load_prompts_file(path, 16)


def test_every_category_holds_at_least_twelve_distinct_prompts_of_its_own() -> None:
    from harness.base import categories

    assert len(categories.CATEGORIES) >= 8
    seen: set[str] = set()
    for category in categories.CATEGORIES:
        prompts = tasks.decode_prompts(category.name)
        assert len(prompts) >= 12, category.name
        assert all(
            p.label.startswith(f"{category.name}-") and p.max_new_tokens == category.new_tokens
            for p in prompts
        )
        texts = {p.text for p in prompts}
        assert len(texts) == len(prompts) and not texts & seen  # no prompt twice, in or across sets
        seen |= texts
    # The answers that copy their prompt: an edit returns the function it was given.
    edit = tasks.decode_prompts("code_editing")[0]
    assert "def average(lst):" in edit.text and "return the whole function" in edit.text


def test_several_sets_are_taken_in_turn_so_a_limit_spans_them() -> None:
    prompts = tasks.prompts_of("summarization,rag,math", 10)
    assert [p.label.split("-")[0] for p in prompts[:6]] == ["summarization", "rag", "math"] * 2
    assert len(prompts) == 36
    with pytest.raises(HarnessError, match="unknown prompt set 'poems'.*--list-prompts"):
        tasks.prompts_of("summarization,poems", 10)
    with pytest.raises(HarnessError, match="unknown prompt set 'summarisation'"):
        tasks.prompts_of("summarisation", 10)


def test_list_prompts_names_every_set_with_its_count(capsys) -> None:
    from harness import cli

    assert cli.main(["--list-prompts"]) == 0
    out = capsys.readouterr().out
    for name, count, _ in tasks.list_prompt_sets():
        assert re.search(rf"^\| {name} +\| +{count} \|", out, flags=re.MULTILINE), name
    assert sum(1 for name, count, _ in tasks.list_prompt_sets() if count >= 12) >= 9


def test_long_context_prompts_have_exactly_the_length_asked(byte_tok: PreTrainedTokenizerFast) -> None:
    prompts = tasks.long_context_prompts(byte_tok, 1500, 4, 32)
    assert [len(p.input_ids) for p in prompts] == [1500] * 4 and all(p.max_new_tokens == 32 for p in prompts)
    # A different module each, the tasks in turn, each ending on its task.
    modules = ["difflib", "argparse", "statistics", "textwrap"]
    kinds = ["summarize", "question", "edit", "summarize"]
    assert [p.label for p in prompts] == [f"ctx1500-{m}-{k}" for m, k in zip(modules, kinds, strict=True)]
    assert prompts[0].text.rstrip().endswith("Summary:") and len({p.text for p in prompts}) == 4
    assert tasks.long_context_prompts(byte_tok, 1500, 4, 32) == prompts  # deterministic
    with pytest.raises(HarnessError, match="leaves no room for a document"):
        tasks.long_context_prompts(byte_tok, 20, 1, 32)
