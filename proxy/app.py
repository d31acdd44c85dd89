"""The proxy's aiohttp application: routes, handlers and the background loops' lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from policies.routing.base import BackendState, RoutingPolicy
from policies.routing.kv_index import KVIndex, KVIndexUser
from policies.routing.registry import create_policy
from proxy.access import AccessControl
from proxy.admin import AdminApi
from proxy.admission import Admission
from proxy.body import read_body
from proxy.config import ProxyConfig
from proxy.debug import debug_route
from proxy.dispatch import Dispatcher
from proxy.errors import ProxyError, ThrottledWarning, error_response, speaks_anthropic
from proxy.forward import new_request_id
from proxy.generation import generation_forward
from proxy.health import HealthChecker
from proxy.kv_events import KVEventsHub
from proxy.metrics import RouterMetrics
from proxy.paths import canonical_path_middleware
from proxy.pd import PrefillStage, attach_prefill
from proxy.pool import Backend, BackendPool
from proxy.pooling import POOLING_POLICY, ROUTE_FLAVORS, parse_pooling_request
from proxy.records import Forward
from proxy.reload import FleetWatcher
from proxy.request_parse import check_content_type, load_json_object
from proxy.router import Router
from proxy.scraper import Scraper
from proxy.server import ProxyRunner

log = logging.getLogger(__name__)
unexpected_warning = ThrottledWarning(log)

PROXY_KEY: web.AppKey[Proxy] = web.AppKey("proxy")


@dataclass
class Proxy:
    """Everything one running proxy holds."""

    config: ProxyConfig
    policy: RoutingPolicy
    rng: random.Random
    pool: BackendPool
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    session: aiohttp.ClientSession | None = None
    dispatcher: Dispatcher | None = None
    pooling_dispatcher: Dispatcher | None = None
    """Embeddings and rerank: their own load-aware policy (proxy/pooling.py)."""
    health: HealthChecker | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    admission: Admission | None = None
    """Per-model slots and bounded queues (see proxy/admission.py)."""
    kv_index: KVIndex = field(default_factory=KVIndex)
    """What each backend that publishes KV-cache events holds (fed by `kv_events`)."""
    kv_events: KVEventsHub | None = None
    prefill: PrefillStage | None = None
    """Disaggregated prefill/decode: the prefill pool and phase (proxy/pd.py); None: colocated."""
    """The event subscriptions; started when the policy reads the index or a backend publishes."""
    scrape_loop: Callable[[Scraper], Coroutine[Any, Any, None]] | None = None
    """Runs the scraper instead of `Scraper.run` (a worker of several: proxy/workers.py)."""
    access: AccessControl | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    """Headers every answer carries (the worker's pid, the instance id): see `add_response_header`."""
    admin: AdminApi | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             skip_auto_headers=("User-Agent", "Accept-Encoding"))
        router = Router(self.pool, self.policy, self.config.policy, self.metrics)
        self.dispatcher = Dispatcher(self.config, self.pool, router, self.session, self.metrics, self.rng)
        pooling_router = Router(self.pool, create_policy(POOLING_POLICY, rng=self.rng), POOLING_POLICY, self.metrics)
        self.pooling_dispatcher = Dispatcher(self.config, self.pool, pooling_router, self.session, self.metrics,
                                             self.rng)
        h = self.config.health
        self.health = HealthChecker(self.pool, self.session, self.metrics, h.interval_s, h.timeout_s)
        scraper = Scraper(self.pool, self.session, self.config.scrape_interval_s, self.config.scrape_timeout_s)
        if self.scrape_loop is None:
            await asyncio.gather(self.health.check_all(), scraper.scrape_all())
            loops = [self.health.run(), scraper.run()]
        else:  # one worker scrapes for all
            await self.health.check_all()
            loops = [self.health.run(), self.scrape_loop(scraper)]
        if self.prefill is not None:
            loops += await self.prefill.start(self.session)
        if isinstance(self.policy, KVIndexUser) or any(b.spec.kv_events for b in self.pool):
            loops.append(self._start_kv_events())
        if self.config.config_path is not None:
            prefill = (self.prefill.pool, self.prefill.probe_now) if self.prefill is not None else None
            loops.append(FleetWatcher(self.config.config_path, self.pool, self.config.reload_interval_s,
                                      self.probe_now, prefill).run())
        self.tasks = [asyncio.create_task(c) for c in loops]

    def _start_kv_events(self) -> Coroutine[Any, Any, None]:
        """Bind the index into a policy that reads it and subscribe to the publishers."""
        if isinstance(self.policy, KVIndexUser):
            self.policy.bind_kv_index(self.kv_index)
        self.kv_events = KVEventsHub(self.pool, self.kv_index)
        self.kv_events.register_metrics(self.metrics.registry)
        self.kv_events.sync()
        return self.kv_events.run()

    async def stop(self) -> None:
        self.metrics.flush()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.session is not None:
            await self.session.close()

    async def probe_now(self, backend: Backend) -> None:
        if self.health is not None:
            await self.health.check_one(backend)


