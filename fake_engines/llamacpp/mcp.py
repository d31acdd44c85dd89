"""MCP servers behind /tools (tools/server/server-mcp.cpp): `--mcp-servers-config FILE` and
`--mcp-servers-json JSON` in Cursor's format (`{"mcpServers": {NAME: {command, args, env, cwd,
timeout_ms}}}`), each a child process speaking JSON-RPC 2.0 as newline-delimited JSON on its stdin
and stdout.

At start-up each server is spawned once, initialised, asked `tools/list` (10 s at most) and shut
down; its tools join /tools as `<server>_<tool>`. A call spawns the server again on demand and
keeps it: one request at a time per server, a `timeout_ms` limit per request (30 s by default),
notifications and stale replies skipped, a dead server respawned on the next call, a server that
cannot be spawned left alone for 5 s. Shutdown fails the calls in flight at once and kills each
server's whole process group, so a grandchild holding the pipes delays nothing.

These run commands on THIS host as the configuration names them: for local use only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass, field

from fake_engines.factory.llamacpp_config import ServerConfigError

PROTOCOL_VERSION = "2024-11-05"
"""What `initialize` offers."""
COOLDOWN_S = 5.0
"""How long a server that failed to spawn is not tried again."""
WARMUP_TIMEOUT_S = 10.0
"""Tool discovery budget per server at start-up."""
MAX_LINE = 8 * 2**20
"""A line of a server's output longer than this is dropped."""
ERR_TAIL_MAX = 4096
"""Bytes of a server's stderr kept for diagnostics."""


@dataclass(frozen=True)
class McpServerConfig:
    """One entry of `mcpServers`."""

    name: str
    """Its key: the prefix of its tools' names."""
    command: str
    """The executable (searched on PATH)."""
    args: tuple[str, ...] = ()
    """Its arguments."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables laid over the server's own environment."""
    cwd: str = ""
    """Its working directory (default: the server's)."""
    timeout_ms: int = 30000
    """Limit of each request to it, milliseconds."""


@dataclass(frozen=True)
class McpToolDef:
    """A tool an MCP server listed."""

    server: str
    """The server's config name."""
    name: str
    """The tool's own name."""
    description: str = ""
    """Its description."""
    input_schema: object = None
    """Its `inputSchema` (a JSON schema), or None."""


