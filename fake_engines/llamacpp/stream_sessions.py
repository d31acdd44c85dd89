"""Resumable streams: a request with `X-Conversation-Id` keeps its SSE bytes in a session.

As llama.cpp's server-stream.cpp: the streamed answer of a request carrying the header is kept
(and the generation goes on if the client leaves, only a stop ends it); GET /v1/stream?conv_id=ID
&from=N replays the bytes from offset N and follows the live ones until the answer ends;
DELETE /v1/stream?conv_id=ID stops the generation and forgets the session (204, idempotent);
POST /v1/streams/lookup {"conversation_ids": [...]} lists the sessions of those ids (and of
"ID::model" variants). A request that fails before streaming leaves no session. Sessions are
forgotten 300 s after they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from fake_engines.driver.serving import SSE_MIRROR, json_body
from fake_engines.llamacpp.errors import LlamaError

TTL_S = 300
HEADER = "X-Conversation-Id"


@dataclass
class StreamSession:
    """One conversation's buffered stream."""

    conversation_id: str
    buffer: bytearray = field(default_factory=bytearray)
    done: bool = False
    cancelled: bool = False
    streamed: bool = False
    """Some bytes went through the mirror (a request that failed before streaming has none)."""
    started_at: int = field(default_factory=lambda: int(time.time()))
    completed_at: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def mirror(self, data: bytes) -> bool:
        """write_sse's SSE_MIRROR: keep the bytes; False once the session is stopped."""
        if self.cancelled:
            return False
        self.streamed = True
        self.buffer += data
        self._wake()
        return True

    def finalize(self) -> None:
        if not self.done:
            self.done = True
            self.completed_at = int(time.time())
            self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def lookup_row(self) -> dict:
        return {"conversation_id": self.conversation_id, "is_done": self.done, "total_bytes": len(self.buffer),
                "started_at": self.started_at, "completed_at": self.completed_at}


class StreamSessions:
    """The sessions of one server."""

    def __init__(self) -> None:
        self.sessions: dict[str, StreamSession] = {}

    def _expire(self) -> None:
        cutoff = time.time() - TTL_S
        for cid in [c for c, s in self.sessions.items() if s.done and s.completed_at < cutoff]:
            del self.sessions[cid]

    def create_or_replace(self, conversation_id: str) -> StreamSession:
        old = self.sessions.get(conversation_id)
        if old is not None:
            old.cancelled = True
            old.finalize()
        session = self.sessions[conversation_id] = StreamSession(conversation_id)
        return session

    def get(self, conversation_id: str) -> StreamSession | None:
        self._expire()
        return self.sessions.get(conversation_id)

    def evict(self, conversation_id: str, session: StreamSession | None = None) -> None:
        if session is None or self.sessions.get(conversation_id) is session:
            self.sessions.pop(conversation_id, None)

    def evict_and_cancel(self, conversation_id: str) -> None:
        session = self.sessions.pop(conversation_id, None)
        if session is not None:
            session.cancelled = True
            session.finalize()


SESSIONS_KEY = web.AppKey("llama_stream_sessions", StreamSessions)


@web.middleware
async def keep_sessions(request: web.Request, handler):
    """A POST carrying X-Conversation-Id streams into a session and outlives its client."""
    conv_id = request.headers.get(HEADER, "")
    if request.method != "POST" or not conv_id:
        return await handler(request)
    sessions = request.app[SESSIONS_KEY]
    session = sessions.create_or_replace(conv_id)
    request[SSE_MIRROR] = session.mirror
    task = asyncio.get_running_loop().create_task(handler(request))

    def close(_: asyncio.Task) -> None:
        if session.streamed:
            session.finalize()
        else:  # failed before streaming: nothing to replay
            sessions.evict(conv_id, session)

    task.add_done_callback(close)
    return await asyncio.shield(task)  # a client leaving does not cancel it; DELETE /v1/stream does


def conv_id_of(request: web.Request) -> str:
    """The `conv_id` query parameter of /v1/stream (the router reads it the same way); 400 without one."""
    conv_id = request.query.get("conv_id", "")
    if not conv_id:
        raise LlamaError(400, "Missing conversation id in path")
    return conv_id


async def replay(request: web.Request) -> web.StreamResponse:
    """GET /v1/stream?conv_id=ID&from=N: the bytes from N, then the live ones until the end."""
    session = request.app[SESSIONS_KEY].get(conv_id_of(request))
    if session is None:
        raise LlamaError(404, "Stream not found or expired")
    try:
        offset = int(request.query.get("from") or 0)
        if offset < 0:
            raise ValueError
    except ValueError:
        raise LlamaError(400, "Invalid 'from' offset") from None
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    with contextlib.suppress(ConnectionResetError):
        await response.prepare(request)
        while True:
            if offset < len(session.buffer):
                chunk = bytes(session.buffer[offset:])
                offset += len(chunk)
                await response.write(chunk)
                continue
            if session.done:
                break
            await session.changed.wait()
        await response.write_eof()
    return response


async def lookup(request: web.Request) -> web.Response:
    """POST /v1/streams/lookup: the sessions of the ids asked for (exact or `ID::model`)."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        return json_body({"error": {"message": f"invalid body: {exc}", "type": "invalid_request_error"}}, 400)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    wanted = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
    sessions = request.app[SESSIONS_KEY]
    sessions._expire()
    rows = [s.lookup_row() for rid in wanted for cid, s in sessions.sessions.items()
            if cid == rid or cid.startswith(rid + "::")]
    return json_body(rows)


async def stop(request: web.Request) -> web.Response:
    """DELETE /v1/stream?conv_id=ID: stop the generation and forget the session."""
    request.app[SESSIONS_KEY].evict_and_cancel(conv_id_of(request))
    return web.Response(status=204, content_type="application/json")


def install(app: web.Application) -> None:
    """Sessions, their middleware and the three stream routes on a single-model app."""
    app[SESSIONS_KEY] = StreamSessions()
    app.middlewares.append(keep_sessions)
    app.router.add_get("/v1/stream", replay)
    app.router.add_post("/v1/streams/lookup", lookup)
    app.router.add_delete("/v1/stream", stop)
