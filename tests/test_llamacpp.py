"""llama.cpp as a reference: reading llama-bench's JSON, finding the binary, absent without one."""

from __future__ import annotations

import json
import stat

import pytest

from harness.base import llamacpp
from harness.base.errors import HarnessError
from harness.experiments import forwards
from harness.kernels import llama_build

# The shape of llama-bench's `-o json` output (one object per test; fields it always writes).
ROWS = [
    {
        "build_commit": "abc1234",
        "build_number": 5000,
        "n_threads": 2,
        "n_prompt": 512,
        "n_gen": 0,
        "avg_ts": 80.5,
    },
    {
        "build_commit": "abc1234",
        "build_number": 5000,
        "n_threads": 2,
        "n_prompt": 0,
        "n_gen": 64,
        "avg_ts": 34.1,
        "stddev_ts": 0.4,
    },
]


def test_parse_takes_the_decode_row():
    ref = llamacpp.parse("build info on stderr is not here\n" + json.dumps(ROWS))
    assert (ref.tokens_per_s, ref.tokens_per_s_std, ref.threads, ref.new_tokens) == (34.1, 0.4, 2, 64)
    assert ref.ms_per_token == pytest.approx(1000 / 34.1)
    assert ref.build == "abc1234 (5000)"


@pytest.mark.parametrize("text", ["no json here", json.dumps(ROWS[:1]), "[{"])
def test_parse_refuses_output_without_a_decode_row(text):
    with pytest.raises(HarnessError, match="llama-bench"):
        llamacpp.parse(text)


def test_a_model_without_gguf_needs_no_binary_and_has_no_reference(monkeypatch, tmp_path):
    monkeypatch.delenv(llamacpp.ENV, raising=False)
    model, gguf = forwards.gguf_of("tiny-qwen2", "target")
    assert (model, gguf) == ("tiny-qwen2", None)
    # Nothing to time: no binary is looked for, and none is built.
    assert llama_build.reference_binary(None, gguf, tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()
    done, ref, line = llamacpp.around(None, gguf, model, lambda: "work", threads=2)
    assert (done, ref) == ("work", None) and llamacpp.ENV in line


def test_a_wrong_binary_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(llamacpp.ENV, str(tmp_path / "nope"))
    with pytest.raises(HarnessError, match="not an executable"):
        llama_build.reference_binary(None, tmp_path / "m.gguf", tmp_path / "cache")


@pytest.mark.parametrize("named", ["/bin/false", "/bin/true"])
def test_an_executable_that_is_not_llama_cpp_is_refused_when_named(named):
    with pytest.raises(HarnessError, match=r"is not a llama.cpp binary \(`--version` exited \d"):
        llama_build.given("llama-server", named)


def test_measure_runs_the_binary_and_reads_its_json(tmp_path):
    """A stand-in llama-bench (a shell script printing recorded output) checks the command line the
    harness passes and that a failing binary is reported with its exit status."""
    script = tmp_path / "llama-bench"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "version: 1 (stand-in)" >&2; exit 0; fi\n'
        'case "$*" in *"-p 0 -n 16 -t 2 -r 2 -o json"*|*"-p 0 -n 16 -t 2 -d 512 -r 2 -o json"*) ;;\n'
        '  *) echo "bad args: $*" >&2; exit 3;; esac\n'
        f"echo '{json.dumps(ROWS)}'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    binary = llama_build.given("llama-bench", script)
    ref = llamacpp.measure(binary, tmp_path / "m.gguf", threads=2, new_tokens=16, repetitions=2)
    assert ref.tokens_per_s == 34.1
    # Onto a cache that already holds 512 tokens: llama-bench's -d.
    deep = llamacpp.measure(binary, tmp_path / "m.gguf", threads=2, new_tokens=16, repetitions=2, depth=512)
    assert deep.tokens_per_s == 34.1
    with pytest.raises(HarnessError, match="exit 3"):
        llamacpp.measure(script, tmp_path / "m.gguf", threads=1, new_tokens=16, repetitions=2)


def test_the_reference_is_measured_before_and_after_the_run(tmp_path):
    """llama-bench runs just before and just after the harness's own measurement; the reference is
    their mean, the line names both, and says so when the host's speed moved by more than 10%."""
    counter = tmp_path / "calls"
    rows = json.dumps(ROWS).replace('"avg_ts": 34.1', '"avg_ts": SPEED')
    fake = tmp_path / "llama-bench"
    fake.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}\n"
        f'if [ "$n" = 0 ]; then s=40.0; else s=30.0; fi\n'
        f"echo '{rows}' | sed \"s/SPEED/$s/\"\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    order = []
    done, ref, line = llamacpp.around(
        fake, gguf, "model", lambda: order.append(counter.read_text().strip()) or "work", threads=2
    )
    assert done == "work" and order == ["1"]  # the work ran between the two measurements
    assert ref.tokens_per_s == pytest.approx(35.0) and (ref.before, ref.after) == (40.0, 30.0)
    assert "40.00 tok/s before this run and 30.00 after, mean 35.00" in line
    assert "the host's speed moved by 29%" in line


def test_llama_cpps_batches_of_m_tokens_continue_its_line_of_the_table(tmp_path):
    """Beside the harness's forward of M tokens, llama.cpp's forward of a batch of M (llama-bench's
    prompt test, -p M -n 0, onto the same cache): its ms is M over the batch's tokens/s, and the
    reference's line of the table gains the M columns, relative to its time per token."""
    batches = {2: 60.0, 4: 50.0}  # tokens/s of a batch of 2 and of 4
    script = tmp_path / "llama-bench"
    cases = "".join(f'  *"-p {m} -n 0 -t 2 -d 1024 -r "*) ts={ts};;\n' for m, ts in batches.items())
    row = dict(ROWS[0], n_prompt="M", avg_ts="TS")
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "version: 1 (stand-in)" >&2; exit 0; fi\n'
        f'case "$*" in\n{cases}  *) echo "bad args: $*" >&2; exit 3;; esac\n'
        'm=$(echo "$*" | sed "s/.*-p \\([0-9]*\\) .*/\\1/")\n'
        f'echo \'{json.dumps([row])}\' | sed "s/\\"M\\"/$m/; s/\\"TS\\"/$ts/"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    binary = llama_build.given("llama-bench", script)
    gguf = tmp_path / "m.gguf"
    assert llamacpp.batch_ms(binary, gguf, rows=4, threads=2, depth=1024) == pytest.approx(80.0)
    ref = llamacpp.Reference(tokens_per_s=40.0, tokens_per_s_std=0.0, threads=2, new_tokens=64, build="b (1)")
    costs = list(forwards.reference_batches(binary, gguf, ref, "target", (1, 4, 2, 4), 1024))
    assert [(c.m, round(c.ms, 2), c.cache_tokens, c.precision) for c in costs] == [
        (2, 33.33, 1024, "llama.cpp"),
        (4, 80.0, 1024, "llama.cpp"),
    ]
    one = forwards.ForwardCost("target", "llama.cpp", "b (1)", 1, 25.0, 25.0, None, 1024)
    assert "| 25.0  | 33.3 (1.33) | 80.0 (3.20) |" in forwards.table([one, *costs])
    with pytest.raises(HarnessError, match="exit 3"):  # a batch llama-bench cannot run is said so
        llamacpp.batch_ms(binary, gguf, rows=3, threads=2, depth=1024)
