"""Admin API: list, add and drain backends. Needs a bearer token; disabled without one.

With `--workers N` each change is also written to the workers' shared journal
(proxy/workers.py `AdminJournal`), so every worker's pool takes it, whichever worker served it."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Protocol
from urllib.parse import urlsplit

from aiohttp import web

from proxy.config import ConfigError, backend_from_mapping
from proxy.errors import ProxyError
from proxy.pool import Backend, BackendPool
from proxy.request_parse import load_json_object

MAX_WEIGHT = 1e6
"""Largest backend weight the admin API takes (a relative capacity: far past any real ratio)."""


def backend_json(b: Backend) -> dict:
    return {"url": b.url, "flavor": b.spec.flavor, "weight": b.spec.weight, "state": b.state.value,
            "source": b.source, "models": sorted(b.models), "in_flight": b.in_flight,
            "circuit": b.breaker.state.value}


def header_bytes(value: str) -> bytes:
    """A header value as the bytes that arrived: aiohttp keeps bytes that are not UTF-8 as
    surrogates, which a plain .encode() refuses."""
    return value.encode("utf-8", "surrogateescape")


def check_backend_body(body: dict) -> None:
    """400 naming the field for a new backend's JSON of the wrong shape (types only: the values
    themselves are BackendSpec's to check)."""
    for name in ("url", "flavor"):
        if name in body and not isinstance(body[name], str):
            raise ProxyError(400, f"'{name}' must be a string.", param=name)
    try:
        urlsplit(body.get("url", ""))
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise ProxyError(400, f"'url' is not a URL: {exc}.", param="url") from None
    models = body.get("models")
    if models is not None and not isinstance(models, str) and not (
            isinstance(models, list) and all(isinstance(m, str) for m in models)):
        raise ProxyError(400, "'models' must be a string or an array of strings.", param="models")
    weight = body.get("weight", 1.0)
    # Compared, never converted: float() of a 400-digit int overflows; NaN and inf fail the range.
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
        raise ProxyError(400, f"'weight' must be a number in (0, {MAX_WEIGHT:g}].", param="weight")


def check_token(request: web.Request, token: str | None) -> None:
    if token is None:
        raise ProxyError(403, "The admin API is disabled: start the proxy with --admin-token "
                              "(or FLOTILLA_ADMIN_TOKEN).")
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(header_bytes(value.strip()), token.encode()):
        raise ProxyError(401, "A valid bearer token is required.", headers={"WWW-Authenticate": "Bearer"})


class SharedChanges(Protocol):
    """Where this worker's admin changes meet the other workers' (proxy/workers.py)."""

    def held(self) -> AbstractContextManager[None]:
        """Exclusive across the workers, with every earlier change of theirs applied here."""

    def record(self, change: dict) -> None:
        """`change` was applied here (inside `held`): the others apply it too."""

    def catch_up(self) -> None:
        """Apply the changes the other workers made since the last call."""


class AdminApi:
    def __init__(self, pool: BackendPool, token: str | None,
                 on_added: Callable[[Backend], Awaitable[None]]) -> None:
        self.pool = pool
        self.token = token
        self.on_added = on_added
        """Called for a new backend (an immediate health probe, so it need not wait a round)."""
        self.shared: SharedChanges | None = None
        """The other workers' changes (set by proxy/workers.py); None in a single process."""

    def _changing(self) -> AbstractContextManager[None]:
        return self.shared.held() if self.shared is not None else contextlib.nullcontext()

    def _record(self, change: dict) -> None:
        if self.shared is not None:
            self.shared.record(change)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/admin/backends", self.list), web.post("/admin/backends", self.add),
                web.delete("/admin/backends", self.remove)]

    async def list(self, request: web.Request) -> web.Response:
        check_token(request, self.token)
        if self.shared is not None:
            self.shared.catch_up()
        return web.json_response({"backends": [backend_json(b) for b in self.pool]})

    async def add(self, request: web.Request) -> web.Response:
        check_token(request, self.token)
        body = load_json_object(await request.read())
        check_backend_body(body)
        try:
            spec = backend_from_mapping(body)
        except ConfigError as exc:
            raise ProxyError(400, str(exc), param=exc.field) from None
        except (ValueError, TypeError) as exc:  # a shape check_backend_body let through
            raise ProxyError(400, f"Invalid backend: {exc}") from None
        with self._changing():
            backend = self.pool.add(spec, source="admin")
            self._record({"op": "add", "backend": body})
        await self.on_added(backend)
        return web.json_response(backend_json(backend), status=201)

    async def remove(self, request: web.Request) -> web.Response:
        check_token(request, self.token)
        url = request.query.get("url")
        if url is None:
            url = load_json_object(await request.read()).get("url")
        if not isinstance(url, str):
            raise ProxyError(400, "Name the backend to remove: ?url=... or {\"url\": ...}.", param="url")
        with self._changing():
            backend = self.pool.drain(url)
            if backend is None:
                raise ProxyError(404, f"No backend {url!r} in the pool.", param="url")
            self._record({"op": "drain", "url": url})
        return web.json_response(backend_json(backend))

