"""The fake vLLM aiohttp application: state, app factory, and the non-generation routes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from fake_engines.core import OutputLengthSampler, decode, encode
from fake_engines.driver.chat import chat_prompt
from fake_engines.driver.live import LiveDriver
from fake_engines.driver.serving import TIME_SCALE_HEADER, json_body
from fake_engines.factory import build_engine
from fake_engines.vllm import engine
from fake_engines.vllm.config import VLLM_VERSION, VllmServeConfig
from fake_engines.vllm.errors import VllmError, parse_json_body, validation_error
from fake_engines.vllm.http_metrics import http_metrics_middleware
from fake_engines.vllm.kv_publisher import ZmqKvEventPublisher
from fake_engines.vllm.metrics import METRICS_CONTENT_TYPE, VllmMetrics
from fake_engines.vllm.shapes import model_card
from fake_engines.vllm.telemetry import VllmTelemetry

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass
class EngineUnit:
    """One data-parallel engine: its core's driver and the telemetry feeding its `engine` series."""

    driver: LiveDriver
    """Runs the core in (scaled) real time."""
    telemetry: VllmTelemetry
    """Feeds the metrics from this engine's events."""
    kv_publisher: ZmqKvEventPublisher | None = None
    """Publishes this engine's KV cache events (--kv-events-config with the zmq publisher)."""

    def load_score(self) -> int:
        """vLLM's DP load balancing score: waiting requests weigh four times running ones."""
        stats = self.driver.core.stats()
        return 4 * stats.num_waiting + stats.num_running