def _proxy(request: web.Request) -> Proxy:
    return request.app[PROXY_KEY]


def upstream_target(request: web.Request) -> str:
    """The matched route's own path (never the client's bytes for it) and the query as sent."""
    query = request.rel_url.raw_query_string
    return request.path + (f"?{query}" if query else "")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def anthropic_messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API (llama-server and vLLM serve it): routed on its rendered messages."""
    return await _generate(request, chat=True, anthropic=True)


async def anthropic_count_tokens(request: web.Request) -> web.StreamResponse:
    """The prompt length of an Anthropic Messages body, answered by a backend serving the model."""
    return await _generate(request, chat=True, anthropic=True, generates=False)


async def pooling(request: web.Request) -> web.StreamResponse:
    """Embeddings and rerank: to a backend of a flavor that serves the route and the model, the
    least work in flight first (proxy/pooling.py)."""
    p = _proxy(request)
    raw, body = await generation_body(request)
    info = parse_pooling_request(body, request.path, request.headers, p.config.chars_per_token)
    flavors = ROUTE_FLAVORS[request.path]
    if flavors is not None and not any(b.spec.flavor in flavors for b in p.pool
                                       if b.state is not BackendState.DRAINING):
        raise ProxyError(404, f"No backend serves {request.path} (a route of {', '.join(sorted(flavors))} "
                              "engines).", code="route_not_found")
    if info.model is not None and p.pool.is_unknown_model(info.model):
        raise ProxyError(404, f"The model `{info.model}` does not exist.", param="model", code="model_not_found")
    fwd = Forward(method="POST", path_qs=upstream_target(request), body=raw, info=info,
                  debug=request.headers.get("x-flotilla-debug") == "1", accounts_usage=True, flavors=flavors)
    async with p.admission.slot(info.model):  # type: ignore[union-attr]  # both are set before the routes serve
        return await p.pooling_dispatcher.handle(request, fwd)  # type: ignore[union-attr]


FORWARDED_ROUTES = (web.post("/v1/completions", completions),
                    web.post("/v1/chat/completions", chat_completions),
                    web.post("/v1/messages", anthropic_messages),
                    web.post("/v1/messages/count_tokens", anthropic_count_tokens),
                    *(web.post(path, pooling) for path in ROUTE_FLAVORS))
"""The allow-list: the only routes forwarded to an engine. Any other path gets the proxy's own 404,
a served path with another method its 405 with Allow (see proxy/paths.py, docs/reliability.md)."""


def is_forwarded(request: web.Request) -> bool:
    """The request matched a route of the allow-list (not a 404 or 405, nor one the proxy answers)."""
    route = request.match_info.route
    return route.resource is not None and any(
        route.method == r.method and route.resource.canonical == r.path for r in FORWARDED_ROUTES)


async def generation_body(request: web.Request) -> tuple[bytes, dict]:
    """A generation request's body as every check reads it: the content type, Content-Encoding
    decoded within the body limit, a JSON object; ProxyError (4xx) otherwise. aiohttp keeps the
    raw bytes, so a second call reads no more from the client."""
    check_content_type(request.headers.get("Content-Type", ""))
    raw = await read_body(request, _proxy(request).config.max_body_bytes)
    return raw, load_json_object(raw)


async def _generate(request: web.Request, chat: bool, anthropic: bool = False,
                    generates: bool = True) -> web.StreamResponse:
    p = _proxy(request)
    raw, body = await generation_body(request)
    fwd = generation_forward(p.pool, p.config, p.policy, raw, body, request.headers, upstream_target(request),
                             chat, anthropic, generates)
    async with p.admission.slot(fwd.info.model):  # type: ignore[union-attr]  # both are set before the routes serve
        fwd = await with_prefill(p, fwd, request.headers, generates and not anthropic)
        return await p.dispatcher.handle(request, fwd)  # type: ignore[union-attr]


async def with_prefill(p: Proxy, fwd: Forward, headers: Mapping[str, str], prefills: bool) -> Forward:
    """P/D: run the prefill phase first and forward what decode needs; colocated: `fwd` itself."""
    if p.prefill is None or not prefills:
        return fwd
    # one X-Request-Id across both phases, as vLLM's toy proxy sends its request id to both
    request_id = headers.get("x-request-id") or new_request_id()
    return msgspec.structs.replace(await p.prefill.before_decode(fwd, headers, request_id), request_id=request_id)


async def models(request: web.Request) -> web.Response:
    """The union of every backend's models and adapters (first card seen wins)."""
    cards: dict[str, dict] = {}
    for b in _proxy(request).pool:
        if b.state is BackendState.DRAINING:
            continue
        for card in b.model_cards:
            cards.setdefault(card["id"], card)
        for name in sorted(b.spec.models):
            cards.setdefault(name, {"id": name, "object": "model", "created": 0, "owned_by": "flotilla"})
    return web.json_response({"object": "list", "data": list(cards.values())})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    pool = _proxy(request).pool
    n_ready = sum(1 for b in pool if b.state is BackendState.READY)
    if n_ready == 0:
        raise ProxyError(503, "No backend is ready yet.", headers={"Retry-After": "1"})
    return web.json_response({"status": "ready", "ready_backends": n_ready, "backends": len(pool)})


