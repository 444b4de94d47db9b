"""``seq2seq-serve``: a trained run behind HTTP (Starlette on uvicorn), and its web page.

Routes:

* ``POST /translate``: a LibreTranslate body ``{"q": str | [str], "source", "target",
  "format": "text", "alternatives": k}`` answered ``{"translatedText": str | [str]}`` (with
  ``k > 0`` also ``"alternatives"``, the next k texts, and ``"nbest"``, the k + 1 hypotheses
  with ``text``, ``logprob`` and ``score``); or a plain body ``{"text": str | [str],
  "nbest": n, "prefix": str | [str]}`` (``prefix`` optional: the first words of each
  translation, as ``seq2seq-translate --prefix-file``) answered ``{"translations": [{"text",
  "logprob", "score", "nbest"}]}``; or
  ``text/plain``, one sentence per line, answered in kind.
* ``POST /attention``: ``{"q": str, "alternatives": k}`` → the source pieces and, per
  hypothesis, its target pieces, cross-attention ``[layers, heads, T, S]`` and hard alignment
  (``seq2seq.alignment``).
* ``GET /health``, ``GET /languages`` (LibreTranslate's), ``GET /`` (the page).

One worker thread owns the ``Translator``: requests queue there, and the worker takes every
request that arrives within ``window_ms`` of the first (up to ``max_batch`` sentences) into one
``Translator.translate`` call, so concurrent clients share a decode and the event loop keeps
answering while it runs. A bad request gets a 4xx with ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import importlib.resources
import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from seq2seq.alignment import cross_attention
from seq2seq.decoding import ensemble_size
from seq2seq.translation import Hypothesis, Translator

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A bad request: its HTTP status (4xx) and a message naming the field and the limit."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one request may ask for.

    Attributes:
      max_sentences: sentences per request (413 beyond).
      max_body_bytes: request body size (413 beyond).
      max_nbest: hypotheses per sentence (``alternatives + 1``); the beam size for beam search.
    """

    max_sentences: int = 64
    max_body_bytes: int = 1_000_000
    max_nbest: int = 1