def parse_servers(text: str) -> list[McpServerConfig]:
    """The servers of one JSON text; raises ValueError on bad JSON or a wrongly typed field. No
    `mcpServers` object gives none; an entry without a command is skipped."""
    root = json.loads(text)
    servers = root.get("mcpServers") if isinstance(root, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, cfg in servers.items():
        if not isinstance(cfg, dict):
            raise ValueError(f"server '{name}': expected an object")
        command, cwd = cfg.get("command", ""), cfg.get("cwd", "")
        timeout = cfg.get("timeout_ms", 30000)
        args, env = cfg.get("args", []), cfg.get("env", {})
        args = args if isinstance(args, list) else []
        env = env if isinstance(env, dict) else {}
        if not (isinstance(command, str) and isinstance(cwd, str) and isinstance(timeout, int | float)
                and all(isinstance(a, str) for a in args) and all(isinstance(v, str) for v in env.values())):
            raise ValueError(f"server '{name}': [json.exception.type_error.302] wrong type of a field")
        if command:
            out.append(McpServerConfig(name, command, tuple(args), dict(env), cwd, int(timeout)))
    return out


def load_servers(config_path: str, inline_json: str) -> list[McpServerConfig]:
    """The servers of --mcp-servers-config then --mcp-servers-json, names unique (a repeat is
    skipped); raises ServerConfigError (the server does not start) on an unreadable file or bad JSON."""
    texts = []
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            raise ServerConfigError(f"failed to open MCP config file: {config_path}") from None
    if inline_json:
        texts.append(inline_json)
    servers: dict[str, McpServerConfig] = {}
    for text in texts:
        try:
            parsed = parse_servers(text)
        except ValueError as exc:  # json.JSONDecodeError is one
            raise ServerConfigError(f"failed to parse MCP config JSON: {exc}") from None
        for server in parsed:
            servers.setdefault(server.name, server)
    return list(servers.values())


def result_to_response(result: object) -> dict:
    """A tools/call result as /tools answers it: the text parts joined by newlines, `isError` as error."""
    parts = result.get("content") if isinstance(result, dict) else None
    text = "\n".join(p.get("text", "") for p in parts or [] if isinstance(p, dict) and p.get("type") == "text")
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


def _rpc_error(reply: dict) -> str:
    err = reply.get("error")
    if isinstance(err, dict):
        return str(err.get("message", "unknown error"))
    return err if isinstance(err, str) else "unknown error"


class _Pipes(asyncio.SubprocessProtocol):
    """The child's stdout split into lines for the transport; stderr kept as a bounded tail."""

    def __init__(self, session: McpSession) -> None:
        self.session = session
        self.buf = b""
        self.skipping = False
        self.err_tail = b""

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.err_tail = (self.err_tail + data)[-ERR_TAIL_MAX:]
            return
        self.buf += data
        if self.skipping:  # resync after an over-long line: drop up to its newline
            if b"\n" not in self.buf:
                self.buf = b""
                return
            self.buf = self.buf.split(b"\n", 1)[1]
            self.skipping = False
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if line.strip():
                self.session.on_line(line)
        if len(self.buf) > MAX_LINE:
            self.buf, self.skipping = b"", True

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.session.on_gone()

    def process_exited(self) -> None:
        self.session.on_gone()


class McpSession:
    """One running MCP server: spawn, JSON-RPC requests matched to replies by id, close."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.transport: asyncio.SubprocessTransport | None = None
        self.pipes: _Pipes | None = None
        self.alive = False
        self.pending: dict[int, asyncio.Future[dict]] = {}
        self.next_id = 1
        self.initialized = False
        self.last_error = ""
        self.lock = asyncio.Lock()

    async def start(self) -> bool:
        """Spawn it in a session (process group) of its own; False when it cannot be spawned."""
        env = {**os.environ, **self.config.env} if self.config.env else None
        pipes = self.pipes = _Pipes(self)
        try:
            self.transport, _ = await asyncio.get_running_loop().subprocess_exec(
                lambda: pipes, self.config.command, *self.config.args, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                cwd=self.config.cwd or None, start_new_session=True)
        except (OSError, ValueError) as exc:
            self.last_error = f"failed to spawn '{self.config.command}': {exc}"
            return False
        self.alive = True
        return True

    def on_line(self, line: bytes) -> None:
        """A reply completes the request of its id; notifications, stale replies and junk are skipped."""
        try:
            reply = json.loads(line)
        except ValueError:
            return
        if isinstance(reply, dict) and isinstance(reply.get("id"), int):
            waiter = self.pending.pop(reply["id"], None)
            if waiter is not None and not waiter.done():
                waiter.set_result(reply)

    def on_gone(self) -> None:
        """The server exited or closed its stdout: every request waiting fails."""
        self.alive = False
        self._fail_pending("transport closed")

    def _fail_pending(self, message: str) -> None:
        for waiter in self.pending.values():
            if not waiter.done():
                waiter.set_result({"error": {"code": -32603, "message": message}})
        self.pending.clear()

    def _write(self, message: dict) -> bool:
        pipe = self.transport.get_pipe_transport(0) if self.transport is not None else None
        if not self.alive or pipe is None or pipe.is_closing():
            return False
        assert isinstance(pipe, asyncio.WriteTransport)
        pipe.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        return True

    async def _request(self, method: str, params: dict | None, timeout_s: float) -> dict:
        """The reply to one request, or {"error": {...}} on timeout or a closed transport."""
        rid = self.next_id
        self.next_id += 1
        message: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        waiter: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        self.pending[rid] = waiter
        if not self._write(message):
            self.pending.pop(rid, None)
            return {"error": {"code": -32603, "message": "transport closed"}}
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout=max(timeout_s, 0))
        except TimeoutError:
            self.pending.pop(rid, None)
            return {"error": {"code": -32603, "message": "request timed out"}}

    def _timeout(self, budget_s: float | None) -> float:
        limit = self.config.timeout_ms / 1000
        return limit if budget_s is None else min(limit, budget_s)

    async def _ensure_init(self, budget_s: float | None) -> bool:
        if self.initialized:
            return True
        reply = await self._request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                                   "clientInfo": {"name": "llama.cpp", "version": "1.0"}},
                                    self._timeout(budget_s))
        if "result" not in reply:
            self.last_error = f"initialize failed: {_rpc_error(reply)}"
            return False
        self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.initialized = True
        return True

    async def list_tools(self, budget_s: float) -> list[McpToolDef]:
        """Its tools (initialising first); none when it fails."""
        async with self.lock:
            if not await self._ensure_init(budget_s):
                return []
            reply = await self._request("tools/list", None, self._timeout(budget_s))
        result = reply.get("result")
        if not isinstance(result, dict):
            self.last_error = f"tools/list failed: {_rpc_error(reply)}"
            return []
        tools = result.get("tools")
        tools = tools if isinstance(tools, list) else []
        return [McpToolDef(self.config.name, str(t.get("name", "")), str(t.get("description", "")),
                           t.get("inputSchema")) for t in tools if isinstance(t, dict)]

    async def call_tool(self, tool: str, arguments: dict) -> dict:
        """tools/call, answered as /tools answers: plain_text_response, or error."""
        async with self.lock:
            if not await self._ensure_init(None):
                return {"error": self.last_error}
            reply = await self._request("tools/call", {"name": tool, "arguments": arguments}, self._timeout(None))
        if "error" in reply:
            return {"error": _rpc_error(reply)}
        if "result" in reply:
            return result_to_response(reply["result"])
        return {"error": "invalid response from MCP server"}

    def close(self, reason: str = "cancelled") -> None:
        """Fail what waits, kill its process group, close the pipes; never waits for an EOF."""
        self._fail_pending(reason)
        self.alive = False
        if self.transport is None:
            return
        pid = self.transport.get_pid()
        if pid:  # the whole group: a grandchild holding the pipes goes too
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.transport.close()


class McpManager:
    """Every configured MCP server: the tools found at start-up, sessions spawned on demand."""

    def __init__(self, servers: list[McpServerConfig]) -> None:
        self.servers = {s.name: s for s in servers}
        self.registry: list[McpToolDef] = []
        self.sessions: dict[str, McpSession] = {}
        self.dead_until: dict[str, float] = {}
        self.stopping = False
        self.lock = asyncio.Lock()

    @property
    def empty(self) -> bool:
        """True when no server is configured."""
        return not self.servers

    async def warmup(self) -> None:
        """Spawn each server, list its tools (10 s at most), shut it down; the tools found are served."""
        found = await asyncio.gather(*(self._discover(s) for s in self.servers.values()))
        self.registry = [tool for tools in found for tool in tools]

    async def _discover(self, config: McpServerConfig) -> list[McpToolDef]:
        session = McpSession(config)
        if not await session.start():
            print(f"srv   MCP warmup: failed to spawn '{config.name}': {session.last_error}", flush=True)
            return []
        try:
            tools = await session.list_tools(WARMUP_TIMEOUT_S)
        finally:
            session.close()
        print(f"srv   MCP warmup: '{config.name}' discovered {len(tools)} tools", flush=True)
        return tools

    async def call_tool(self, server: str, tool: str, arguments: dict) -> dict:
        """Call a tool of `server`, spawning it when it is not running."""
        session = await self._session(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}
        return await session.call_tool(tool, arguments)

    async def _session(self, name: str) -> McpSession | None:
        """The live session of `name`, respawned when dead; None while stopping or cooling down."""
        async with self.lock:
            loop = asyncio.get_running_loop()
            if self.stopping or loop.time() < self.dead_until.get(name, 0.0):
                return None
            session = self.sessions.get(name)
            if session is not None and session.alive:
                return session
            if session is not None:
                session.close("transport closed")
            config = self.servers.get(name)
            if config is None:
                return None
            fresh = McpSession(config)
            if not await fresh.start():
                self.dead_until[name] = loop.time() + COOLDOWN_S
                self.sessions.pop(name, None)
                return None
            self.sessions[name] = fresh
            return fresh

    def shutdown(self) -> None:
        """Fail the calls in flight and kill every server; later calls find the servers unavailable."""
        self.stopping = True
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()
