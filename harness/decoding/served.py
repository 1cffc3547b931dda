"""A served deployment under the suite: its plain and speculative endpoints, over the OpenAI API.

Past one machine, users serve a model (llama-server, vLLM, SGLang, TGI) behind the OpenAI-compatible
``/v1/completions``. The suite puts such a deployment under test as two endpoints of one model, one
serving plain decoding and one speculative decoding (``--endpoint URL --speculative-endpoint URL``).
Prompts go as token ids (the pair's tokenizer, which must be the deployment's), greedy or sampled,
streamed: the client's clock times the first token (prefill) and the rest; the output's token ids
come from the streamed log-probabilities (llama.cpp's ``id``, or vLLM's ``token_id:N`` with
``return_tokens_as_token_ids``), and the server's own counters (llama.cpp's ``timings``: drafted
and accepted) where it sends them. An API key is read from ``ASSISTED_GENERATION_API_KEY`` and sent
as a bearer token, never written to a row or a log.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

from harness.base.errors import HarnessError
from harness.decoding import llama_server, metrics
from harness.decoding.base import Engine
from harness.settings.setup import GenerationSettings

SERVED = "served"  # the engine's name
API_KEY_ENV = "ASSISTED_GENERATION_API_KEY"
# The first token waits for the prompt's prefill (minutes for a long prompt on a CPU); once tokens
# flow, a stream silent for STALL_S has stalled: no decode step of a served model takes that long.
TIMEOUT_S = 900.0
STALL_S = 60.0
# What two endpoints must agree on before anything is measured: the top tokens after a probe prompt.
PROBE = [151643, 750, 75698]  # no special meaning beyond being ids any qwen2 vocabulary holds
PROBE_TOP = 5


def _headers() -> dict[str, str]:
    key = os.environ.get(API_KEY_ENV)
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}


def _token_ids(logprobs: dict[str, Any] | None) -> list[int]:
    """The token ids of one streamed chunk's log-probabilities (llama.cpp's or vLLM's spelling)."""
    if not logprobs:
        return []
    if isinstance(logprobs.get("content"), list):  # llama.cpp: [{"id": N, "logprob": ..}, ..]
        return [int(t["id"]) for t in logprobs["content"]]
    ids = []
    for token in logprobs.get("tokens") or []:  # vLLM with return_tokens_as_token_ids: "token_id:N"
        if not str(token).startswith("token_id:"):
            raise HarnessError(
                "the endpoint returned tokens as text, not ids: serve with token ids in log-probabilities "
                "(vLLM: return_tokens_as_token_ids, which the suite asks for; llama.cpp does so always)"
            )
        ids.append(int(str(token).split(":", 1)[1]))
    return ids


