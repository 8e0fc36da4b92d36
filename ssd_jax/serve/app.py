"""The HTTP layer: OpenAI's GET /v1/models, POST /v1/completions and POST /v1/chat/completions over an Engine.

Starlette routes, run by uvicorn (`run`; `pip install -e ".[serve]"`). Every refusal is OpenAI's JSON error object
with its status (400 bad input, 404 an unknown model or path, 429 a full queue with Retry-After, 503 shutting
down), never a traceback. Streams are server-sent events, `data: {chunk}` each, then `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import protocol
from .engine import Engine
from .job import Event, Job
from .protocol import APIError

log = logging.getLogger("ssd_jax.serve")
DISCONNECT_POLL = 1.0  # seconds between checks that a client waiting for a whole answer is still there


def model_id(pipe) -> str:
  """Returns the name the server answers to: the target as loaded (a name, or a path's last part)."""
  return os.path.basename(os.path.normpath(str(pipe.target.path)))


def _error(e: APIError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _on_api_error(request: Request, e: APIError) -> JSONResponse:
  return _error(e)


async def _on_http_error(request: Request, e: HTTPException) -> JSONResponse:
  """Starlette's own refusals (no such path, a method a path does not take) as OpenAI's error objects."""
  kind = "not_found" if e.status_code == 404 else "invalid_request_error"
  return _error(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind))


async def _read_body(request: Request):
  """Returns the request's JSON body; raises APIError (400) when it is not JSON."""
  raw = await request.body()
  try:
    return json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise protocol.invalid(f"the body is not valid JSON ({e})", code="invalid_json") from None


def _sse(obj) -> str:
  return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Server:
  """The routes' shared state: the engine, the model's name and the pipeline's tokenizer."""

  def __init__(self, engine: Engine, name: str):
    self.engine, self.name, self.tokenizer = engine, name, engine.pipe.tokenizer
    self.created = int(time.time())

  async def models(self, request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                                     "owned_by": "ssd-jax"}]})

  async def completions(self, request: Request) -> Response:
    return await self._answer(request, "completion")

  async def chat(self, request: Request) -> Response:
    return await self._answer(request, "chat")

  def _prompt_ids(self, p: protocol.Parsed) -> list[int]:
    """Returns the request's prompt ids: a chat under the model's own template, a completion's text raw."""
    try:
      if p.kind == "chat":
        return self.tokenizer.encode(self.tokenizer.render_chat(p.messages))
      ids = list(p.prompt) if isinstance(p.prompt, list) else self.tokenizer.encode_prompt(p.prompt, chat=False)
    except ValueError as e:  # a template that refuses the conversation, say
      raise protocol.invalid(str(e), "messages" if p.kind == "chat" else "prompt") from None
    if not ids:
      raise protocol.invalid("the prompt has no tokens", "prompt")
    return ids

  async def _answer(self, request: Request, kind: str) -> Response:
    p = protocol.parse(kind, await _read_body(request))
    if p.model != self.name:
      raise APIError(404, f"the model {p.model!r} does not exist; this server serves {self.name!r}",
                     "invalid_request_error", "model", "model_not_found")
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    job = self.engine.job(p, self._prompt_ids(p), lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
    self.engine.submit(job)
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    if p.stream:
      return StreamingResponse(self._stream(job, events, p, rid), media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await self._whole(request, job, events, p, rid)

  async def _whole(self, request: Request, job: Job, events: asyncio.Queue, p, rid: str) -> Response:
    """Returns the whole answer once the request ends; a client that went away meanwhile gets nothing."""
    text = []
    try:
      while True:
        try:
          ev: Event = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
        except asyncio.TimeoutError:
          if await request.is_disconnected():
            self.engine.cancel(job)
            return Response(status_code=499)
          continue
        if ev.error is not None:
          return _error(ev.error)
        text.append(ev.text)
        if ev.finish is not None:
          return JSONResponse(protocol.response(p.kind, rid, int(time.time()), self.name, "".join(text), ev.finish,
                                                ev.usage, ev.info))
    finally:
      self.engine.cancel(job)  # nothing when it ended; out of the queue or its output dropped when not

  async def _stream(self, job: Job, events: asyncio.Queue, p, rid: str):
    """Yields the answer as server-sent events. A client that goes away cancels the request (Starlette stops this
    generator, and `finally` runs)."""
    head = (p.kind, rid, int(time.time()), self.name)
    try:
      if p.kind == "chat":
        yield _sse(protocol.chunk(*head, role=True))
      while True:
        ev: Event = await events.get()
        if ev.error is not None:
          yield _sse(ev.error.body())
          break
        if ev.text or ev.finish is not None:
          yield _sse(protocol.chunk(*head, ev.text, ev.finish, ev.info if ev.finish is not None else None))
        if ev.finish is not None:
          if p.include_usage:
            yield _sse(protocol.chunk(*head, used=ev.usage))
          break
      yield "data: [DONE]\n\n"
    finally:
      self.engine.cancel(job)


def create_app(engine: Engine, name: str | None = None) -> Starlette:
  """Returns the ASGI app serving `engine`'s pipeline as `name` (default: model_id); it starts the engine when the
  server starts and stops it when the server stops."""
  server = Server(engine, name or model_id(engine.pipe))

  @contextlib.asynccontextmanager
  async def lifespan(app):
    engine.start()
    yield
    await asyncio.to_thread(engine.stop)

  routes = [Route("/v1/models", server.models, methods=["GET"]),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/chat/completions", server.chat, methods=["POST"])]
  return Starlette(routes=routes, lifespan=lifespan,
                   exception_handlers={APIError: _on_api_error, HTTPException: _on_http_error})


def make_server(app: Starlette, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
                shutdown_timeout: float | None = 60.0, **config):
  """Returns a uvicorn Server for `app`: `.run()` serves until SIGTERM or Ctrl-C (answers in flight get up to
  shutdown_timeout seconds to finish), `.should_exit = True` stops it from another thread. config: more of
  uvicorn.Config's options (log_config=None leaves logging as the caller set it up)."""
  import uvicorn

  config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=shutdown_timeout, **config)
  return uvicorn.Server(config)
