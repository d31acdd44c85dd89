"""Fault injection for the look-alike engines: crash, hang, slow down, fail, drop, refuse.

Faults are set at start-up (`--fault-*` flags, see `add_fault_arguments`) or while running with
`POST /admin/faults` and a JSON body of `FaultConfig` fields (the body replaces the whole set, so
`{}` clears every fault; `GET /admin/faults` shows it). With `--api-key` both need the bearer key.

What each fault does to the engine's HTTP surface:

- `exit_after_requests` N: generation request N+1 crashes the engine: every open connection is
  dropped and the port refuses connections (the CLI process exits with status 70).
- `exit_at_s` T: the same crash T seconds (real time) after the faults were set.
- `hang`: every request (but /admin/faults) is accepted and never answered.
- `slow_factor` k: every engine step takes k times as long.
- `error_status` and `error_rate`: that share of generation requests (a seeded draw) is answered
  with 500, 503 or 429 in an OpenAI-style error body (Retry-After: 1 with 429 and 503).
- `drop_after_tokens` K: a streamed answer loses its connection after K events.
- `refuse_s` T: the listening socket is closed for T seconds (idle connections too): new
  connections are refused, requests already running finish.
- `slow_start_factor` k: the cold start takes k times as long (start-up flag only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, fields

from aiohttp import web

from fake_engines.driver.serving import bind_socket, json_body
from flotilla.errors import ConfigError

log = logging.getLogger(__name__)

ERROR_STATUSES = (429, 500, 503)
GENERATION_SUFFIXES = ("/completions", "/completion", "/api/chat")
ADMIN_PATH = "/admin/faults"
CRASH_EXIT_STATUS = 70


class FaultConfigError(ConfigError):
    """A fault setting is invalid; `field` names it."""


@dataclass
class FaultConfig:
    """The faults switched on (defaults: none)."""

    exit_after_requests: int | None = None
    """Crash when generation request number N+1 arrives."""
    exit_at_s: float | None = None
    """Crash this many real seconds after the faults were set."""
    hang: bool = False
    """Accept every request and never answer."""
    slow_factor: float = 1.0
    """Multiplier on every engine step's duration."""
    error_status: int = 500
    """Status of injected errors: 429, 500 or 503."""
    error_rate: float = 0.0
    """Share of generation requests answered with `error_status`, in [0, 1]."""
    drop_after_tokens: int | None = None
    """Streamed answers lose their connection after this many events."""
    refuse_s: float | None = None
    """Close the listening socket for this many real seconds."""
    slow_start_factor: float = 1.0
    """Multiplier on the cold start."""
    seed: int = 0
    """Seed of the error draw."""

    def __post_init__(self) -> None:
        for name in ("exit_after_requests", "drop_after_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise FaultConfigError(name, value, "must be an integer >= 0")
        for name in ("exit_at_s", "refuse_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise FaultConfigError(name, value, "must be a number >= 0")
        for name in ("slow_factor", "slow_start_factor"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) > 0:
                raise FaultConfigError(name, getattr(self, name), "must be > 0")
        if self.error_status not in ERROR_STATUSES:
            raise FaultConfigError("error_status", self.error_status, f"must be one of {ERROR_STATUSES}")
        if not isinstance(self.error_rate, (int, float)) or not 0 <= self.error_rate <= 1:
            raise FaultConfigError("error_rate", self.error_rate, "must be in [0, 1]")
        if not isinstance(self.hang, bool):
            raise FaultConfigError("hang", self.hang, "must be a boolean")

    @classmethod
    def from_mapping(cls, data: object) -> FaultConfig:
        if not isinstance(data, dict):
            raise FaultConfigError("body", type(data).__name__, "must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise FaultConfigError(unknown[0], data[unknown[0]], f"unknown fault; known: {', '.join(sorted(known))}")
        return cls(**data)


def is_generation(path: str) -> bool:
    return path.endswith(GENERATION_SUFFIXES)


class FaultInjector:
    """The faults of one engine and the hooks that apply them."""

    def __init__(self, config: FaultConfig | None = None, api_key: str | None = None,
                 exit_process: bool = False) -> None:
        self.api_key = api_key
        self.exit_process = exit_process
        """Crash by ending the process (the CLI), not just its connections (in-process tests)."""
        self.runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.crashed = False
        self.generation_requests = 0
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task] = set()
        """Background fault tasks, referenced so they are not collected mid-way."""
        self.busy: set[asyncio.BaseTransport | None] = set()
        """Connections with a request being answered (refusing lets those finish)."""
        self.config = FaultConfig()
        self.rng = random.Random(0)
        self.initial = config or FaultConfig()
        """Faults armed once the engine listens (the start-up flags)."""

    def attach(self, runner: web.AppRunner, host: str, port: int) -> None:
        """The engine listens now: arm the faults that act on its socket."""
        self.runner, self.host, self.port = runner, host, port
        self.apply(self.initial)

    def apply(self, config: FaultConfig) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        self.config, self.rng, self.generation_requests = config, random.Random(config.seed), 0
        loop = asyncio.get_running_loop()
        if config.exit_at_s is not None:
            self._timers.append(loop.call_later(config.exit_at_s, self.crash))
        if config.refuse_s is not None:
            self._spawn(self.refuse(config.refuse_s))

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def scale_step(self, step_time_s: Callable[..., float]) -> Callable[..., float]:
        """`step_time_s` stretched by the live slow factor."""
        return lambda batch: step_time_s(batch) * self.config.slow_factor

    def crash(self) -> None:
        if self.exit_process:
            log.error("fault injection: crashing")
            os._exit(CRASH_EXIT_STATUS)
        self.crashed = True
        if self.runner is None:
            return
        for site in list(self.runner.sites):
            self._spawn(site.stop())
        for handler in self.runner.server.connections if self.runner.server else ():
            handler.force_close()

    async def refuse(self, seconds: float) -> None:
        if self.runner is None:
            return
        for site in list(self.runner.sites):
            await site.stop()
        for handler in self.runner.server.connections if self.runner.server else ():
            # Idle keep-alive connections go now; busy ones once their answer is out.
            handler.close() if handler.transport in self.busy else handler.force_close()
        await asyncio.sleep(seconds)
        if not self.crashed and not self.runner.sites:
            await web.SockSite(self.runner, bind_socket(self.host, self.port)).start()

    def draws_error(self) -> bool:
        return self.config.error_rate > 0 and self.rng.random() < self.config.error_rate

    def authorized(self, request: web.Request) -> bool:
        return not self.api_key or request.headers.get("Authorization") == f"Bearer {self.api_key}"


FAULTS_KEY = web.AppKey("faults", FaultInjector)


def error_answer(status: int) -> web.Response:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    kind = {429: "RateLimitError", 500: "InternalServerError", 503: "ServiceUnavailableError"}[status]
    return json_body({"error": {"message": f"injected fault: {status}", "type": kind, "param": None,
                                "code": status}}, status, headers=headers)


@web.middleware
async def fault_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    faults = request.app[FAULTS_KEY]
    if request.path == ADMIN_PATH:
        return await handler(request)
    if faults.crashed:  # a request on a connection opened before the crash
        if request.transport is not None:
            request.transport.close()
        raise asyncio.CancelledError
    if faults.config.hang:
        await asyncio.Future()  # cancelled when the client goes away
    faults.busy.add(request.transport)
    try:
        return await _apply(faults, request, handler)
    finally:
        faults.busy.discard(request.transport)


async def _apply(faults: FaultInjector, request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    if is_generation(request.path):
        faults.generation_requests += 1
        limit = faults.config.exit_after_requests
        if limit is not None and faults.generation_requests > limit:
            faults.crash()
            raise asyncio.CancelledError
        if faults.draws_error():
            return error_answer(faults.config.error_status)
    return await handler(request)


async def _drop_stream_hook(request: web.Request, response: web.StreamResponse) -> None:
    """Cut a streamed answer after `drop_after_tokens` events by wrapping its writer."""
    limit = request.app[FAULTS_KEY].config.drop_after_tokens
    if limit is None or not response.content_type == "text/event-stream":
        return
    write = response.write
    sent = 0

    async def counting_write(data: bytes) -> None:
        nonlocal sent
        if sent >= limit and request.transport is not None:
            request.transport.close()
            raise ConnectionResetError("injected fault: connection dropped mid-stream")
        sent += data.count(b"data: ")
        await write(data)

    response.write = counting_write  # type: ignore[method-assign, assignment]


async def get_faults(request: web.Request) -> web.Response:
    faults = request.app[FAULTS_KEY]
    if not faults.authorized(request):
        return json_body({"error": "Unauthorized"}, 401)
    return json_body({**asdict(faults.config), "generation_requests": faults.generation_requests})


async def set_faults(request: web.Request) -> web.Response:
    faults = request.app[FAULTS_KEY]
    if not faults.authorized(request):
        return json_body({"error": "Unauthorized"}, 401)
    try:
        config = FaultConfig.from_mapping(json.loads(await request.read() or b"{}"))
    except (ValueError, TypeError) as exc:
        return json_body({"error": {"message": str(exc), "type": "BadRequestError", "param": None,
                                    "code": 400}}, 400)
    faults.apply(config)
    return json_body(asdict(config))


def install(app: web.Application, injector: FaultInjector, step_owners: list) -> None:
    """Hook `injector` into an engine app before it starts; `step_owners` are its LiveDrivers."""
    app[FAULTS_KEY] = injector
    app.middlewares.insert(0, fault_middleware)
    app.on_response_prepare.append(_drop_stream_hook)
    app.router.add_get(ADMIN_PATH, get_faults, allow_head=False)
    app.router.add_post(ADMIN_PATH, set_faults)
    for driver in step_owners:
        driver.step_time_s = injector.scale_step(driver.step_time_s)


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("fault injection (see also POST /admin/faults)")
    g.add_argument("--fault-exit-after-requests", type=int, default=None, metavar="N",
                   help="crash when generation request number N+1 arrives")
    g.add_argument("--fault-exit-at-s", type=float, default=None, metavar="T",
                   help="crash T real seconds after start")
    g.add_argument("--fault-hang", action="store_true", help="accept every request and never answer")
    g.add_argument("--fault-slow-factor", type=float, default=1.0, metavar="K",
                   help="multiply every engine step's duration by K")
    g.add_argument("--fault-error-status", type=int, default=500, choices=ERROR_STATUSES,
                   help="status of injected errors")
    g.add_argument("--fault-error-rate", type=float, default=0.0,
                   help="share of generation requests answered with --fault-error-status, in [0, 1]")
    g.add_argument("--fault-drop-after-tokens", type=int, default=None, metavar="K",
                   help="streamed answers lose their connection after K events")
    g.add_argument("--fault-refuse-s", type=float, default=None, metavar="T",
                   help="close the listening socket for T real seconds")
    g.add_argument("--fault-slow-start-factor", type=float, default=1.0, metavar="K",
                   help="multiply the cold start by K")
    g.add_argument("--fault-seed", type=int, default=0, help="seed of the error draw")


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(
        exit_after_requests=args.fault_exit_after_requests, exit_at_s=args.fault_exit_at_s,
        hang=args.fault_hang, slow_factor=args.fault_slow_factor, error_status=args.fault_error_status,
        error_rate=args.fault_error_rate, drop_after_tokens=args.fault_drop_after_tokens,
        refuse_s=args.fault_refuse_s, slow_start_factor=args.fault_slow_start_factor, seed=args.fault_seed)
