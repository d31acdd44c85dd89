"""The floor: the least an aiohttp + uvloop proxy can do (one pooled session, one backend, no
routing, parsing, accounting or metrics). What `flotilla proxy` adds beyond it is its own cost."""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session")
BACKEND: web.AppKey[str] = web.AppKey("backend")


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    async with request.app[SESSION].post(request.app[BACKEND] + request.path, data=body,
                                         headers={"Content-Type": "application/json"}) as up:
        if up.content_type != "text/event-stream":
            return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)
        resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def ready(request: web.Request) -> web.Response:
    return web.Response()


def floor_args(description: str | None) -> argparse.Namespace:
    """Both floors' command line: where to listen, and the one backend."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True)
    return parser.parse_args()


def main() -> None:
    args = floor_args(__doc__)

    async def start(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await app[SESSION].close()

    app = web.Application()
    app[BACKEND] = args.backend
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.add_routes([web.post("/v1/completions", forward), web.get("/ready", ready)])
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = None
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
