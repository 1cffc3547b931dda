"""llama.cpp's own decoding, plain and speculative, as an engine under test: its ``llama-server``.

llama.cpp users run models through ``llama-server``; its speculative decoding is a server setting
(a draft GGUF, ``--spec-draft-n-max`` K) or its n-gram lookup (``--spec-type ngram-simple``). This
module starts such servers on the loopback address, a free port each, and decodes over the server's
own HTTP API with token ids in and out, so the suite compares what llama.cpp itself produces: its
tokens, its top log-probabilities where a flip is judged, and its own books for the row (prompt and
generation time, tokens drafted and accepted). Every server it starts is stopped when its engine
closes, when the process exits, on Ctrl-C, and (Linux) when the process is killed.

A served deployment (``Endpoint`` over a URL the user gives) is decoded the same way: over
llama.cpp's native ``/completion`` or any OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, TGI).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.base.errors import HarnessError
from harness.decoding import metrics
from harness.decoding.base import DRAFT_SPLIT_FIELDS, Engine
from harness.settings.setup import GenerationSettings
from harness.theory import analysis, timing

LLAMACPP = "llama.cpp"  # the engine's name

HOST = "127.0.0.1"  # the only address a server the suite starts listens on
MAX_K = 64
# llama.cpp's n-gram speculation that matches prompt lookup: the last NGRAM_SIZE tokens are looked
# up in the prompt and output so far, and the tokens that followed them are proposed.
NGRAM_SIZE = 2
CONTEXT = 8192  # tokens per server slot: the longest prompt the suites decode plus its budget
# Parallel slots a server runs at most (``--concurrency``): each holds a CONTEXT-token KV cache of
# both models (about 0.3 GB for the offline pair), and two cores serve them all.
MAX_SLOTS = 8
START_TIMEOUT_S = 180.0
# llama-server opens its port before it loads the model (and answers 503 while loading): a server
# that has not answered at all by then never will.
FIRST_ANSWER_S = 30.0
REQUEST_TIMEOUT_S = 900.0
# How many of the server's top log-probabilities a replayed position asks for when a flip is judged.
JUDGE_PROBS = 20


def free_port() -> int:
    """A port on the loopback address nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # The server must not outlive the suite, even when the suite is killed (SIGKILL runs no handler).
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass(frozen=True)
class ServerArgs:
    """What one ``llama-server`` runs: the target GGUF and, for speculative decoding, a draft GGUF
    (K = ``k``) or the n-gram lookup (``ngram`` tokens matched, ``k`` proposed)."""

    binary: Path
    model: Path
    draft: Path | None = None
    k: int = 0
    ngram: int = 0
    threads: int = 1
    slots: int = 1  # requests served at once (llama-server's --parallel), each with CONTEXT tokens

    @property
    def mode(self) -> str:
        return "assisted" if self.draft is not None else ("prompt_lookup" if self.ngram else "plain")

    def argv(self, port: int) -> list[str]:
        argv = [str(self.binary), "-m", str(self.model), "--host", HOST, "--port", str(port)]
        argv += ["-t", str(self.threads), "-tb", str(self.threads)]
        # The context is shared among the slots: CONTEXT tokens each.
        argv += ["-c", str(CONTEXT * self.slots), "-np", str(self.slots)]
        # No web UI, no prompt cache in host memory: each request is decoded from its first token.
        argv += ["--no-webui", "--cache-ram", "0"]
        # Its Prometheus counters: drafted and accepted per position (``metrics``), which a
        # response's timings do not break down.
        argv += ["--metrics"]
        if self.draft is not None:
            # Always K candidates a round (n_min 0, p_min 0): the suite's constant K.
            argv += ["--spec-type", "draft-simple", "--spec-draft-model", str(self.draft)]
            argv += ["--spec-draft-n-max", str(self.k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
            argv += ["--spec-draft-threads", str(self.threads)]
        elif self.ngram:
            argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.ngram)]
            argv += ["--spec-ngram-simple-size-m", str(self.k)]
        return argv


