"""Google Cloud Vertex AI compatibility as llama-server has it (server-http.cpp's register_gcp_compat,
build 0c1e570): with AIP_MODE=PREDICTION in the environment, POST AIP_PREDICT_ROUTE (default
/predict) takes {"instances": [...]}, runs each instance through the route its "@requestFormat"
names (a camelCase alias of a path, "chatCompletions" for /v1/chat/completions, or the path itself;
never streamed) and answers {"predictions": [...]}, one answer body per instance, errors included;
AIP_HEALTH_ROUTE adds a GET alias of /health and AIP_HTTP_PORT replaces --port.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from aiohttp import web

from fake_engines.driver.serving import json_body
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.errors import TYPES, LlamaError, parse_json

MAX_INSTANCES = 128


@dataclass(frozen=True)
class GcpSettings:
    """The AIP_* environment."""

    enabled: bool
    health_path: str
    predict_path: str
    port: int | None


def gcp_settings(environ: Mapping[str, str]) -> GcpSettings:
    """Read AIP_MODE, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE and AIP_HTTP_PORT (a route gains its leading /)."""
    def route(name: str, default: str) -> str:
        value = environ.get(name) or default
        return value if not value or value.startswith("/") else "/" + value

    port = environ.get("AIP_HTTP_PORT")
    return GcpSettings(environ.get("AIP_MODE") == "PREDICTION", route("AIP_HEALTH_ROUTE", ""),
                       route("AIP_PREDICT_ROUTE", "/predict"), int(port) if port else None)


def gcp_alias(path: str) -> str:
    """path_to_gcp_format: "/v1/chat/completions" -> "chatCompletions", "/apply-template" -> "applyTemplate"."""
    rest = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    rest = rest[1:] if rest.startswith("/") else rest
    out, cap = [], False
    for ch in rest:
        if ch in ":{":  # path parameters (llama-server's :name, aiohttp's {name})
            break
        if ch in "/-_":
            cap = True
        else:
            out.append(ch.upper() if cap else ch)
            cap = False
    return "".join(out)


def _error(message: str, status: int = 400) -> dict:
    return {"error": {"code": status, "message": message, "type": TYPES[status]}}


def _routes(app: web.Application) -> dict[str, web.AbstractRoute]:
    """Every registered path's first route (as llama-server's handler table keeps the first)."""
    table: dict[str, web.AbstractRoute] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path and route.method != "HEAD":
            table.setdefault(path, route)
    return table


async def _run_instance(unread: web.Request, instance: object, routes: dict[str, web.AbstractRoute]) -> object:
    if not isinstance(instance, dict):
        return _error("each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return _error("each instance must include a string @requestFormat")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # the predict route never streams
    aliases: dict[str, str] = {}
    for path in routes:
        aliases.setdefault(gcp_alias(path), path)
    found = aliases.get(fmt) or (fmt if fmt in routes else None)
    if found is None:
        return _error(f"no handler registered for @requestFormat: {fmt}")
    path = found
    inner = unread.clone(method=routes[path].method, rel_url=path)
    inner._read_bytes = json.dumps(payload).encode()  # aiohttp's own cache of the body: the handler reads this
    try:
        response = await routes[path].handler(inner)
    except LlamaError as err:
        return json.loads(err.response().text or "null")
    body = getattr(response, "body", None)
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return bytes(body).decode("utf-8", "replace")


async def predict(request: web.Request) -> web.Response:
    """POST /predict: every instance through its route, concurrently, answers in order."""
    unread = request.clone()  # aiohttp clones only an unread request: the instances' requests are made from this
    try:
        body = parse_json(await request.read())
    except LlamaError as err:  # a parse error is this route's 400, not the API's 500
        return json_body(_error(err.message if err.status == 500 else "request body must be a JSON object"), 400)
    instances = body.get("instances")
    if not isinstance(instances, list):
        return json_body(_error("request body must include an array field named instances"), 400)
    if len(instances) > MAX_INSTANCES:
        return json_body(_error(f"instances array exceeds maximum size of {MAX_INSTANCES}"), 400)
    routes = _routes(request.app)
    predictions = await asyncio.gather(*(_run_instance(unread, i, routes) for i in instances))
    return json_body({"predictions": list(predictions)})


def gcp_port(config: LlamaServerConfig, environ: Mapping[str, str]) -> LlamaServerConfig:
    """AIP_HTTP_PORT replaces --port when AIP_MODE=PREDICTION."""
    settings = gcp_settings(environ)
    return replace(config, port=settings.port) if settings.enabled and settings.port is not None else config


def add_gcp_routes(app: web.Application, settings: GcpSettings) -> None:
    """The predict route and the health alias, when AIP_MODE=PREDICTION."""
    if not settings.enabled:
        return
    if settings.health_path:
        from fake_engines.llamacpp.app import health

        app.router.add_get(settings.health_path, health)
    app.router.add_post(settings.predict_path, predict)