@dataclass
class _Job:
    lines: list[str]
    nbest: int
    attention: bool
    prefixes: list[str] | None = None  # one target prefix per line (None: none)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Batcher:
    """The decoding worker: one thread that owns ``translator`` and batches queued requests.

    Args:
      translator: used by the worker thread only.
      window_ms: how long the worker waits after a first request for more to join its batch.
      max_batch: sentences per decode call (a request with more is decoded alone).

    Attributes:
      decode_calls: ``Translator.translate`` calls made so far.
    """

    def __init__(self, translator: Translator, *, window_ms: float = 10.0, max_batch: int = 64):
        self.translator = translator
        self.window = window_ms / 1000.0
        self.max_batch = max_batch
        self.decode_calls = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._held: collections.deque[_Job] = collections.deque()
        self._thread = threading.Thread(target=self._work, name="seq2seq-decoder", daemon=True)
        self._thread.start()

    def submit(
        self,
        lines: list[str],
        nbest: int = 1,
        attention: bool = False,
        prefixes: list[str] | None = None,
    ):
        """Queue ``lines`` (with one target prefix per line, or None); the future gives
        ``list[list[Hypothesis]]`` in order (and, with ``attention``, ``(hypotheses,
        [[Attention per hypothesis] per line])``)."""
        job = _Job(list(lines), nbest, attention, prefixes)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker after the requests already queued."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _next(self, timeout: float | None) -> _Job | None:
        if self._held:
            return self._held.popleft()
        return self._queue.get(timeout=timeout)

    def _work(self) -> None:
        stop = False
        while not stop:
            first = self._next(None)
            if first is None:
                return
            jobs, count = [first], len(first.lines)
            deadline = time.monotonic() + self.window
            while count < self.max_batch:
                try:
                    job = self._next(max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                if count + len(job.lines) > self.max_batch:
                    self._held.append(job)  # the first of the next batch
                    break
                jobs.append(job)
                count += len(job.lines)
            self._run([j for j in jobs if j.future.set_running_or_notify_cancel()])

    def _run(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        lines = [line for job in jobs for line in job.lines]
        try:
            prefixes = None  # prefixes only when a request has some: no prefix, no forcing
            if any(j.prefixes is not None for j in jobs):
                prefixes = [p for j in jobs for p in (j.prefixes or [""] * len(j.lines))]
            results = self.translator.translate(
                lines, nbest=max(j.nbest for j in jobs), prefixes=prefixes
            )
            self.decode_calls += 1
            start, outputs = 0, []
            for job in jobs:
                hyps = [h[: job.nbest] for h in results[start : start + len(job.lines)]]
                start += len(job.lines)
                outputs.append(hyps)
            for job, hyps in zip(jobs, outputs):
                if job.attention:
                    pairs = [(line, h) for line, hs in zip(job.lines, hyps) for h in hs]
                    found = cross_attention(
                        self.translator, [p[0] for p in pairs], [p[1].tokens for p in pairs]
                    )
                    it = iter(found)
                    job.future.set_result((hyps, [[next(it) for _ in hs] for hs in hyps]))
                else:
                    job.future.set_result(hyps)
        except Exception as e:  # every request of the batch gets the error; the worker lives on
            log.exception("decoding failed")
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(e)


def warm_up(translator: Translator, max_batch: int, max_width: int = 64) -> int:
    """Compile the searches the server will run: for each width bucket up to ``max_width``
    tokens, batches of 1, 2, 4, ... rows up to ``max_batch`` (or the token budget).

    Every new (rows, width) shape is compiled when it first comes, which can take seconds; a
    warmed-up server answers its first requests at its usual speed. Returns the number of
    batches decoded.
    """
    from seq2seq.translation import BUCKETS

    tok, cfg, count = translator.tokenizer, translator.config, 0
    for low, width in zip((0, *BUCKETS), BUCKETS):
        if width > min(max_width, translator.max_src_len):
            break
        words = 1
        while len(tok.encode(["hello " * words])[0]) <= low:  # a sentence in this bucket
            words += 1
        sentence = "hello " * words
        if len(tok.encode([sentence])[0]) > width:
            continue
        rows = 1
        while rows <= min(max_batch, max(1, cfg.max_tokens // width)):
            translator.translate([sentence] * rows)
            count, rows = count + 1, rows * 2
    return count


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return {**names, int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else f"a {type(value).__name__}"
    )


def _sentences(payload: dict, key: str) -> tuple[list[str], bool]:
    """``payload[key]`` as a list of sentences, and whether it was one string."""
    value = payload[key]
    if isinstance(value, str):
        return [value], True
    if isinstance(value, list):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise RequestError(
                    422,
                    f"'{key}' must be a string or a list of strings; item {i} is {_type_name(v)}",
                )
        return list(value), False
    raise RequestError(
        422, f"'{key}' must be a string or a list of strings, got {_type_name(value)}"
    )


def _count(payload: dict, key: str, default: int, low: int, high: int, what: str) -> int:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"'{key}' must be an integer, got {_type_name(value)}")
    if not low <= value <= high:
        raise RequestError(400, f"'{key}' must be between {low} and {high} ({what}), got {value}")
    return value


class Service:
    """The application's state: the run's language pair, limits and the decoding worker.

    Args:
      translator: the loaded run (``Translator``).
      src_lang, tgt_lang: the run's language pair (``data.src_lang``, ``data.tgt_lang``).
      limits: per-request limits; ``max_nbest`` is capped at the beam size.
      window_ms, max_batch: as ``Batcher``.
      info: extra fields for ``GET /health`` (e.g. the workdir and step).
    """

    def __init__(
        self,
        translator: Translator,
        src_lang: str,
        tgt_lang: str,
        *,
        limits: Limits | None = None,
        window_ms: float = 10.0,
        max_batch: int = 64,
        info: dict[str, Any] | None = None,
    ):
        limits = limits or Limits()
        most = translator.strategy.max_nbest()  # None: any number of samples
        cap = limits.max_nbest if most is None else min(limits.max_nbest, most)
        self.limits = Limits(limits.max_sentences, limits.max_body_bytes, max(1, cap))
        self.translator, self.src_lang, self.tgt_lang = translator, src_lang, tgt_lang
        self.info = dict(info or {})
        self.batcher = Batcher(translator, window_ms=window_ms, max_batch=max_batch)

    # -- request checks --------------------------------------------------------------------
    def check_pair(self, payload: dict) -> None:
        source, target = payload.get("source"), payload.get("target")
        for key, value in (("source", source), ("target", target)):
            if value is not None and not isinstance(value, str):
                raise RequestError(422, f"'{key}' must be a string, got {_type_name(value)}")
        if source not in (None, "auto", self.src_lang) or target not in (None, self.tgt_lang):
            raise RequestError(
                400,
                f"unknown language pair {source or self.src_lang}→{target or self.tgt_lang}: "
                f"this server translates {self.src_lang}→{self.tgt_lang} "
                f"(source '{self.src_lang}', target '{self.tgt_lang}')",
            )
        fmt = payload.get("format", "text")
        if fmt != "text":
            raise RequestError(400, f"'format' must be 'text' (no HTML support), got {fmt!r}")

    def check_lines(self, lines: Sequence[str]) -> None:
        limit = self.limits.max_sentences
        if len(lines) > limit:
            raise RequestError(
                413, f"{len(lines)} sentences in one request; the limit is {limit} per request"
            )
        tokens = self.translator.max_src_len
        for i, n in enumerate(len(x) for x in self.translator.tokenizer.encode(list(lines))):
            if n > tokens and lines[i].strip():
                raise RequestError(
                    413,
                    f"sentence {i} is {n} tokens long (EOS included); the limit is {tokens} "
                    "tokens per sentence",
                )

    def check_prefixes(self, payload: dict, lines: list[str], single: bool) -> list[str] | None:
        """The optional ``prefix`` of a ``text`` request: a string (one sentence) or one string
        per sentence, checked as ``seq2seq-translate --prefix-file`` checks them."""
        if "prefix" not in payload:
            return None
        value = payload["prefix"]
        prefixes = [value] if single and isinstance(value, str) else value
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            what = "a string" if single else "a list of strings, one per sentence"
            raise RequestError(422, f"'prefix' must be {what}, got {_type_name(value)}")
        try:
            self.translator.check_prefixes(lines, prefixes, "'prefix'")
        except ValueError as e:
            raise RequestError(422, str(e)) from None
        return prefixes

    async def decode(
        self,
        lines: list[str],
        nbest: int,
        attention: bool = False,
        prefixes: list[str] | None = None,
    ):
        return await asyncio.wrap_future(self.batcher.submit(lines, nbest, attention, prefixes))

    # -- routes ------------------------------------------------------------------------------
    async def payload(self, request: Request) -> Any:
        body = await request.body()
        if len(body) > self.limits.max_body_bytes:
            raise RequestError(
                413, f"request body of {len(body)} bytes; the limit is {self.limits.max_body_bytes}"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(400, f"the body is not UTF-8: {e}") from None
        if request.headers.get("content-type", "").startswith("text/plain"):
            return text
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as e:
            raise RequestError(400, f"malformed JSON: {e}") from None
        if not isinstance(payload, dict):
            raise RequestError(422, f"the body must be a JSON object, got {_type_name(payload)}")
        return payload

    async def translate(self, request: Request) -> Response:
        payload = await self.payload(request)
        if isinstance(payload, str):  # text/plain: one sentence per line
            lines = payload.splitlines()
            self.check_lines(lines)
            hyps = await self.decode(lines, 1)
            return PlainTextResponse("".join(h[0].text + "\n" for h in hyps))
        if ("q" in payload) == ("text" in payload):
            raise RequestError(
                400, "give the sentences as 'q' (LibreTranslate) or as 'text', not both or neither"
            )
        self.check_pair(payload)
        top = self.limits.max_nbest
        if "q" in payload:
            lines, single = _sentences(payload, "q")
            extra = _count(payload, "alternatives", 0, 0, top - 1, "the beam size minus 1")
            self.check_lines(lines)
            hyps = await self.decode(lines, extra + 1)
            texts = [h[0].text for h in hyps]
            out: dict[str, Any] = {"translatedText": texts[0] if single else texts}
            if extra:
                alts = [[x.text for x in h[1:]] for h in hyps]
                nbest = [[_hypothesis(x) for x in h] for h in hyps]
                out["alternatives"] = alts[0] if single else alts
                out["nbest"] = nbest[0] if single else nbest
            return JSONResponse(out)
        lines, single = _sentences(payload, "text")
        n = _count(payload, "nbest", 1, 1, top, "the beam size")
        self.check_lines(lines)
        prefixes = self.check_prefixes(payload, lines, single)
        hyps = await self.decode(lines, n, prefixes=prefixes)
        return JSONResponse(
            {
                "translations": [
                    {**_hypothesis(h[0]), "nbest": [_hypothesis(x) for x in h]} for h in hyps
                ]
            }
        )

    async def attention(self, request: Request) -> Response:
        payload = await self.payload(request)
        if isinstance(payload, str) or "q" not in payload:
            raise RequestError(400, 'give the sentence as a JSON object {"q": "..."}')
        self.check_pair(payload)
        if not isinstance(payload["q"], str):
            raise RequestError(422, f"'q' must be a string, got {_type_name(payload['q'])}")
        if not payload["q"].strip():
            raise RequestError(400, "'q' is empty: there is no attention to show")
        if ensemble_size(self.translator.graphdef) > 1:
            raise RequestError(400, "this server decodes with an ensemble: no one attention")
        top = self.limits.max_nbest
        extra = _count(payload, "alternatives", 0, 0, top - 1, "the beam size minus 1")
        self.check_lines([payload["q"]])
        hyps, found = await self.decode([payload["q"]], extra + 1, attention=True)
        first = found[0][0]
        return JSONResponse(
            {
                "source": list(first.source),
                "layers": int(first.weights.shape[0]),
                "heads": int(first.weights.shape[1]),
                "hypotheses": [
                    {
                        **_hypothesis(h),
                        "target": list(a.target),
                        "attention": a.weights.astype(np.float64).round(5).tolist(),
                        "alignment": [list(link) for link in a.hard()],
                    }
                    for h, a in zip(hyps[0], found[0])
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "source": self.src_lang,
                "target": self.tgt_lang,
                "search": self.translator.strategy.label(),
                "max_sentences": self.limits.max_sentences,
                "max_tokens_per_sentence": self.translator.max_src_len,
                "max_nbest": self.limits.max_nbest,
                "decode_calls": self.batcher.decode_calls,
                **self.info,
            }
        )

    async def languages(self, request: Request) -> Response:
        return JSONResponse(
            [
                {"code": self.src_lang, "name": self.src_lang, "targets": [self.tgt_lang]},
                {"code": self.tgt_lang, "name": self.tgt_lang, "targets": []},
            ]
        )

    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))


PAGE = importlib.resources.files("seq2seq") / "serve_static" / "index.html"


def _hypothesis(h: Hypothesis) -> dict[str, Any]:
    return {"text": h.text, "logprob": round(h.logprob, 4), "score": round(h.score, 4)}


def make_app(service: Service) -> Starlette:
    """The ASGI application over ``service``; its shutdown stops the decoding worker."""

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestError as e:
                return _error(e.status, str(e))
            except Exception as e:  # a 500 with the reason; the server keeps serving
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(500, f"internal error: {type(e).__name__}: {e}")

        return endpoint

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(service.batcher.close)

    routes = [
        Route("/", guarded(service.page), methods=["GET"]),
        Route("/health", guarded(service.health), methods=["GET"]),
        Route("/languages", guarded(service.languages), methods=["GET"]),
        Route("/translate", guarded(service.translate), methods=["POST"]),
        Route("/attention", guarded(service.attention), methods=["POST"]),
    ]
    return Starlette(
        routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan
    )


def serve(app: Starlette, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
    """Run ``app`` on uvicorn until interrupted (Ctrl-C / SIGTERM)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level)