def _post(url: str, body: dict[str, Any], *, timeout: float, headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:300]
        raise HarnessError(f"{url} answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HarnessError(f"{url} could not be reached ({reason})") from None
    except json.JSONDecodeError as exc:
        raise HarnessError(f"{url} answered something that is not JSON ({exc})") from None


class Server:
    """One ``llama-server`` process on the loopback address (``start`` waits for ``/health``)."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def counters(self) -> metrics.Counters | None:
        """Its speculative counters now (``metrics``); None where it books none."""
        return metrics.Reader(f"{self.url}/metrics").read()

    def log_tail(self, lines: int = 4) -> str:
        try:
            text = Path(self._log.name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " / ".join(kept[-lines:])

    def start(self) -> Server:
        self.port = free_port()
        try:
            self.process = subprocess.Popen(
                self.args.argv(self.port),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise HarnessError(f"llama-server {self.args.binary} could not start ({exc})") from None
        _LIVE.add(self)
        _stop_on_sigterm()
        started = time.monotonic()
        answered = False  # anything over HTTP, a 503 while the model loads included
        while time.monotonic() < started + (START_TIMEOUT_S if answered else FIRST_ANSWER_S):
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise HarnessError(
                    f"llama-server exited (code {self.process.returncode}) before it served "
                    f"{self.args.model.name}: {tail}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except urllib.error.HTTPError:
                answered = True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        waited = START_TIMEOUT_S if answered else FIRST_ANSWER_S
        how = "did not become healthy" if answered else "never answered on its port"
        raise HarnessError(
            f"llama-server {self.args.binary} {how} within {waited:.0f} s (is it llama.cpp's server?): {tail}"
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One ``/completion`` request; a server that died on the way is said with its last log lines."""
        if not self.alive():
            raise HarnessError(f"llama-server ({self.args.mode}) is not running: {self.log_tail()}")
        try:
            return _post(f"{self.url}/completion", body, timeout=REQUEST_TIMEOUT_S)
        except HarnessError as exc:
            if not self.alive():
                raise HarnessError(
                    f"llama-server ({self.args.mode}) died during a request (exit "
                    f"{self.process.returncode if self.process else '?'}): {self.log_tail()}; rows "
                    "written so far are kept, and a rerun resumes after them"
                ) from None
            raise exc

    def stop(self) -> None:
        """Stop the process (its return code stays readable) and remove its log."""
        _LIVE.discard(self)
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


_LIVE: set[Server] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


def _stop_on_sigterm() -> None:
    """SIGTERM (a job runner's stop) ends Python without its exit handlers: the servers would live
    on until the parent-death signal reaches them and leave their logs behind. Stop them first, then
    end as that signal would have (or as the handler that was there says)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "stops_llama_servers", False):
        return

    def stop_then_end(signum: int, frame: Any) -> None:
        _stop_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    stop_then_end.stops_llama_servers = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, stop_then_end)


# --------------------------------------------------------------------------- requests and books


def request_body(prompt_ids: Sequence[int], settings: Any, *, n_probs: int = 0) -> dict[str, Any]:
    """The ``/completion`` request for the suite's settings: token ids in, token ids out, every
    sampler that would change a distribution off (llama.cpp's defaults keep min-p 0.05)."""
    body: dict[str, Any] = dict(
        prompt=[int(t) for t in prompt_ids],
        n_predict=settings.max_new_tokens,
        return_tokens=True,
        cache_prompt=False,
        ignore_eos=settings.ignore_eos,
        n_probs=n_probs,
        seed=settings.seed,
        min_p=0.0,
        typical_p=1.0,
        repeat_penalty=1.0,
        top_n_sigma=-1.0,
        xtc_probability=0.0,
        dry_multiplier=0.0,
    )
    if settings.do_sample:
        body.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    else:
        body.update(temperature=0.0, top_k=1)
    if settings.stop_strings:
        body["stop"] = list(settings.stop_strings)
    return body


def measurement(prompt_ids: Sequence[int], answer: dict[str, Any], wall_s: float, mode: str) -> Any:
    """A ``timing.Measurement`` from a ``/completion`` answer: the server's own books for prefill,
    time per token and drafting; the client's clock for the whole request."""
    from harness.theory.timing import Measurement

    tokens = [int(t) for t in answer.get("tokens") or []]
    books = answer.get("timings") or {}
    prompt_ms = float(books.get("prompt_ms", 0.0))
    predicted_ms = float(books.get("predicted_ms", 0.0))
    drafted = int(books.get("draft_n", 0))
    accepted = int(books.get("draft_n_accepted", 0))
    per_token = timing.per_token_ms(predicted_ms, len(tokens))
    # Every target forward yields the candidates it accepted plus one token of its own, and the
    # prompt's forward yields the first: forwards = new tokens - accepted.
    forwards = max(0, len(tokens) - accepted)
    return Measurement(
        prompt_tokens=len(prompt_ids),
        output_ids=tokens,
        total_s=wall_s,
        prefill_ms=prompt_ms,
        target_prefill_ms=prompt_ms,
        time_per_token_ms=per_token,
        tokens_per_s=timing.rate(per_token),
        target_forwards=forwards,
        draft_forwards=drafted if mode == "assisted" else 0,
        # The server books prompt and generation time, not the draft's share of a speculative round;
        # nor which rounds ended on a rejection (``rejected_steps``), so alpha is not estimated.
        target_ms=prompt_ms + predicted_ms,
        draft_ms=None,
        other_ms=max(0.0, wall_s * 1000 - prompt_ms - predicted_ms),
        drafted=drafted,
        accepted=accepted,
        # A decode step: plain, one target forward; speculative, one round, its drafting included
        # (the server books no draft time apart, so the draft's own cost c stays unmeasured).
        step_costs={"target": (predicted_ms, max(0, forwards - 1))},
    )


def flip_gap(
    complete: Callable[[dict[str, Any]], dict[str, Any]],
    prompt_ids: Sequence[int],
    plain: Sequence[int],
    other: Sequence[int],
) -> float | None:
    """Where ``other`` first leaves ``plain``, the plain token's log-probability lead over the other
    one by the plain decoder's own top log-probabilities there (``complete``: its ``/completion``
    request, the prefix replayed as one prompt); None when they do not differ."""
    i = analysis.first_differing_token(plain, other)
    if i is None:
        return None
    settings = GenerationSettings(max_new_tokens=1, ignore_eos=True)
    answer = complete(request_body([*prompt_ids, *plain[:i]], settings, n_probs=JUDGE_PROBS))
    top = (answer.get("completion_probabilities") or [{}])[0].get("top_logprobs", [])
    return logprob_gap(top, plain[i], other[i])


def logprob_gap(top: list[dict[str, Any]], plain_token: int, other_token: int) -> float:
    """How far the plain token's log-probability leads the other's (the logit gap: softmax keeps
    differences); a token outside the listed top ones is at most as likely as the last listed."""
    by_id = {int(t["id"]): float(t["logprob"]) for t in top}
    floor = min(by_id.values()) if by_id else 0.0
    return by_id.get(plain_token, floor) - by_id.get(other_token, floor)


# --------------------------------------------------------------------------- the engine


def build_of(binary: Path) -> str:
    """The build a ``llama-server`` says it is (``--version``), e.g. "build 11434, commit ..."."""
    try:
        command = [str(binary), "--version"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"llama-server {binary} could not run ({exc})") from None
    text = done.stdout + done.stderr
    found = next((line.strip() for line in text.splitlines() if line.startswith("version:")), None)
    if done.returncode != 0 or found is None:
        raise HarnessError(f"{binary} --version did not say a llama.cpp version: is it llama-server?")
    return found[len("version:") :].strip()


def check_settings(settings: Any) -> None:
    """What llama.cpp's server runs through the suite: plain decoding, with the draft GGUF or with
    its n-gram lookup, greedy or sampled, with the model's own end of generation."""
    if settings.mode != "plain":
        k = settings.proposal_k
        if not 1 <= k <= MAX_K:
            raise HarnessError(f"K = {k}: the suite runs llama.cpp's speculative decoding with 1 to {MAX_K}")
    if settings.eos_token_id is not None:
        raise HarnessError(
            f"--engine {LLAMACPP} stops at the model's own end-of-generation tokens; it takes no other EOS"
        )
    if settings.min_new_tokens:
        raise HarnessError(f"--engine {LLAMACPP} has no minimum token count: drop --min_new_tokens")


@dataclass
class Servers:
    """A pair's servers: the plain one, and one per speculative mode and K, started on first use."""

    binary: Path
    target: Path
    draft: Path | None
    threads: int
    running: dict[tuple[str, int, int], Server] = field(default_factory=dict)
    slots: int = 1  # what the servers started from now on serve at once
    starting: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def args_for(self, mode: str, k: int) -> ServerArgs:
        base = ServerArgs(self.binary, self.target, threads=self.threads, slots=self.slots)
        if mode == "plain":
            return base
        if mode == "assisted":
            if self.draft is None:
                raise HarnessError("this pair was loaded without a draft; load it with its draft to assist")
            return ServerArgs(self.binary, self.target, self.draft, k, threads=self.threads, slots=self.slots)
        return ServerArgs(self.binary, self.target, None, k, NGRAM_SIZE, self.threads, self.slots)

    def server(self, mode: str, k: int) -> Server:
        """The running server of ``mode`` at ``k``, started on first use. One that died since its
        last request is an error, said with its last log lines, never replaced in silence (a crash
        would hide among the rows); it is forgotten, so the next request starts a fresh one."""
        key = (mode, 0 if mode == "plain" else k, self.slots)
        dead = self.running.get(key)
        if dead is not None and not dead.alive():
            tail, code = dead.log_tail(), dead.process.returncode if dead.process else None
            dead.stop()
            del self.running[key]
            raise HarnessError(
                f"llama-server ({mode}) exited (code {code}) since its last request: {tail}; rows "
                "written so far are kept, and a rerun resumes after them"
            )
        with self.starting:  # requests from several streams start one server, not one each
            if key not in self.running:
                self.running[key] = Server(self.args_for(mode, k)).start()
            return self.running[key]

    def close(self) -> None:
        for server in self.running.values():
            server.stop()
        self.running.clear()


class LlamaCppEngine(Engine):
    """llama.cpp's ``llama-server`` over a pair's GGUF files: plain decoding, its speculative
    decoding with the draft GGUF (K = ``--num_assistant_tokens``) and its n-gram lookup (the suite's
    prompt lookup, ``--prompt_lookup N`` tokens proposed)."""

    name: ClassVar[str] = LLAMACPP
    backend: ClassVar[str | None] = LLAMACPP
    precision: ClassVar[str | None] = "gguf"
    default_k: ClassVar[int | None] = 3  # llama.cpp's own default draft length
    # Its judge replays the prefix as one prompt: a batched prefill, not plain decoding's steps.
    exact_judge: ClassVar[bool] = False
    # The server books a speculative round whole: no draft time apart (its acceptance per position
    # comes from its counters, ``metrics``).
    unbooked: ClassVar[frozenset[str]] = DRAFT_SPLIT_FIELDS
    # Its flips are near ties of its own kernels: the first ten problems rather than the suites' two
    # (the published run scores all 164; the first 20 score equal too).
    humaneval_problems: ClassVar[int] = 10
    options: ClassVar[tuple[str, ...]] = ("llama_server",)
    version_names: ClassVar[tuple[str, ...]] = ("llama.cpp",)
    runs: ClassVar[str] = "GGUF files as they are (a pair's, or two bare .gguf files)"
    max_concurrency: ClassVar[int] = MAX_SLOTS

    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        # Which llama.cpp decoded: every row this engine writes carries it beside the libraries'.
        self.versions = {"llama.cpp": build_of(servers.binary)}

    def serve_concurrently(self, streams: int) -> None:
        """Servers started from now on run ``streams`` slots (llama-server's ``--parallel``)."""
        if not 1 <= streams <= MAX_SLOTS:
            raise HarnessError(f"llama.cpp's server runs 1 to {MAX_SLOTS} slots here (asked for {streams})")
        self.servers.slots = streams

    @classmethod
    def unfit(cls, spec: Any) -> str | None:
        from harness.pairs import models

        return models.missing_gguf(spec)

    from_built_models: ClassVar[bool] = True

    @classmethod
    def from_models(cls, spec: Any, run: Any, target: Any, draft: Any, tokenizer: Any, folder: Path) -> Any:
        """The models as GGUF files (``tiny.gguf_file``) under the suite's server."""
        from harness.pairs import models
        from harness.weights import tiny

        files = (tiny.gguf_file(target, folder / "target.gguf"), tiny.gguf_file(draft, folder / "draft.gguf"))
        return models.LoadedPair.of_engine(spec, run, tokenizer, {}, cls.of_files(*files))

    @classmethod
    def take_options(cls, values: Any) -> None:
        """``--llama-server PATH``: the binary every server of this process runs, where the engine reads
        it (the variable's own value)."""
        from harness.kernels import llama_build

        if values.get("llama_server") is not None:
            binary = llama_build.given("llama-server", values["llama_server"])
            os.environ[llama_build.ENV["llama-server"]] = str(binary)

    @classmethod
    def build(cls) -> None:
        from harness.kernels import llama_build
        from harness.weights import packaged

        for name in llama_build.BINARIES:
            llama_build.binary(name, packaged.cache_root())

    @classmethod
    def check(cls, spec: Any, run: Any) -> None:
        """A pair with GGUF files (both, when a draft runs), settings the server takes."""
        check_settings(run.decoding)
        cls.gguf_files(spec, run, None)

    @staticmethod
    def gguf_files(spec: Any, run: Any, weights_dir: str | None) -> dict[str, Path]:
        from harness.pairs import models

        return models.pair_gguf_files(spec, run.draft is not None, weights_dir, LLAMACPP)

    @classmethod
    def load(cls, spec: Any, run: Any, *, weights_dir: str | None = None, verify: bool = False) -> Any:
        """The pair as llama.cpp's server runs it (checked first): its GGUF files, the suite's
        tokenizer for the prompts, and the server binary (``harness.kernels.llama_build``)."""

        from harness.pairs import models
        from harness.weights import packaged

        check_settings(run.decoding)
        ggufs = cls.gguf_files(spec, run, weights_dir)
        if verify:  # every byte of the packaged files checked against their recorded digests
            for model in (spec.target, spec.draft)[: len(ggufs)]:
                if not model.is_gguf_file:  # a file given as it is has no record to check against
                    models.resolve_model(model, weights_dir, verify=True)
        engine = cls.of_files(ggufs["target"], ggufs.get("draft"))
        return models.LoadedPair.of_engine(
            spec,
            run,
            models.tokenizer_of(spec.target, weights_dir),
            {
                **{role: packaged.portable(p) for role, p in ggufs.items()},
                "binary": str(engine.servers.binary),
            },
            engine,
        )

    @classmethod
    def of_files(cls, target: Path, draft: Path | None) -> LlamaCppEngine:
        """The engine over GGUF files as they are (a registered pair's, or a test's tiny models),
        with the suite's ``llama-server`` (``harness.kernels.llama_build``: the user's, or built once)."""
        import torch

        from harness.kernels import llama_build
        from harness.weights import packaged

        binary = llama_build.binary("llama-server", packaged.cache_root())
        return cls(Servers(binary, target, draft, torch.get_num_threads()))

    def decode(self, _pair: Any, ids: list[int], settings: Any) -> Any:
        check_settings(settings)
        if not ids:
            raise HarnessError("empty prompt: give at least one token")
        if len(ids) + settings.max_new_tokens > CONTEXT:
            raise HarnessError(
                f"a {len(ids)}-token prompt and {settings.max_new_tokens} new tokens exceed the server's "
                f"{CONTEXT}-token context"
            )
        server = self.servers.server(settings.mode, settings.proposal_k)
        # The counters are read outside the timed request: per position, as the server books them.
        # With several slots, other streams' requests move them too: not read.
        before = server.counters() if settings.mode != "plain" and server.args.slots == 1 else None
        start = time.perf_counter()
        answer = server.complete(request_body(ids, settings))
        m = measurement(ids, answer, time.perf_counter() - start, settings.mode)
        if before is not None:
            after = server.counters()
            m.position_counts = metrics.request_positions(before, after, settings.proposal_k, m.accepted)
        return m

    def gap(self, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> float | None:
        """The plain server's own judgement of the first place ``other`` leaves ``plain``."""
        return flip_gap(self.servers.server("plain", 0).complete, prompt_ids, plain, other)

    def close(self) -> None:
        self.servers.close()
