"""The fake llama-server aiohttp application: state, middlewares and the informational routes."""

from __future__ import annotations

import os
import secrets
import string
import time
from dataclasses import dataclass, field

from aiohttp import web

from fake_engines.core import LlamaCppScheduler, OutputLengthSampler, SlotState, decode
from fake_engines.driver.live import LiveDriver
from fake_engines.driver.serving import TIME_SCALE_HEADER, json_body
from fake_engines.factory import build_engine
from fake_engines.factory.llamacpp_http_flags import comma_set
from fake_engines.llamacpp import (
    access,
    cors_proxy,
    engine,
    gcp,
    sleep,
    slot_files,
    stream_sessions,
    vocab,
    webui,
)
from fake_engines.llamacpp.chat_checks import check_chat_body
from fake_engines.llamacpp.config import BUILD_INFO, LlamaServerConfig
from fake_engines.llamacpp.errors import LlamaError, not_found, parse_json
from fake_engines.llamacpp.metrics import METRICS_CONTENT_TYPE, render_metrics
from fake_engines.llamacpp.model import GgufModel
from fake_engines.llamacpp.shapes import sampler_params
from fake_engines.llamacpp.telemetry import LlamaTelemetry
from fake_engines.llamacpp.templates import ChatTemplates, body_prompt, templates_for


@dataclass
class LlamaServer:
    """Everything the handlers share."""

    config: LlamaServerConfig
    """Start-up flags."""
    model: GgufModel
    """What -m loaded."""
    spec: engine.LlamaEngineSpec
    """Placement and cold start."""
    driver: LiveDriver
    """Runs the slots in (scaled) real time."""
    telemetry: LlamaTelemetry
    """server_metrics."""
    sampler: OutputLengthSampler
    """Seeded output lengths."""
    templates: ChatTemplates
    """The chat template every chat route renders with (fake_engines/llamacpp/templates.py)."""
    lora_scales: list[float] = field(default_factory=list)
    """Global scale of each preloaded adapter (POST /lora-adapters changes them)."""
    ready: bool = False
    """False while the model loads: every route answers 503."""
    created: int = field(default_factory=lambda: int(time.time()))
    """Unix time for `created` fields."""
    next_id: int = 0
    """Counter for engine request ids."""
    media_marker: str = field(default_factory=lambda: "<__media_" + "".join(
        secrets.choice(string.ascii_letters + string.digits) for _ in range(32)) + "__>")
    """The multimodal placeholder /props names: 32 random alphanumerics per process, as llama-server draws it."""

    def request_id(self) -> str:
        """A new engine request id."""
        self.next_id += 1
        return f"task-{self.next_id}"

    @property
    def slot_n_ctx(self) -> int:
        """Context of one slot."""
        core = self.driver.core
        assert isinstance(core, LlamaCppScheduler)  # the driver of a llama-server runs slots
        return core.config.slot_n_ctx


SERVER_KEY = web.AppKey("llama_server", LlamaServer)


def build_server(config: LlamaServerConfig) -> LlamaServer:
    """Load the model description, place layers, wire core, driver and counters."""
    built = build_engine(config)  # the engine factory: -m loaded, layers placed, slots sized
    assert isinstance(built.config, LlamaServerConfig) and isinstance(built.spec, engine.LlamaEngineSpec)
    assert built.gguf is not None
    core = built.new_core()
    if config.verbose:
        _debug_log(core)
    telemetry = LlamaTelemetry(core)
    driver = LiveDriver(core, built.step_time, config.time_scale, telemetry)
    sampler = OutputLengthSampler(seed=config.seed, mean_output_tokens=config.mean_output_tokens)
    templates = templates_for(config, built.gguf.chat_template, built.gguf.chat_template_tool_use)
    return LlamaServer(built.config, built.gguf, built.spec, driver, telemetry, sampler, templates,
                       [s for _, s in config.loras])


def _debug_log(core: object) -> None:
    """--verbose: llama-server's debug lines about its prompt cache, on stdout (the tests read them)."""
    assert isinstance(core, LlamaCppScheduler)
    core.log = lambda message: print(f"srv  debug: {message}", flush=True)
    if core.config.cache_idle_slots and core.config.cache_ram_tokens:
        core.log("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")


