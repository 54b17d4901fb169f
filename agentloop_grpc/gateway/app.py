"""The gateway's HTTP app (FastAPI): one base URL per session, ``/sessions/{session_id}/v1``, serving OpenAI Chat
Completions and Responses and Anthropic Messages, and the session control routes.

Routes:
    POST /sessions/{id}/v1/chat/completions | /responses | /messages   a model turn (user token)
    GET  /sessions/{id}/v1/models                                      the one model served
    POST /sessions                                                      create, with metadata (admin token)
    GET  /sessions, GET /sessions/{id}                                  list, fetch (admin token)
    POST /sessions/{id}/reward, POST /sessions/{id}/finish              reward, trajectories (admin token)
    GET  /health, GET /metrics                                          no token

Tokens: ``Authorization: Bearer <token>`` (Anthropic's SDK sends ``x-api-key``, also read). Where an admin token
is configured, session control needs it, and it is accepted everywhere; where only a user token is, it opens every
route. Errors are each API's own error JSON (the session routes use OpenAI's shape). The body is read up to
``limits.max_body_bytes`` (413 beyond), before any JSON is parsed.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .anthropic_messages import ANTHROPIC_MESSAGES
from .exchange import ChatReply, GatewayError
from .openai_chat import OPENAI_CHAT
from .openai_responses import OPENAI_RESPONSES
from .reply_events import sse_frames
from .request_body import read_json
from .service import SessionGateway
from .sessions import BAD_SESSION_ID, SessionSpec, is_session_id
from .trajectory_json import trajectory_json
from .wire import WireFormat


class RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)


def create_app(gateway: SessionGateway, user_token: str | None = None, admin_token: str | None = None) -> FastAPI:
    app = FastAPI(title="agentloop session gateway", docs_url=None, redoc_url=None, openapi_url=None)
    limits = gateway.config.limits
    metrics = gateway.metrics

    def allowed(request: Request, admin: bool) -> bool:
        sent = _token(request)
        tokens = [admin_token] if admin and admin_token else [user_token, admin_token]
        wanted = [t for t in tokens if t]
        if not wanted:
            return True
        return sent is not None and any(hmac.compare_digest(sent.encode(), t.encode()) for t in wanted)

    def refused(fmt: WireFormat, admin: bool) -> JSONResponse:
        error = GatewayError("a valid bearer token is required" + (" (the admin token)" if admin else ""),
                             status=401, kind="unauthenticated")
        return _error_response(fmt, error)

    async def turn(fmt: WireFormat, session_id: str, request: Request) -> Response:
        if not allowed(request, admin=False):
            return refused(fmt, admin=False)
        with metrics.latency.labels(fmt.name).time():
            try:
                _check_session_id(session_id)
                chat = fmt.parse(await read_json(request, limits.max_body_bytes), limits)
                events = gateway.chat_stream(session_id, chat)
                if not chat.stream:
                    reply = None
                    async for event in events:
                        reply = event
                    assert isinstance(reply, ChatReply)
                    metrics.requests.labels(fmt.name, "200").inc()
                    return JSONResponse(fmt.reply(reply))
                frames = sse_frames(fmt.writer(chat), events)
                first = await anext(frames)  # errors before the turn starts are an HTTP status, not an event
            except GatewayError as error:
                metrics.requests.labels(fmt.name, str(error.status)).inc()
                return _error_response(fmt, error)
            metrics.requests.labels(fmt.name, "200").inc()
            return StreamingResponse(_prepend(first, frames), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, request: Request) -> Response:
        return await turn(OPENAI_CHAT, session_id, request)

    @app.post("/sessions/{session_id}/v1/responses")
    async def responses(session_id: str, request: Request) -> Response:
        return await turn(OPENAI_RESPONSES, session_id, request)

    @app.post("/sessions/{session_id}/v1/messages")
    async def messages(session_id: str, request: Request) -> Response:
        return await turn(ANTHROPIC_MESSAGES, session_id, request)

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str, request: Request) -> Response:
        if not allowed(request, admin=False):
            return refused(OPENAI_CHAT, admin=False)
        return JSONResponse({"object": "list", "data": [
            {"id": gateway.config.model, "object": "model", "created": 0, "owned_by": "agentloop"}]})

    async def control(request: Request, action: Any) -> Response:
        if not allowed(request, admin=True):
            return refused(OPENAI_CHAT, admin=True)
        try:
            return JSONResponse(await action())
        except GatewayError as error:
            return _error_response(OPENAI_CHAT, error)

    @app.post("/sessions")
    async def create_session(request: Request) -> Response:
        async def action() -> dict[str, Any]:
            body = await read_json(request, limits.max_body_bytes, empty_ok=True)
            return gateway.create(_model(SessionSpec, body or {})).summary()
        return await control(request, action)

    @app.get("/sessions")
    async def list_sessions(request: Request) -> Response:
        async def action() -> dict[str, Any]:
            return {"sessions": [s.summary() for s in gateway.sessions.all()]}
        return await control(request, action)

    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        async def action() -> dict[str, Any]:
            return gateway.sessions.get(session_id).summary()
        return await control(request, action)

    @app.post("/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> Response:
        async def action() -> dict[str, Any]:
            body = _model(RewardBody, await read_json(request, limits.max_body_bytes))
            gateway.set_reward(session_id, body.reward, body.metrics)
            return gateway.sessions.get(session_id).summary()
        return await control(request, action)

    @app.post("/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        async def action() -> dict[str, Any]:
            session, trajectories = await gateway.finish(session_id)
            return {"session": session.summary(), "trajectories": [trajectory_json(t) for t in trajectories]}
        return await control(request, action)

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(request: Request, error: StarletteHTTPException) -> Response:
        """No such route or method: still the error shape of the API the path names."""
        return _error_response(wire_format_of(request.url.path), GatewayError(
            str(error.detail), status=error.status_code, kind="not_found" if error.status_code == 404
            else "invalid_request"))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    return app


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[len("bearer "):].strip()
    return request.headers.get("x-api-key")


def _check_session_id(session_id: str) -> None:
    if not is_session_id(session_id):
        raise GatewayError(BAD_SESSION_ID, status=400, param="session_id")


def _model(cls: type[BaseModel], body: Any) -> Any:
    try:
        return cls.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the body"
        raise GatewayError(f"{where}: {first['msg']}", param=where) from None


def wire_format_of(path: str) -> WireFormat:
    """Whose error shape a path's errors take: the API it names; OpenAI's for the session routes and the rest."""
    if path.endswith("/v1/messages"):
        return ANTHROPIC_MESSAGES
    return OPENAI_RESPONSES if path.endswith("/v1/responses") else OPENAI_CHAT


def refusal_body(path: str, error: GatewayError) -> bytes:
    """What the HTTP server answers in the app's stead (an unparsable or timed-out request) to ``path``."""
    return json.dumps(wire_format_of(path).error(error)).encode()


def _error_response(fmt: WireFormat, error: GatewayError) -> JSONResponse:
    headers = {"Retry-After": f"{error.retry_after_s:g}"} if error.retry_after_s is not None else None
    return JSONResponse(fmt.error(error), status_code=error.status, headers=headers)


async def _prepend(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(rest):  # a client that leaves ends the turn now, not when it is collected
        yield first
        async for frame in rest:
            yield frame
