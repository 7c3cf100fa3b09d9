"""The OpenAI-compatible HTTP server (llama-server's conventions, spec landscape §8).

`create_app(engine | loader, ...)` builds the FastAPI app. With a `loader` the model loads on a
background thread after startup, and /health answers 503 until it is ready. Every generation runs
on the scheduler's single worker thread (tightfit/server/scheduler.py) against one `Session`, so
the prompt cache spans all requests.

Errors are OpenAI-shaped `{"error": {"message", "type", "code"}}` with the right status; a client
never sees a traceback and the server stays up.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tightfit.errors import UserError
from tightfit.runtime.session import DEFAULT_CACHE_BYTES, Session
from tightfit.server import metrics, schemas
from tightfit.server.scheduler import QueueFull, Scheduler, SchedulerClosed
from tightfit.server.schemas import ApiError

log = logging.getLogger("tightfit.server")

PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}   # no API key needed (as llama-server)
RETRY_AFTER_S = 5


class ServerState:
    def __init__(self, model_id: str | None, api_key: str | None, queue_size: int, cache_bytes: int):
        self.engine = None
        self.session: Session | None = None
        self.model_id = model_id
        self.model_path: str | None = None
        self.api_key = api_key
        self.cache_bytes = cache_bytes
        self.stats = metrics.Stats()
        self.scheduler: Scheduler | None = None
        self.queue_size = queue_size
        self.registry = metrics.make_registry(self.stats, self._cache_info)
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.created = int(time.time())

    def _cache_info(self) -> tuple[int, int, int]:
        s = self.session
        return (len(s.cache), s.cache.nbytes, s.cache.budget) if s else (0, 0, self.cache_bytes)

    def set_engine(self, engine) -> None:
        self.engine = engine
        self.session = Session(engine, cache_bytes=self.cache_bytes)
        path = getattr(getattr(engine, "file", None), "path", None)
        self.model_path = str(path) if path else None
        if not self.model_id:
            self.model_id = os.path.basename(self.model_path) if self.model_path else "tightfit"
        self.ready.set()

    def model_names(self) -> set[str]:
        names = {self.model_id}
        if self.model_path:
            names |= {self.model_path, os.path.basename(self.model_path)}
        return names


def create_app(engine: Any = None, *, loader: Callable[[], Any] | None = None,
               model_id: str | None = None, api_key: str | None = None, queue_size: int = 64,
               cache_bytes: int = DEFAULT_CACHE_BYTES,
               on_load_error: Callable[[str], None] | None = None) -> FastAPI:
    """`engine`: a loaded Engine; or `loader`: a callable returning one, run in the background."""
    if (engine is None) == (loader is None):
        raise ValueError("give exactly one of engine and loader")
    st = ServerState(model_id, api_key or None, queue_size, cache_bytes)

    def load() -> None:
        try:
            st.set_engine(loader())
        except Exception as e:  # noqa: BLE001 - reported on /health and to the command
            st.load_error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            log.error("loading the model failed: %s", st.load_error)
            if on_load_error is not None:
                on_load_error(st.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.scheduler = Scheduler(queue_size, on_change=st.stats.queue_changed)
        if engine is not None:
            st.set_engine(engine)
        else:
            threading.Thread(target=load, name="tightfit-loader", daemon=True).start()
        try:
            yield
        finally:
            st.scheduler.close()

    app = FastAPI(title="tightfit", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.tightfit = st

    # ---- errors -------------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(UserError)
    async def _user_error(request: Request, e: UserError):
        return JSONResponse(ApiError(400, str(e)).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = "not found: " + request.url.path if e.status_code == 404 else str(e.detail)
        return JSONResponse(ApiError(e.status_code, msg).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        return JSONResponse(ApiError(400, f"invalid request: {e.errors()[:1]}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(ApiError(500, f"internal error: {type(e).__name__}: {e}").body(),
                            status_code=500)

    app.add_middleware(_Guard, state=st)

    # ---- routes -------------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if st.ready.is_set():
            return {"status": "ok"}
        return _not_ready(st)

    @app.get("/metrics")
    async def get_metrics():
        return Response(metrics.render(st.registry), media_type=metrics.CONTENT_TYPE)

    @app.get("/models")
    @app.get("/v1/models")
    async def models():
        meta = None
        if st.ready.is_set():
            c = st.engine.config
            meta = {"vocab_type": 2, "n_vocab": c.n_vocab, "n_ctx_train": c.n_ctx_train,
                    "n_embd": c.n_embd, "n_ctx": st.engine.n_ctx}
        mid = st.model_id or "loading"
        return {"object": "list",
                "data": [{"id": mid, "object": "model", "created": st.created,
                          "owned_by": "tightfit", "meta": meta}]}

    @app.get("/props")
    async def props():
        eng = st.engine
        spec = getattr(eng, "spec", None)      # a SpeculativeEngine (tightfit serve --spec)
        speculative = None if spec is None else {
            "drafters": list(spec.drafters), "n_max": spec.max_draft,
            "verifier": type(eng.verifier).__name__}
        return {"model_path": st.model_path, "model_alias": st.model_id, "total_slots": 1,
                "n_ctx": eng.n_ctx, "chat_template": eng.chat_template or "",
                "speculative": speculative,
                "default_generation_settings": {"n_ctx": eng.n_ctx}}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        r = schemas.validate(schemas.TokenizeRequest, await request.body())
        tok = st.engine.tokenizer
        ids = await run_in_threadpool(tok.encode, r.content, r.add_special, r.parse_special)
        if not r.with_pieces:
            return {"tokens": ids}
        out = []
        for i in ids:
            b = tok.token_to_piece(i)
            try:
                piece: Any = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": i, "piece": piece})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        r = schemas.validate(schemas.DetokenizeRequest, await request.body())
        return {"content": st.engine.tokenizer.decode(st.engine.check_ids(r.tokens))}

    @app.post("/apply-template")
    async def apply_template(request: Request):
        r = schemas.validate(schemas.ApplyTemplateRequest, await request.body())
        prompt = await run_in_threadpool(
            st.engine.render_chat, r.messages, r.tools, r.add_generation_prompt,
            **(r.chat_template_kwargs or {}))
        return {"prompt": prompt}

    @app.post("/chat/completions")
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _chat_completion(st, request)

    @app.post("/completions")
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _text_completion(st, request)

    return app


_MODEL_ROUTES = {"/tokenize", "/detokenize", "/apply-template", "/chat/completions",
                 "/v1/chat/completions", "/completions", "/v1/completions", "/props"}


class _Guard:
    """API key (all routes but the public ones) and readiness (model routes) checks, as a plain
    ASGI middleware so that streaming responses and disconnects pass through untouched."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.st = state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope.get("path", "")
            resp = None
            if path not in PUBLIC and self.st.api_key is not None \
                    and not _authorized(Request(scope), self.st.api_key):
                resp = JSONResponse(ApiError(401, "invalid or missing API key").body(), status_code=401)
            elif path in _MODEL_ROUTES and not self.st.ready.is_set():
                resp = _not_ready(self.st)
            if resp is not None:
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def _not_ready(st: ServerState) -> JSONResponse:
    if st.load_error:
        e = ApiError(500, f"the model failed to load: {st.load_error}")
    else:
        e = ApiError(503, "Loading model", headers={"Retry-After": str(RETRY_AFTER_S)})
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _authorized(request: Request, key: str) -> bool:
    got = request.headers.get("authorization", "")
    if got.lower().startswith("bearer "):
        got = got[7:].strip()
    else:
        got = request.headers.get("x-api-key", "")
    return bool(got) and hmac.compare_digest(got.encode(), key.encode())


