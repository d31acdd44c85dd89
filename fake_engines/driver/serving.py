"""Thin aiohttp edges both look-alikes share: SSE writing, sockets, start-up and SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from collections.abc import AsyncGenerator, Callable

from aiohttp import web

TIME_SCALE_HEADER = "x-flotilla-time-scale"
"""Response header of both look-alikes: wall seconds per modelled second (`--time-scale`), so a
client can report modelled time. Real engines do not send it."""

log = logging.getLogger("fake_engines.driver.serving")


SSE_MIRROR: web.RequestKey[Callable[[bytes], bool]] = web.RequestKey("sse_mirror")
"""Request key of an optional `mirror(data: bytes) -> bool` that write_sse hands every event's bytes
to: with one, the stream goes on without its client (a resumable stream session keeps the bytes),
and the mirror returning False stops it as a client leaving would."""


async def write_sse(request: web.Request, headers: dict[str, str],
                    events: AsyncGenerator[dict | str | tuple[str, dict], None],
                    on_client_gone: Callable[[], None]) -> web.StreamResponse:
    """Send the status line and headers at once (first data comes at TTFT), then each event.

    A client gone mid-stream is an abort, as when aiohttp cancels the handler on a disconnect:
    a write can find the transport already closing (the client half-closed or reset before
    aiohttp noticed the connection lost), and that ConnectionResetError must not reach aiohttp,
    which would log it as a server error with a traceback. `on_client_gone` frees the request;
    the handler then returns quietly. A request with an SSE_MIRROR outlives its client."""
    mirror = request.get(SSE_MIRROR)
    response = web.StreamResponse(status=200, headers=headers)
    response.enable_chunked_encoding()
    client = True
    async with contextlib.aclosing(events):
        try:
            await response.prepare(request)
        except ConnectionResetError:
            client = False
        async for event in events if client or mirror is not None else _no_events():
            data = sse_bytes(event)
            if mirror is not None and not mirror(data):
                on_client_gone()  # the session was stopped
                break
            if client:
                try:
                    await response.write(data)
                except ConnectionResetError:
                    client = False
                    if mirror is None:
                        break
        if not client and mirror is None:
            on_client_gone()
            log.debug("client %s gone mid-stream: request aborted", request.remote)
        elif client:
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
    return response


async def _no_events() -> AsyncGenerator[dict, None]:
    return
    yield  # an async generator that yields nothing


def sse_bytes(payload: dict | str | tuple[str, dict]) -> bytes:
    """One `data: ...` event as sent, or `event: <name>` then `data: ...` for a (name, data) pair."""
    name = ""
    if isinstance(payload, tuple):
        name, payload = f"event: {payload[0]}\n", payload[1]
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=True, separators=(",", ":"))
    return f"{name}data: {data}\n\n".encode()


async def send_event(response: web.StreamResponse, payload: dict | str | tuple[str, dict]) -> None:
    """One `data: ...` event, or `event: <name>` then `data: ...` for a (name, data) pair; raises
    ConnectionResetError once the client has gone."""
    await response.write(sse_bytes(payload))


def json_body(payload: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A compact JSON response (the engines send no spaces between tokens)."""
    text = json.dumps(payload, separators=(",", ":"))
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def bind_socket(host: str, port: int, v6only: bool = False) -> socket.socket:
    """A bound TCP socket that does not listen yet: connections are refused until `listen`;
    `v6only` keeps an IPv6 socket off IPv4 (when other sockets listen on IPv4 addresses)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6only and family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError:  # port in use, an address not of this machine: the caller reports it
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def start_on_socket(app: web.Application, sock: socket.socket) -> web.AppRunner:
    """Serve `app` on a bound socket (aiohttp calls listen); handlers are cancelled when clients leave."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def install_sigterm(loop: asyncio.AbstractEventLoop, on_term: Callable[[], None]) -> None:
    """Call `on_term` on SIGTERM or SIGINT."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_term)