def _top(logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The first position's top log-probabilities as [{"id", "logprob"}] (llama.cpp's spelling)."""
    if not logprobs:
        return []
    if isinstance(logprobs.get("content"), list) and logprobs["content"]:
        return list(logprobs["content"][0].get("top_logprobs") or [])
    tops = logprobs.get("top_logprobs") or []
    if tops and isinstance(tops[0], dict):
        return [{"id": int(str(k).split(":", 1)[-1]), "logprob": v} for k, v in tops[0].items()]
    return []


class Endpoint:
    """One deployment's ``/v1/completions``, answering in the shape of llama.cpp's ``/completion``
    (``tokens``, ``timings``, ``completion_probabilities``) so the engine reads both alike."""

    def __init__(self, url: str, role: str) -> None:
        self.url = url.rstrip("/")
        self.role = role
        self.where = f"the {role} endpoint {self.url}"
        self._model: str | None = None

    def model(self) -> str:
        """The model the deployment serves (the first of ``/v1/models``)."""
        if self._model is None:
            request = urllib.request.Request(f"{self.url}/v1/models", headers=_headers())
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    listed = json.loads(response.read()).get("data") or []
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise HarnessError(
                    f"{self.where} could not be reached ({getattr(exc, 'reason', exc)}); "
                    "is it serving, and is the URL its base (without /v1)?"
                ) from None
            if not listed:
                raise HarnessError(f"{self.where} serves no model (/v1/models is empty)")
            self._model = str(listed[0].get("id"))
        return self._model

    def complete(self, body: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
        """A llama.cpp-style request (``llama_server.request_body``) sent as an OpenAI completion.

        The output's token ids are the streamed log-probabilities' where every piece of text came
        with them; where some did not (llama.cpp lists none for tokens its speculative rounds
        accepted), the whole text encoded by ``tokenizer``: a served deployment's contract is its
        text, and one tokenizer maps one text to one sequence."""
        request: dict[str, Any] = dict(
            model=self.model(),
            prompt=body["prompt"],
            max_tokens=body["n_predict"],
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
            seed=body.get("seed", 0),
            stream=True,
            logprobs=max(1, body.get("n_probs", 0)),
            # Extensions llama.cpp and vLLM read; an endpoint that does not ignores them. Without
            # cache_prompt off, llama.cpp reuses an earlier request's prompt cache and evaluates only
            # the prompt's last token, whose logits then come from another kernel path (a flip seen
            # at a near tie on the 12th token).
            ignore_eos=body.get("ignore_eos", False),
            cache_prompt=body.get("cache_prompt", False),
            top_k=body.get("top_k", 0) or -1,
            min_p=0.0,
            return_tokens_as_token_ids=True,
        )
        if body.get("stop"):
            request["stop"] = body["stop"]
        data = json.dumps(request).encode("utf-8")
        req = urllib.request.Request(f"{self.url}/v1/completions", data=data, headers=_headers())
        tokens: list[int] = []
        text: list[str] = []
        unlisted = False  # a piece of text came without its token ids
        top: list[dict[str, Any]] = []
        books: dict[str, Any] = {}
        start = time.perf_counter()
        first = last = start
        ended = False  # the stream's own end: a finish reason or [DONE], not a closed connection
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
                for raw in response:
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:") :].strip()
                    if payload == "[DONE]":
                        ended = True
                        break
                    chunk = json.loads(payload)
                    books.update(chunk.get("timings") or {})
                    for choice in chunk.get("choices") or []:
                        ended = ended or bool(choice.get("finish_reason"))
                        got = _token_ids(choice.get("logprobs"))
                        piece = choice.get("text") or ""
                        if (got or piece) and not (tokens or text):
                            first = time.perf_counter()
                            top = _top(choice.get("logprobs"))
                            _read_timeout(response, STALL_S)
                        unlisted = unlisted or (bool(piece) and not got)
                        tokens += got
                        text.append(piece)
                        if got or piece:
                            last = time.perf_counter()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")[:300]
            raise HarnessError(f"{self.where} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise HarnessError(
                f"{self.where} failed during a request ({getattr(exc, 'reason', exc)}); "
                "rows written so far are kept, and a rerun resumes after them"
            ) from None
        except json.JSONDecodeError as exc:
            raise HarnessError(f"{self.where} streamed something not JSON ({exc})") from None
        if not ended:
            # A connection closed mid-reply is no finished decode: its row would be resumed, never redone.
            raise HarnessError(
                f"{self.where} closed its stream after {len(tokens) or len(text)} token(s) without a finish "
                "reason or [DONE]; this prompt's row is not written (a rerun decodes it again)"
            )
        # The server's own books where it sends them (llama.cpp's timings: prompt and generation time,
        # drafted and accepted); else the client's clocks: first token = prefill (and the network), the
        # rest = generation. A stream that sends its tokens in one burst leaves the client nothing to
        # split, where the server's books still time them.
        timings = {"prompt_ms": (first - start) * 1000, "predicted_ms": (last - first) * 1000}
        for key in ("prompt_ms", "predicted_ms", "draft_n", "draft_n_accepted"):
            if key in books:
                timings[key] = books[key]
        if unlisted:
            if tokenizer is None:
                raise HarnessError(f"{self.where} listed no token ids for its text; give a tokenizer")
            tokens = list(tokenizer("".join(text), add_special_tokens=False)["input_ids"])
        return {"tokens": tokens, "timings": timings, "completion_probabilities": [{"top_logprobs": top}]}


def _read_timeout(response: Any, seconds: float) -> None:
    """Wait at most ``seconds`` for each further read of ``response`` (its socket, where the http
    client exposes it; the request's own timeout stays in force where it does not)."""
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def check_settings(settings: Any) -> None:
    """A deployment's endpoints decode plainly or speculatively as they are served: prompt lookup is
    the speculative endpoint's own business, and so is its K."""
    if settings.mode == "prompt_lookup":
        raise HarnessError(
            f"--engine {SERVED} decodes with the speculative endpoint as it is served: serve its n-gram "
            "decoding there and use --assisted_generation"
        )
    llama_server.check_settings(dataclasses.replace(settings, mode="plain"))


class ServedEngine(Engine):
    """A deployment's plain endpoint and speculative endpoint of one model, under every suite."""

    name: ClassVar[str] = SERVED
    backend: ClassVar[str | None] = "openai"
    precision: ClassVar[str | None] = "served"
    modes: ClassVar[tuple[str, ...]] = ("plain", "assisted")
    runs: ClassVar[str] = "a deployment's plain and speculative OpenAI-compatible endpoints"
    takes_endpoints: ClassVar[bool] = True
    # The suites start no deployment: a run gives its endpoints (--endpoint, --speculative-endpoint).
    in_suites: ClassVar[bool] = False
    # Streams the suite opens at most; the deployment queues what its own slots cannot take.
    max_concurrency: ClassVar[int] = 64

    @classmethod
    def resolve(cls, spec: Any, **given: Any) -> Any:
        """A run over the deployment's endpoints: the plain one, and the speculative one to assist."""
        import dataclasses as dc

        from harness.settings.setup import check_url

        endpoint, speculative = given.pop("endpoint", None), given.pop("speculative_endpoint", None)
        if not endpoint or (given.get("with_draft", True) and not speculative):
            raise HarnessError(
                f"--engine {cls.name} decodes over a deployment's OpenAI-compatible API: give --endpoint URL "
                "(its plain decoding) and, to assist, --speculative-endpoint URL (its speculative decoding)"
            )
        run = super().resolve(spec, **given)
        target = dc.replace(run.target, endpoint=check_url(endpoint))
        draft = dc.replace(run.draft, endpoint=check_url(speculative)) if run.draft is not None else None
        return dc.replace(run, target=target, draft=draft)

    # Its judge replays the prefix as one prompt: a batched prefill, not plain decoding's steps.
    exact_judge: ClassVar[bool] = False

    def __init__(self, plain: Endpoint, speculative: Endpoint | None, tokenizer: Any = None) -> None:
        self.plain = plain
        self.speculative = speculative
        self.tokenizer = tokenizer
        # The speculative deployment's own counters, per position where it books them; a deployment
        # without them is said once (``counters_note``), and its rows keep the response's totals.
        self.counters = metrics.Reader(f"{speculative.url}/metrics", _headers()) if speculative else None
        self.streams = 1

    def serve_concurrently(self, streams: int) -> None:
        """Requests go out on ``streams`` connections at once; the deployment's counters, moved by
        all of them, are no longer read per request."""
        self.streams = streams

    def counters_note(self) -> str | None:
        """Why the speculative deployment's per-position acceptance is not booked (None: it is)."""
        if self.counters is None or self.counters.read() is not None:
            return None
        return (
            f"{self.counters.missing}: rows book the responses' drafted and accepted totals only, no "
            "acceptance per position (serve with its metrics on: llama-server --metrics; vLLM exports them)"
        )

    @classmethod
    def check(cls, spec: Any, run: Any) -> None:
        check_settings(run.decoding)

    @classmethod
    def load(cls, spec: Any, run: Any, *, weights_dir: str | None = None, verify: bool = False) -> Any:
        """The deployment's endpoints, checked to serve one model with the pair's tokenizer before
        anything is measured."""
        from transformers import AutoTokenizer

        from harness.pairs import models

        cls.check(spec, run)
        plain = Endpoint(run.target.endpoint, "plain")
        speculative = Endpoint(run.draft.endpoint, "speculative") if run.draft is not None else None
        folder = models.resolve_model(spec.target, weights_dir, verify=verify)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        engine = cls(plain, speculative, tokenizer)
        engine.check_same_model()
        note = engine.counters_note()
        if note is not None:
            warnings.warn(note, stacklevel=2)
        return models.LoadedPair.of_engine(
            spec,
            run,
            tokenizer,
            {"target": plain.url, **({"draft": speculative.url} if speculative else {})},
            engine,
        )

    def check_same_model(self) -> None:
        """Two endpoints serving different models or tokenizers are refused before decoding: their
        model names and their top tokens after one probe prompt must agree."""
        if self.speculative is None:
            return
        names = (self.plain.model(), self.speculative.model())
        probe = llama_server.request_body(PROBE, GenerationSettings(max_new_tokens=1), n_probs=PROBE_TOP)
        tops = [
            [int(t["id"]) for t in e.complete(probe)["completion_probabilities"][0]["top_logprobs"]]
            for e in (self.plain, self.speculative)
        ]
        if names[0] != names[1] or tops[0][:2] != tops[1][:2]:
            raise HarnessError(
                f"the plain endpoint serves {names[0]!r} and the speculative endpoint {names[1]!r}, whose "
                f"top tokens after one probe prompt differ ({tops[0][:2]} vs {tops[1][:2]}): point both "
                "at deployments of one model"
            )

    def decode(self, _pair: Any, ids: list[int], settings: Any) -> Any:
        check_settings(settings)
        if not ids:
            raise HarnessError("empty prompt: give at least one token")
        endpoint = self.plain if settings.mode == "plain" else self.speculative
        if endpoint is None:
            raise HarnessError("this deployment was loaded without its speculative endpoint")
        reader = self.counters if settings.mode != "plain" and self.streams == 1 else None
        before = reader.read() if reader is not None else None
        start = time.perf_counter()
        answer = endpoint.complete(llama_server.request_body(ids, settings), self.tokenizer)
        wall_s = time.perf_counter() - start
        after = reader.read() if before is not None else None
        if after is not None and before is not None and "draft_n" not in answer["timings"]:
            # A response without llama.cpp's timings (vLLM's): the deployment's counters book it.
            booked = after.since(before)
            answer["timings"].update(
                draft_n=int(round(booked.draft_tokens)), draft_n_accepted=int(round(booked.accepted))
            )
        m = llama_server.measurement(ids, answer, wall_s, settings.mode)
        # The deployment's own K is not the suite's to know: the counters' positions give it.
        m.position_counts = metrics.request_positions(before, after, 0, m.accepted)
        return m

    def gap(self, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> float | None:
        """The plain endpoint's own judgement of the first place ``other`` leaves ``plain``."""
        return llama_server.flip_gap(self.plain.complete, prompt_ids, plain, other)