# ---- generation routes -------------------------------------------------------------------------

FINGERPRINT = "tightfit"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _check_model(st: ServerState, name: str | None) -> None:
    if name and name not in st.model_names():
        raise ApiError(404, f"model {name!r} not found; this server serves {st.model_id!r}")


def _context_check(st: ServerState, n_prompt: int, limit: int | None) -> None:
    try:
        st.session.check_request(n_prompt, limit)
    except UserError as e:
        raise ApiError(400, str(e), type_="exceed_context_size_error",
                       extra={"n_prompt_tokens": n_prompt, "n_ctx": st.engine.n_ctx}) from None


def _submit(st: ServerState, ids: list[int], limit, sampling, stops, checkpoints):
    session, stats = st.session, st.stats

    def run(should_stop):
        last = None
        for ev in session.generate(ids, max_tokens=limit, sampling=sampling, stop=stops,
                                   should_stop=should_stop, checkpoints=checkpoints):
            last = ev
            yield ev
        if last is not None:
            stats.record(last.timings, len(ids), cancelled=last.finish_reason == "cancelled")

    try:
        return st.scheduler.submit(run)
    except QueueFull as e:
        stats.rejected()
        raise ApiError(503, f"the server is busy ({e}); retry later",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except SchedulerClosed as e:
        raise ApiError(503, str(e)) from None


def _as_api_error(e: BaseException) -> ApiError:
    from tightfit.runtime.state import NonFiniteError
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UserError) and not isinstance(e, NonFiniteError):
        return ApiError(400, str(e))
    log.error("generation failed: %s: %s", type(e).__name__, e)
    return ApiError(500, f"generation failed: {type(e).__name__}: {e}")


async def _watch_disconnect(request: Request, job) -> None:
    try:
        while True:
            msg = await request.receive()
            if msg.get("type") == "http.disconnect":
                job.cancel()
                return
    except Exception:  # noqa: BLE001 - the watcher only ever cancels
        return


async def _collect(request: Request, job) -> list:
    """All events of a job (non-streamed response); a client disconnect cancels it."""
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    events = []
    try:
        async for ev in job.events():
            events.append(ev)
    except Exception as e:  # noqa: BLE001
        raise _as_api_error(e) from None
    finally:
        watcher.cancel()
        job.cancel()
    return events


