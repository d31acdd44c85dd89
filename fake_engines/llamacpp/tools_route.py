"""GET and POST /tools (tools/server/server-tools.cpp `server_tools::setup`): the built-in tools
`--tools` enables and the tools of the MCP servers `--mcp-servers-*` configure; 403 "this feature is
disabled" when neither is. POST {"tool", "params", "stream"} invokes one: its result object (200,
`error` inside when the tool failed), or SSE `{"chunk"}` events then `{"done": true}`.

Headers steer a call as on the real server: `x-tool-cwd` (paths and commands resolve there; a
`cwd` in params is dropped), `x-tool-runtime` (a running container or an ssh host the tools run
in, tools_isolate.py; an unknown or unsafe one is 500, never the host), `x-resp-type: base64`
(read_file).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from fake_engines.driver.serving import json_body, send_event
from fake_engines.factory.llamacpp_config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.errors import LlamaError, parse_json
from fake_engines.llamacpp.mcp import McpManager, McpToolDef, load_servers
from fake_engines.llamacpp.tools_builtin import (
    TOOL_NAMES,
    Stream,
    Tool,
    ToolParamError,
    build_tools,
    required,
)
from fake_engines.llamacpp.tools_io import ToolRuntimeError, check_runtime
from fake_engines.llamacpp.tools_isolate import SpawnedContainer, container_spec

HEADER_PARAMS = {"cwd": "x-tool-cwd", "runtime": "x-tool-runtime", "resp_type": "x-resp-type"}
"""Params only a header sets: a model's own value for them is dropped."""


@dataclass
class ToolsEndpoint:
    """What /tools serves."""

    tools: list[Tool]
    """Enabled built-in tools, then MCP tools once discovered."""
    mcp: McpManager
    """The configured MCP servers."""
    runtime: str = ""
    """--tools-runtime naming a running container or an ssh host (validated at start-up)."""
    container: SpawnedContainer | None = None
    """--tools-runtime ENGINE:IMAGE: the container the server spawned and owns."""


TOOLS_KEY = web.AppKey("llama_tools", ToolsEndpoint)


def build_endpoint(config: LlamaServerConfig) -> ToolsEndpoint | None:
    """The endpoint the flags ask for, None when /tools is off; raises ServerConfigError (the server
    does not start) on an unknown tool, a bad runtime or an MCP config that cannot be read."""
    unknown = [name for name in config.server_tools if name != "all" and name not in TOOL_NAMES]
    if unknown:
        raise ServerConfigError(f'tools setup failed: unknown tool "{unknown[0]}". '
                                f"available tools: {', '.join(TOOL_NAMES)}")
    spawned = container_spec(config.tools_runtime)
    container = None
    if spawned is not None and not spawned[2]:  # ENGINE:IMAGE, spawned when the server starts
        if not spawned[1]:
            raise ServerConfigError(f"--tools-runtime {spawned[0]}:<image> requires an image name")
        container = SpawnedContainer(spawned[0], spawned[1])
    else:
        try:
            check_runtime(config.tools_runtime)
        except ToolRuntimeError as exc:
            raise ServerConfigError(f"--tools-runtime: {exc}") from None
    mcp = McpManager(load_servers(config.mcp_servers_config, config.mcp_servers_json))
    if not config.server_tools and mcp.empty:
        return None
    everything = "all" in config.server_tools
    tools = [t for t in build_tools() if everything or t.name in config.server_tools]
    return ToolsEndpoint(tools, mcp, "" if container else config.tools_runtime, container)


def install_tools(app: web.Application, config: LlamaServerConfig) -> None:
    """Register /tools on `app`; MCP tool discovery runs before the server listens."""
    endpoint = build_endpoint(config)
    if endpoint is None:
        app.router.add_get("/tools", _disabled)
        app.router.add_post("/tools", _disabled)
        return
    app[TOOLS_KEY] = endpoint
    app.router.add_get("/tools", list_tools)
    app.router.add_post("/tools", call_tool)
    app.on_startup.append(_warmup)
    app.on_shutdown.append(_stop_mcp)  # before aiohttp waits for handlers: MCP calls in flight end now
    app.on_cleanup.append(_stop_mcp)
    app.on_cleanup.append(_stop_container)
    print("srv    security: server tools (experimental) enabled - do not expose to untrusted environments",
          flush=True)