async def metrics(request: web.Request) -> web.Response:
    p = _proxy(request)
    p.metrics.refresh_pool(p.pool, time.monotonic())
    return web.Response(body=p.metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4"})


@web.middleware
async def errors_middleware(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error leaves as OpenAI-style JSON (in Anthropic's envelope on its routes), never as a
    traceback."""
    # The proxy's own answers name no backend, but still carry the header every response has.
    own = {"x-flotilla-backend": ""}
    anthropic = speaks_anthropic(request.path)
    try:
        return await handler(request)
    except ProxyError as exc:
        return error_response(exc, own, anthropic)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ProxyError(exc.status, exc.reason, headers={
            k: v for k, v in exc.headers.items() if k.lower() == "allow"}), own, anthropic)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        # One line, at most every few seconds: a request that trips a bug must not let a client
        # flood the log with tracebacks (the traceback is logged at debug level).
        unexpected_warning.warning(f"unexpected {type(exc).__name__} on {request.method} {request.path!r}: "
                                   f"{str(exc)[:200]!r}")
        log.debug("unexpected error on %s %r", request.method, request.path, exc_info=True)
        return error_response(ProxyError(500, "Internal error in the proxy."), own, anthropic)


def build_app(config: ProxyConfig, policy: RoutingPolicy | None = None,
              rng: random.Random | None = None) -> web.Application:
    """The proxy as an aiohttp app; `policy` overrides `config.policy` (tests, embedding)."""
    rng = rng if rng is not None else random.Random()
    pool = BackendPool(config.breaker)
    for spec in config.backends:
        pool.add(spec, source="file" if config.config_path else "static")
    lim = config.limits
    proxy = Proxy(config=config, policy=policy or create_policy(config.policy, rng=rng), rng=rng, pool=pool,
                  admission=Admission(lim.max_in_flight_per_model, lim.max_queued_per_model, lim.queue_timeout_s))
    proxy.prefill = attach_prefill(config, proxy.metrics, rng)
    access = proxy.access = AccessControl(lim, config.admin_token)
    app = web.Application(middlewares=[errors_middleware, canonical_path_middleware, access.middleware],
                          client_max_size=config.max_body_bytes)
    app[PROXY_KEY] = proxy
    proxy.admin = AdminApi(pool, config.admin_token, proxy.probe_now)
    app.add_routes([
        *FORWARDED_ROUTES,
        web.get("/v1/models", models), web.get("/health", health), web.get("/ready", ready),
        web.get("/metrics", metrics),
        *proxy.admin.routes(),
        debug_route(config.admin_token, lambda: {"queued": proxy.admission.queued(),  # type: ignore[union-attr]
                                                 "in_flight": sum(b.total_in_flight()[0] for b in proxy.pool)}),
    ])
    app.on_startup.append(lambda _app: proxy.start())
    app.on_cleanup.append(lambda _app: proxy.stop())
    return app


def add_response_header(app: web.Application, name: str, value: str) -> None:
    """Put `name: value` on every answer of the proxy `app`, on the fast path as on aiohttp's."""
    app[PROXY_KEY].response_headers[name] = value

    async def stamp(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers[name] = value
    stamp.static_header = True  # type: ignore[attr-defined]  # proxy/fastpath.py sends it itself
    app.on_response_prepare.append(stamp)


@dataclass
class RunningProxy:
    """A proxy listening on a socket (see `start_proxy`)."""

    app: web.Application
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def proxy(self) -> Proxy:
        return self.app[PROXY_KEY]

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_proxy(config: ProxyConfig, policy: RoutingPolicy | None = None,
                      rng: random.Random | None = None,
                      extend: Callable[[web.Application], object] | None = None,
                      sock: socket.socket | None = None) -> RunningProxy:
    """Build and serve the proxy on config.host:config.port (port 0: any free port), or on the
    listening `sock` (a worker of `flotilla proxy --workers N`).

    `extend(app)` runs before the app starts: the place to attach the autoscaler."""
    app = build_app(config, policy, rng)
    if extend is not None:
        extend(app)
    # handler_cancellation: a client that goes away cancels its handler at once, which closes
    # the upstream connection, which makes the engine abort the request.
    # ProxyRunner: per-client connection cap, header and body timeouts, and on close one
    # deadline (the shutdown grace) for in-flight requests (see proxy/server.py).
    # auto_decompress off: proxy/body.py decodes request bodies itself, within the body limit,
    # answering 415/400 instead of aiohttp's logged parser errors.
    runner = ProxyRunner(app, config.limits, fast_path=config.fast_path, handler_cancellation=True, access_log=None,
                         auto_decompress=False)
    await runner.setup()
    site: web.BaseSite = (web.SockSite(runner, sock, backlog=1024) if sock is not None else
                          web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_address=True))
    try:
        await site.start()
    except OSError:  # the port is taken: stop what startup began (the autoscaler's replicas)
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]
    return RunningProxy(app=app, runner=runner, host=config.host, port=port)