def _sse_data(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def _sse(gen) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream", headers=_SSE_HEADERS)


async def _chat_completion(st: ServerState, request: Request):
    from tightfit.tokenizer.parse import prompt_opens_thinking
    req = schemas.validate(schemas.ChatRequest, await request.body())
    _check_model(st, req.model)
    schemas.check_unsupported(req)
    if not req.messages:
        raise ApiError(400, "messages must be a non-empty list")
    sampling = schemas.sampling_params(req)
    limit = schemas.max_tokens(req)
    stops = schemas.stop_list(req)
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    prompt = await run_in_threadpool(st.session.prepare_chat, req.messages, tools,
                                     schemas.template_kwargs(req))
    n_prompt = len(prompt.ids)
    _context_check(st, n_prompt, limit)
    thinking = prompt_opens_thinking(prompt.text) and req.reasoning_format != "none"
    asm = schemas.ChatAssembler(thinking, tools)
    job = _submit(st, prompt.ids, limit, sampling, stops, [prompt.boundary] if prompt.boundary else [])
    base = {"id": new_id("chatcmpl-"), "created": int(time.time()), "model": st.model_id,
            "system_fingerprint": FINGERPRINT}
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream:
        return _sse(_chat_stream(job, asm, base, n_prompt, include_usage))
    events = await _collect(request, job)
    last = events[-1]
    for ev in events:
        asm.feed(ev.text)
    asm.finish()
    return {**base, "object": "chat.completion",
            "choices": [{"index": 0, "message": asm.message(),
                         "finish_reason": asm.finish_reason(last.finish_reason)}],
            "usage": schemas.usage(n_prompt, last.timings), "timings": last.timings.as_dict()}


async def _chat_stream(job, asm, base, n_prompt: int, include_usage: bool):
    base = {**base, "object": "chat.completion.chunk"}

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        return _sse_data({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                          **extra})

    try:
        yield chunk({"role": "assistant", "content": None})
        last = None
        async for ev in job.events():
            last = ev
            for d in asm.feed(ev.text):
                yield chunk(d)
        for d in asm.finish():
            yield chunk(d)
        if last is None or last.finish_reason == "cancelled":
            return
        t = last.timings
        yield chunk({}, asm.finish_reason(last.finish_reason), timings=t.as_dict())
        if include_usage:
            yield _sse_data({**base, "choices": [], "usage": schemas.usage(n_prompt, t),
                             "timings": t.as_dict()})
        yield "data: [DONE]\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield _sse_data(_as_api_error(e).body())
    finally:
        job.cancel()


async def _text_completion(st: ServerState, request: Request):
    req = schemas.validate(schemas.CompletionRequest, await request.body())
    _check_model(st, req.model)
    schemas.check_unsupported(req)
    sampling = schemas.sampling_params(req)
    limit = schemas.max_tokens(req)
    stops = schemas.stop_list(req)
    prompt = schemas.completion_prompt(req)
    if isinstance(prompt, str):
        ids = await run_in_threadpool(st.engine.encode_prompt, prompt)
    else:
        ids = st.engine.encode_prompt(prompt)
    _context_check(st, len(ids), limit)
    job = _submit(st, ids, limit, sampling, stops, [])
    base = {"id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
            "model": st.model_id, "system_fingerprint": FINGERPRINT}
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream:
        return _sse(_text_stream(job, base, len(ids), include_usage))
    events = await _collect(request, job)
    last = events[-1]
    return {**base, "choices": [{"text": "".join(ev.text for ev in events), "index": 0,
                                 "logprobs": None, "finish_reason": _finish(last.finish_reason)}],
            "usage": schemas.usage(len(ids), last.timings), "timings": last.timings.as_dict()}


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


async def _text_stream(job, base, n_prompt: int, include_usage: bool):
    def chunk(text: str, finish: str | None = None, **extra) -> str:
        return _sse_data({**base, "choices": [{"text": text, "index": 0, "logprobs": None,
                                               "finish_reason": finish}], **extra})

    try:
        last = None
        async for ev in job.events():
            last = ev
            if ev.finish_reason is None and ev.text:
                yield chunk(ev.text)
        if last is None or last.finish_reason == "cancelled":
            return
        t = last.timings
        yield chunk(last.text, _finish(last.finish_reason), timings=t.as_dict())
        if include_usage:
            yield _sse_data({**base, "choices": [], "usage": schemas.usage(n_prompt, t),
                             "timings": t.as_dict()})
        yield "data: [DONE]\n\n"
    except Exception as e:  # noqa: BLE001
        yield _sse_data(_as_api_error(e).body())
    finally:
        job.cancel()


# ---- running in a thread (tests, embedding) -----------------------------------------------------

class ServerThread:
    """Serve `app` with uvicorn on a background thread, on a free port of 127.0.0.1 by default.

        with ServerThread(app) as srv:
            httpx.get(srv.url + "/health")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import socket

        import uvicorn
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="tightfit-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServerThread":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)
