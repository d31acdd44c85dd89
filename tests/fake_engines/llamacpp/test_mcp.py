"""MCP servers behind the fake llama-server's /tools, over real sockets with real stdio servers
(tests/data/mcp/stdio_server.py): discovery at start-up, `<server>_<tool>` calls, errors, timeouts,
respawn after a crash, concurrency and a prompt shutdown (tools/server/server-mcp.cpp)."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.mcp import load_servers, parse_servers, result_to_response
from fake_engines.llamacpp.server import start_llama
from fake_engines.llamacpp.tools_builtin import TOOL_NAMES
from fake_engines.llamacpp.tools_route import TOOLS_KEY
from tests.conftest import DATA

SERVER = str(DATA / "mcp" / "stdio_server.py")


def _mcp_json(**servers: dict) -> str:
    return json.dumps({"mcpServers": {name: {"command": sys.executable, "args": [SERVER], **cfg}
                                      for name, cfg in servers.items()}})


async def _served(mcp_json: str):
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", port=0, time_scale=0.01, n_parallel=1, n_ctx=512,
                               mcp_servers_json=mcp_json)
    running = await start_llama(config, cold_start=False)
    running.server.ready = True
    return running, f"http://127.0.0.1:{running.port}/tools"


async def _call(session, url: str, tool: str, params: dict) -> tuple[int, dict]:
    async with session.post(url, json={"tool": tool, "params": params}) as resp:
        return resp.status, await resp.json()


async def test_mcp_tools_are_listed_called_and_survive_errors_timeouts_and_crashes():
    mcp_json = json.dumps({"mcpServers": {**json.loads(_mcp_json(t={}, quick={"timeout_ms": 300},
                                                                 empty={"args": [SERVER, "--no-tools"]}))["mcpServers"],
                                          "bad": {"command": "this_executable_does_not_exist_12345"}}})
    running, url = await _served(mcp_json)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as resp:
                listed = await resp.json()
            echo = await _call(s, url, "t_echo", {"message": "hi"})  # a notification comes first, same write
            add = await _call(s, url, "t_add", {"a": 2, "b": 3})
            fails = [await _call(s, url, "t_fail_once", {}) for _ in range(2)]
            is_error = await _call(s, url, "t_sleep", {"seconds": 0, "error": True})
            timed_out = await _call(s, url, "quick_sleep", {"seconds": 3})
            crashed = await _call(s, url, "t_crash", {})
            respawned = await _call(s, url, "t_echo", {"message": "again"})
            many = await asyncio.gather(*(_call(s, url, "t_echo", {"message": str(i)}) for i in range(8)))
            unknown = await _call(s, url, "bad_echo", {})
    finally:
        await running.close()
    names = [t["tool"] for t in listed]
    assert not set(names) & set(TOOL_NAMES)  # no built-in tools without --tools
    assert [n for n in names if n.startswith("t_")] == ["t_echo", "t_add", "t_fail_once", "t_sleep", "t_crash",
                                                         "t_spawn_holder"]
    assert not [n for n in names if n.startswith(("bad_", "empty_"))]
    echo_entry = listed[0]
    assert echo_entry == {"display_name": "t_echo", "tool": "t_echo", "type": "mcp", "permissions": {"write": False},
                          "uses_cwd": False, "definition": {"type": "function", "function": {
                              "name": "t_echo", "description": "echo tool",
                              "parameters": {"type": "object", "properties": {}}}}}
    assert echo == (200, {"plain_text_response": "echo: hi"})
    assert add == (200, {"plain_text_response": "5"})  # only the text parts
    assert fails == [(200, {"error": "transient error"}), (200, {"plain_text_response": "ok"})]
    assert is_error == (200, {"error": "ok"})
    assert timed_out == (200, {"error": "request timed out"})
    assert crashed == (200, {"error": "transport closed"})
    assert respawned == (200, {"plain_text_response": "echo: again"})
    assert sorted(m[1]["plain_text_response"] for m in many) == [f"echo: {i}" for i in range(8)]
    assert unknown[0] == 404 and unknown[1]["error"]["message"] == 'unknown tool "bad_echo"'


async def test_shutdown_ends_calls_in_flight_and_kills_servers_holding_their_pipes_open():
    running, url = await _served(_mcp_json(t={"timeout_ms": 60000}))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        holder = await _call(s, url, "t_spawn_holder", {})  # leaves a grandchild with the pipes
        in_flight = asyncio.ensure_future(_call(s, url, "t_sleep", {"seconds": 60}))
        while not running.app[TOOLS_KEY].mcp.sessions["t"].pending:
            await asyncio.sleep(0.01)
        started = loop.time()
        await running.close()
        answer = await in_flight
    assert holder == (200, {"plain_text_response": "ok"})
    assert answer == (200, {"error": "cancelled"})
    assert loop.time() - started < 30  # well before the 60 s sleep or its 60 s timeout


def test_config_sources_errors_and_result_shapes(tmp_path):
    assert parse_servers('{"other": {}}') == []
    servers = parse_servers('{"mcpServers": {"a": {"command": "x", "args": ["1"], "env": {"K": "v"}, '
                            '"timeout_ms": 500}, "nocmd": {"args": []}}}')
    assert [(s.name, s.command, s.args, s.env, s.timeout_ms) for s in servers] == [("a", "x", ("1",), {"K": "v"}, 500)]
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"a": {"command": "from-file"}}}')
    both = load_servers(str(path), '{"mcpServers": {"a": {"command": "inline"}, "b": {"command": "y"}}}')
    assert [(s.name, s.command) for s in both] == [("a", "from-file"), ("b", "y")]  # the first of a name stays
    with pytest.raises(ServerConfigError, match="failed to parse MCP config JSON"):
        load_servers("", "not valid json")
    with pytest.raises(ServerConfigError, match="failed to open MCP config file: /nonexistent/path.json"):
        load_servers("/nonexistent/path.json", "")
    assert result_to_response({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == \
        {"plain_text_response": "a\nb"}
    assert result_to_response({"content": [], "isError": True}) == {"error": "MCP tool returned an error"}