@dataclass
class VllmServer:
    """Everything the handlers share."""

    config: VllmServeConfig
    """Start-up flags."""
    spec: engine.VllmEngineSpec
    """The sized engine (each data-parallel engine is sized alike)."""
    engines: list[EngineUnit]
    """One per data-parallel rank (-dp), engine label "0", "1", ..."""
    metrics: VllmMetrics
    """The vllm:* families."""
    sampler: OutputLengthSampler
    """Seeded output lengths."""
    loras: dict[str, str] = field(default_factory=dict)
    """Served adapters: name -> path."""
    created: int = field(default_factory=lambda: int(time.time()))
    """Unix time the models were registered (/v1/models `created`)."""
    next_id: int = 0
    """Counter for engine request ids."""
    accepting: bool = True
    """False once SIGTERM arrived."""

    def request_id(self) -> str:
        """A new engine request id."""
        self.next_id += 1
        return f"req-{self.next_id}"

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output, as the engine resolved it (the model's context by default)."""
        return self.spec.max_model_len

    @property
    def driver(self) -> LiveDriver:
        """The first engine's driver (the only one without -dp)."""
        return self.engines[0].driver

    def pick_engine(self) -> EngineUnit:
        """The least loaded engine, lowest rank on ties (vLLM's DP load balancer)."""
        return min(self.engines, key=EngineUnit.load_score)

    async def drain(self) -> None:
        """Wait for every engine's in-flight requests."""
        for unit in self.engines:
            await unit.driver.drain()


SERVER_KEY = web.AppKey("vllm_server", VllmServer)


def build_server(config: VllmServeConfig) -> VllmServer:
    """Size the engine through the engine factory (ModelDoesNotFit propagates) and wire cores,
    drivers and metrics; the server keeps the resolved config (max_model_len, batch limits filled)."""
    built = build_engine(config)
    resolved, spec = built.config, built.spec
    assert isinstance(resolved, VllmServeConfig) and isinstance(spec, engine.VllmEngineSpec)
    config = resolved
    ranks = tuple(str(rank) for rank in range(config.data_parallel_size))
    metrics = VllmMetrics(config.model_name, spec.max_model_len,
                          engine.cache_config_labels(config, spec),
                          max_loras=config.max_loras if config.enable_lora else None, engines=ranks)
    units: list[EngineUnit] = []
    try:
        for rank in ranks:
            core = built.new_core()
            telemetry = VllmTelemetry(metrics, core, rank)
            publisher, sink = _kv_events_out(config, int(rank))
            driver = LiveDriver(core, built.step_time, config.time_scale, telemetry, kv_event_sink=sink)
            units.append(EngineUnit(driver, telemetry, publisher))
    except Exception:  # a later rank's endpoint is taken: let go of the earlier ranks' sockets
        for unit in units:
            if unit.kv_publisher is not None:
                unit.kv_publisher.close_sockets()
        raise
    sampler = OutputLengthSampler(seed=config.seed, mean_output_tokens=config.mean_output_tokens)
    return VllmServer(config, spec, units, metrics, sampler, loras=dict(config.lora_modules))


def _kv_events_out(config: VllmServeConfig, rank: int) -> tuple[ZmqKvEventPublisher | None, Callable | None]:
    """Where one engine's KV events go: a ZMQ publisher, or nowhere with the null publisher
    (vLLM still records them then); (None, None) when events are off."""
    events = config.kv_events_config
    if events is None or not events.enable_kv_cache_events:
        return None, None
    if not events.publishes:
        return None, _drop
    publisher = ZmqKvEventPublisher(events, rank)
    return publisher, publisher.publish


def _drop(events: list) -> None:
    """The null publisher."""


def create_app(config: VllmServeConfig, allow_runtime_lora: bool | None = None) -> web.Application:
    """The aiohttp app serving vLLM's routes; the driver runs while the app runs."""
    from fake_engines.vllm import routes  # the generation routes need VllmServer from here

    if allow_runtime_lora is None:
        allow_runtime_lora = os.environ.get(RUNTIME_LORA_ENV, "").lower() in ("1", "true")
    server = build_server(config)
    app = web.Application(middlewares=[http_metrics_middleware(server.metrics.http), fastapi_errors, api_key_guard],
                          client_max_size=64 * 2**20)
    app[SERVER_KEY] = server
    app.router.add_get("/health", health, allow_head=False)
    app.router.add_route("*", "/ping", ping)
    app.router.add_get("/load", load, allow_head=False)
    app.router.add_get("/version", version, allow_head=False)
    app.router.add_get("/v1/models", models, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    if allow_runtime_lora:
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    from fake_engines.vllm import dev_routes, nixl

    nixl.install(app, server)  # --kv-transfer-config: disaggregated prefill/decode (docs/pd.md)
    if dev_routes.dev_mode():
        dev_routes.add_dev_routes(app)
    app.on_startup.append(_start_driver)
    app.on_cleanup.append(_stop_driver)
    app.on_response_prepare.append(_server_header)
    return app


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["server"] = "uvicorn"
    # Starlette's JSONResponse names no charset; vLLM's CORS middleware varies every answer on Origin
    if response.headers.get("Content-Type", "").startswith("application/json"):
        response.headers["Content-Type"] = "application/json"
    response.headers["vary"] = "Origin"
    response.headers[TIME_SCALE_HEADER] = repr(request.app[SERVER_KEY].config.time_scale)


async def _start_driver(app: web.Application) -> None:
    for unit in app[SERVER_KEY].engines:
        unit.driver.start()
        if unit.kv_publisher is not None:
            unit.kv_publisher.start()


async def _stop_driver(app: web.Application) -> None:
    for unit in app[SERVER_KEY].engines:
        await unit.driver.stop()
    await close_kv_publishers(app[SERVER_KEY])


async def close_kv_publishers(server: VllmServer) -> None:
    """Close every engine's KV event sockets (idempotent)."""
    for unit in server.engines:
        if unit.kv_publisher is not None:
            await unit.kv_publisher.close()


@web.middleware
async def fastapi_errors(request: web.Request, handler):
    """Unknown paths and methods answer as FastAPI does; VllmError becomes vLLM's envelope."""
    try:
        return await handler(request)
    except VllmError as err:
        return err.response()
    except web.HTTPMethodNotAllowed as exc:
        allow = ", ".join(sorted(exc.allowed_methods))
        return json_body({"detail": "Method Not Allowed"}, 405, headers={"allow": allow})
    except web.HTTPNotFound:
        return json_body({"detail": "Not Found"}, 404)


@web.middleware
async def api_key_guard(request: web.Request, handler):
    """With --api-key, /v1 routes need `Authorization: Bearer <key>` (vLLM's 401 body)."""
    key = request.app[SERVER_KEY].config.api_key
    if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
        return json_body({"error": "Unauthorized"}, 401)
    return await handler(request)


async def health(request: web.Request) -> web.Response:
    """200 with an empty body once the engine is up (before that the port refuses connections)."""
    return web.Response(status=200)


async def ping(request: web.Request) -> web.Response:
    """SageMaker's alias of /health."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    return web.Response(status=200)


async def load(request: web.Request) -> web.Response:
    """Server load; vLLM tracks it only with --enable-server-load-tracking, so it reads 0."""
    return json_body({"server_load": 0})


async def version(request: web.Request) -> web.Response:
    """The vLLM release the look-alike answers as."""
    return json_body({"version": VLLM_VERSION})


async def models(request: web.Request) -> web.Response:
    """The served model, then one card per LoRA adapter."""
    server = request.app[SERVER_KEY]
    name = server.config.model_name
    cards = [model_card(name, server.config.model, None, server.max_model_len, server.created)]
    cards += [model_card(lora, path, name, None, server.created) for lora, path in server.loras.items()]
    return json_body({"object": "list", "data": cards})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of the vllm:* families."""
    body = request.app[SERVER_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def tokenize(request: web.Request) -> web.Response:
    """Token ids of a prompt or of chat messages rendered with the chat template."""
    server = request.app[SERVER_KEY]
    body = parse_json_body(await request.read())
    if "messages" in body:
        if not isinstance(body["messages"], list):
            raise validation_error("list_type", "body.messages", "Input should be a valid list", body["messages"])
        text = chat_prompt(body["messages"])
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise validation_error("missing", "body.prompt", "Field required", body)
    tokens = encode(text)
    strs = [decode([t]) for t in tokens] if body.get("return_token_strs") else None
    return json_body({"count": len(tokens), "max_model_len": server.max_model_len, "tokens": tokens,
                      "token_strs": strs})


async def detokenize(request: web.Request) -> web.Response:
    """Text of a list of token ids."""
    body = parse_json_body(await request.read())
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise validation_error("list_type", "body.tokens", "Input should be a valid list", tokens)
    try:
        return json_body({"prompt": decode(tokens)})
    except ValueError as exc:
        raise VllmError(400, str(exc), "BadRequestError", "tokens") from None


async def load_lora_adapter(request: web.Request) -> web.Response:
    """Register an adapter at run time (only with VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
    server = request.app[SERVER_KEY]
    body = parse_json_body(await request.read())
    for name in ("lora_name", "lora_path"):
        if not isinstance(body.get(name), str):
            raise validation_error("missing", f"body.{name}", "Field required", body)
    name, path = body["lora_name"], body["lora_path"]
    if name in server.loras and not body.get("load_inplace"):
        raise VllmError(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                        "in place, set 'load_inplace' to True.", "InvalidUserInput")
    if not Path(path).exists():
        raise VllmError(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
    server.loras[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """Forget an adapter; requests naming it get 404 afterwards."""
    server = request.app[SERVER_KEY]
    body = parse_json_body(await request.read())
    name = body.get("lora_name")
    if not isinstance(name, str):
        raise validation_error("missing", "body.lora_name", "Field required", body)
    if name not in server.loras:
        raise VllmError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
    del server.loras[name]
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