async def _warmup(app: web.Application) -> None:
    endpoint = app[TOOLS_KEY]
    if endpoint.container is not None:
        try:
            await endpoint.container.start()
        except ToolRuntimeError as exc:  # the server does not start, as llama-server's tools setup fails
            raise ServerConfigError(f"tools setup failed: {exc}") from None
    await endpoint.mcp.warmup()
    seen = {t.name for t in endpoint.tools}
    for tool in endpoint.mcp.registry:
        name = f"{tool.server}_{tool.name}"
        if name not in seen:  # a collision with a built-in or another MCP tool is skipped
            seen.add(name)
            endpoint.tools.append(mcp_tool(tool, endpoint.mcp))


async def _stop_mcp(app: web.Application) -> None:
    app[TOOLS_KEY].mcp.shutdown()


async def _stop_container(app: web.Application) -> None:
    container = app[TOOLS_KEY].container
    if container is not None:
        await container.close()


def mcp_tool(tool: McpToolDef, mcp: McpManager) -> Tool:
    """An MCP server's tool as a /tools entry named `<server>_<tool>`."""
    name = f"{tool.server}_{tool.name}"
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}

    async def invoke(params: dict, _: Stream | None = None) -> dict:
        return await mcp.call_tool(tool.server, tool.name, params)

    definition = {"type": "function", "function": {"name": name, "description": tool.description,
                                                   "parameters": schema}}
    return Tool(name, name, definition, invoke, uses_cwd=False, kind="mcp")


async def _disabled(request: web.Request) -> web.Response:
    return json_body({"error": {"message": "this feature is disabled", "type": "feature_disabled"}}, 403)


async def list_tools(request: web.Request) -> web.Response:
    """Every tool: display_name, tool, type, permissions, uses_cwd, definition."""
    return json_body([t.to_json() for t in request.app[TOOLS_KEY].tools])


def _invalid(status: int, message: str) -> LlamaError:
    return LlamaError(status, message, "invalid_request_error", code=400)


async def call_tool(request: web.Request) -> web.StreamResponse:
    """Invoke one tool; the body names it and its params."""
    endpoint = request.app[TOOLS_KEY]
    try:
        body = parse_json(await request.read())
    except LlamaError as err:  # a malformed body is the caller's fault here
        raise _invalid(400, err.message) from None
    try:
        name = required(body, "tool")
        params, stream = body.get("params", {}), body.get("stream", False)
        if not isinstance(params, dict) or not isinstance(stream, bool):
            raise ToolParamError("[json.exception.type_error.302] type must be object, but is "
                                 + ("boolean" if isinstance(params, bool) else "string"))
    except ToolParamError as exc:
        raise _invalid(400, str(exc)) from None
    params = {k: v for k, v in params.items() if k not in HEADER_PARAMS}
    for key, header in HEADER_PARAMS.items():
        if request.headers.get(header):
            params[key] = request.headers[header]
    if "runtime" not in params and endpoint.container is not None:
        try:
            params["runtime"] = await endpoint.container.spec()
        except ToolRuntimeError as exc:
            raise LlamaError(500, str(exc)) from None
    elif "runtime" not in params and endpoint.runtime:
        params["runtime"] = endpoint.runtime
    tool = _find(endpoint.tools, name, stream)
    if stream:
        return await _stream(request, tool, params)
    try:
        return json_body(await tool.invoke(params, None))
    except ToolParamError as exc:
        raise _invalid(400, str(exc)) from None
    except ToolRuntimeError as exc:
        raise LlamaError(500, str(exc)) from None


def _find(tools: list[Tool], name: str, stream: bool) -> Tool:
    for tool in tools:
        if tool.name == name:
            if stream and not tool.support_stream:
                raise _invalid(404, f'tool "{name}" does not support stream = true')
            return tool
    raise _invalid(404, f'unknown tool "{name}"')


async def _stream(request: web.Request, tool: Tool, params: dict) -> web.StreamResponse:
    """SSE: each chunk as {"chunk"}, then {"done": true} (with "error" when the tool failed)."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def push(chunk: str) -> bool:
        if not chunk:
            return True
        try:
            await send_event(response, {"chunk": chunk})
        except ConnectionResetError:
            return False
        return True

    done: dict = {"done": True}
    try:
        await tool.invoke(params, push)
    except (ToolParamError, ToolRuntimeError) as exc:
        done["error"] = str(exc)
    try:
        await send_event(response, done)
        await response.write_eof()
    except ConnectionResetError:
        pass
    return response