def create_app(config: LlamaServerConfig) -> web.Application:
    """The aiohttp app serving llama-server's routes."""
    from fake_engines.llamacpp import routes

    app = web.Application(middlewares=[llama_errors], client_max_size=64 * 2**20)
    server = app[SERVER_KEY] = build_server(config)
    app.on_response_prepare.append(_server_headers)
    access.install(app, access.AccessPolicy.of(config), lambda: server.ready)
    sleep.install(app, config.sleep_idle_seconds, lambda: server.telemetry.counters, lambda: _busy(server))
    stream_sessions.install(app)  # X-Conversation-Id: resumable streams, /v1/stream
    webui.add_ui_routes(app, enabled=not config.no_ui)
    cors_proxy.add_cors_proxy_routes(app, enabled=config.ui_mcp_proxy)
    from fake_engines.llamacpp.tools_route import install_tools

    install_tools(app, config)  # /tools: built-in tools and MCP servers, 403 unless enabled
    for path in ("/health", "/v1/health"):
        app.router.add_get(path, health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/props", props)
    app.router.add_get("/slots", slots)
    app.router.add_post("/slots/{id_slot}", slot_files.slot_action)
    for path in ("/models", "/v1/models", "/api/tags"):
        app.router.add_get(path, models)
    for path in ("/completion", "/completions"):
        app.router.add_post(path, routes.native_completion)
    app.router.add_post("/v1/completions", routes.completions)
    for path in ("/chat/completions", "/v1/chat/completions", "/api/chat"):
        app.router.add_post(path, routes.chat_completions)
    _add_compat_routes(app)
    from fake_engines.llamacpp.pooling_routes import add_pooling_routes

    add_pooling_routes(app)  # /embeddings, /v1/embeddings, /rerank, /infill
    gcp.add_gcp_routes(app, gcp.gcp_settings(os.environ))  # AIP_MODE=PREDICTION: Vertex AI's /predict
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/apply-template", apply_template)
    app.router.add_get("/lora-adapters", lora_adapters)
    app.router.add_post("/lora-adapters", set_lora_adapters)
    app.on_startup.append(_start_driver)
    app.on_cleanup.append(_stop_driver)
    return app


def _add_compat_routes(app: web.Application) -> None:
    """Anthropic messages, OpenAI responses and the prompt-length counters (compat_routes.py)."""
    from fake_engines.llamacpp import compat_routes

    app.router.add_post("/v1/messages", compat_routes.messages)
    app.router.add_post("/v1/messages/count_tokens", compat_routes.count_tokens)
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/responses", compat_routes.responses_create)
        app.router.add_post(f"{prefix}/chat/completions/input_tokens", compat_routes.chat_input_tokens)
        app.router.add_post(f"{prefix}/responses/input_tokens", compat_routes.responses_input_tokens)


def _busy(server: LlamaServer) -> bool:
    """Loading, or a task running or waiting: the idle timer of --sleep-idle-seconds does not run."""
    stats = server.driver.core.stats()
    return not server.ready or stats.num_running + stats.num_waiting > 0


async def _start_driver(app: web.Application) -> None:
    app[SERVER_KEY].driver.start()


async def _stop_driver(app: web.Application) -> None:
    await app[SERVER_KEY].driver.stop()


async def _server_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "llama.cpp"
    response.headers[TIME_SCALE_HEADER] = repr(request.app[SERVER_KEY].config.time_scale)
    # cpp-httplib closes the connection after an error status or when the client asked it to
    # (`Connection: close`, captures llama.cpp/032 and 068), and announces keep-alive otherwise
    if response.status >= 400 or not request.keep_alive:
        response.force_close()
        response.headers["Connection"] = "close"
    else:
        response.headers["Keep-Alive"] = "timeout=5, max=100"


@web.middleware
async def llama_errors(request: web.Request, handler):
    """httplib's 404 for unknown routes, the error envelope for LlamaError (503 while loading and
    the API key are checked before, in fake_engines.llamacpp.access)."""
    try:
        return await handler(request)
    except LlamaError as err:
        return err.response()
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return not_found()


async def health(request: web.Request) -> web.Response:
    """{"status":"ok"} once loaded (the middleware answers 503 before)."""
    return json_body({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    """llamacpp:* exposition; 501 without --metrics."""
    server = request.app[SERVER_KEY]
    if not server.config.metrics:
        raise LlamaError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
    asleep = sleep.sleeping_metrics(request.app)  # while asleep: the counters as they were on entering sleep
    stats = server.driver.core.stats()
    text = render_metrics(asleep, 0, 0) if asleep is not None else \
        render_metrics(server.telemetry.counters, stats.num_running, stats.num_waiting)
    return web.Response(text=text, headers={"Content-Type": METRICS_CONTENT_TYPE,
                                            "Process-Start-Time-Unix": str(server.created)})


def _slot_body(slot: SlotState, server: LlamaServer) -> dict:
    body: dict = {"id": slot.id, "n_ctx": slot.n_ctx, "speculative": False, "is_processing": slot.is_processing}
    if slot.id_task < 0:
        return body
    lora = [] if slot.lora is None else [{"id": i, "scale": s} for i, s in _parse_lora_key(slot.lora)]
    body.update({"id_task": slot.id_task, "n_prompt_tokens": slot.n_prompt_tokens,
                 "n_prompt_tokens_processed": slot.n_prompt_tokens_processed,
                 "n_prompt_tokens_cache": slot.n_prompt_tokens_cache,
                 "params": sampler_params(slot.n_decoded + max(slot.n_remain, 0), True, lora, reasoning_format="deepseek"),
                 "next_token": [{"has_next_token": slot.is_processing, "has_new_line": False,
                                 "n_remain": slot.n_remain, "n_decoded": slot.n_decoded}]})
    return body


def _parse_lora_key(key: str) -> list[tuple[int, float]]:
    return [(int(i), float(s)) for i, s in (part.split(":") for part in key.split(",") if part)]


async def slots(request: web.Request) -> web.Response:
    """Per-slot state; 501 with --no-slots."""
    server = request.app[SERVER_KEY]
    if not server.config.slots:
        raise LlamaError(501, "This server does not support slots endpoint. Start it with `--slots`")
    states = server.driver.core.stats().slots
    if request.query.get("fail_on_no_slot") and all(s.is_processing for s in states):
        raise LlamaError(503, "no slot available")
    return json_body([_slot_body(s, server) for s in states])


async def props(request: web.Request) -> web.Response:
    """Server properties: slot count, context, model, chat template, build."""
    server, config = request.app[SERVER_KEY], request.app[SERVER_KEY].config
    return json_body({
        "default_generation_settings": {"params": sampler_params(-1, False, [], seed=config.seed),
                                        "n_ctx": server.slot_n_ctx},
        "total_slots": len(server.driver.core.stats().slots), "model_alias": config.model_id,
        "model_ftype": server.model.ftype, "model_path": config.model,
        "modalities": {"vision": False, "video": False, "audio": False}, "media_marker": server.media_marker,
        "endpoint_slots": config.slots, "endpoint_props": False, "endpoint_metrics": config.metrics,
        "ui": not config.no_ui,
        "ui_settings": {}, "chat_template": server.templates.source,
        "chat_template_caps": server.templates.props_caps(),
        "bos_token": "<s>", "eos_token": "</s>", "build_info": BUILD_INFO,
        "is_sleeping": sleep.is_sleeping(request.app),
        "cors_proxy_enabled": config.ui_mcp_proxy, **server.templates.tool_use_props()})


async def models(request: web.Request) -> web.Response:
    """Ollama-style `models` and OpenAI-style `data` side by side, as llama-server answers."""
    server = request.app[SERVER_KEY]
    mid, model = server.config.model_id, server.model
    ollama = {"name": mid, "model": mid, "modified_at": "", "size": "", "digest": "", "type": "model",
              "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
              "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                          "parameter_size": "", "quantization_level": ""}}
    meta = {"vocab_type": 2, "n_vocab": model.vocab_size, "n_ctx": server.slot_n_ctx,
            "n_ctx_train": model.n_ctx_train, "n_embd": model.spec.hidden, "n_params": int(model.spec.params),
            "size": model.size_bytes, "ftype": model.ftype}
    card = {"id": mid, "aliases": comma_set(server.config.alias) or [mid], "tags": comma_set(server.config.tags),
            "object": "model", "created": server.created,
            "owned_by": "llamacpp", "meta": meta}
    return json_body({"models": [ollama], "object": "list", "data": [card]})


async def tokenize(request: web.Request) -> web.Response:
    """{"tokens": [...]}; with_pieces adds each token's text."""
    body = parse_json(await request.read())
    if "content" not in body:  # llama-server reads only `content`: {"prompt": ...} gives no tokens
        return json_body({"tokens": []})
    tokens = vocab.tokenize_content(body["content"], body.get("add_special") is True)
    if body.get("with_pieces") is True:
        return json_body({"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, vocab.token_pieces(tokens),
                                                                              strict=True)]})
    return json_body({"tokens": tokens})


async def apply_template(request: web.Request) -> web.Response:
    """The chat template applied to `messages`, with the generation prompt."""
    body = parse_json(await request.read())
    if not isinstance(body.get("messages"), list):
        raise LlamaError(400, "Expected 'messages' to be an array")
    check_chat_body(body)
    return json_body({"prompt": body_prompt(request.app[SERVER_KEY].templates, body)})


async def detokenize(request: web.Request) -> web.Response:
    """{"content": text}."""
    body = parse_json(await request.read())
    tokens = body.get("tokens", [])
    try:
        return json_body({"content": decode([int(t) for t in tokens])})
    except (TypeError, ValueError) as exc:
        raise LlamaError(400, str(exc)) from None


async def lora_adapters(request: web.Request) -> web.Response:
    """Preloaded adapters and their global scales."""
    server = request.app[SERVER_KEY]
    return json_body([{"id": i, "path": path, "scale": server.lora_scales[i], "task_name": "", "prompt_prefix": ""}
                      for i, (path, _) in enumerate(server.config.loras)])


async def set_lora_adapters(request: web.Request) -> web.Response:
    """Set global scales: [{"id": 0, "scale": 0.5}]; adapters not listed go to 0."""
    server = request.app[SERVER_KEY]
    raw = await request.read()
    items = parse_json(b'{"l":' + raw + b"}")["l"] if raw.strip() else []
    if not isinstance(items, list):
        raise LlamaError(400, "Request body must be an array")
    scales = [0.0] * len(server.lora_scales)
    for item in items:
        index = item.get("id") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(scales):
            raise LlamaError(400, f"invalid adapter id {index}")
        scales[index] = float(item.get("scale", 0.0))
    server.lora_scales = scales
    return json_body({"success": True})
