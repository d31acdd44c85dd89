"""Tool runtimes (server-tools.cpp `tools_io_isolate`): every tool operation run as a POSIX command
inside an isolate, a running container (`docker-container:ID`, `podman-container:ID`, through
`<engine> exec`) or a host reached over ssh (`ssh:TARGET`, batch mode, known host keys only). The
isolate must provide sh, cat, wc, mkdir, dirname, find and timeout. `--tools-runtime ENGINE:IMAGE`
makes the server spawn a container of its own for the tools and remove it at exit.

A container id and an ssh target are checked first: one starting with '-' would become an option of
`docker exec` or ssh (`--privileged`, `-oProxyCommand=...`) and run on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Awaitable, Callable

from fake_engines.llamacpp.tools_io import (
    GIT_LS_FILES_MAX_OUTPUT,
    JUNK_DIR_NAMES,
    ExecResult,
    Listing,
    ToolRuntimeError,
    run_command,
)

EXEC_TIMEOUT_S = 15
"""Limit of the helper commands (stat, cat, find, ...); a shell command has its own."""
READ_MAX_SIZE = 64 * 2**20
"""Bytes of a file read through the isolate."""
ENGINES = ("docker", "podman")
"""Container engines: one verb set, one implementation."""
SSH_ARGV = ("ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
            "-o", "StrictHostKeyChecking=yes")
"""No console here: a prompt would hang the call, so key-based auth and a trusted host key only."""


def container_spec(spec: str) -> tuple[str, str, bool] | None:
    """(engine, image or id, attach) of `<engine>:<image>` / `<engine>-container:<id>`, else None."""
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return engine, spec[len(engine) + len("-container:"):], True
        if spec.startswith(f"{engine}:"):
            return engine, spec[len(engine) + 1:], False
    return None


def isolate_io(spec: str, cwd: str = "") -> IsolateIO:
    """The isolate a runtime spec names; ToolRuntimeError for an unknown or unsafe one."""
    container = container_spec(spec)
    if container is not None:
        engine, cid, attach = container
        if not attach:  # spawning belongs to the runtime that owns the container
            raise ToolRuntimeError(f"tool runtime must name a running container: {spec}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", cid):
            raise ToolRuntimeError(f"invalid container id: {cid}")
        return IsolateIO(lambda inner, stdin: [engine, "exec", *(["-i"] if stdin else []), cid, *inner], cwd)
    if spec.startswith("ssh:"):
        target = spec[len("ssh:"):]
        if not target or target.startswith("-") or not re.fullmatch(r"[A-Za-z0-9._@-]+", target):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        # the remote shell parses the command line again: the argv travels as one quoted word
        return IsolateIO(lambda inner, stdin: [*SSH_ARGV, *([] if stdin else ["-n"]), target,
                                               " ".join(shell_quote(a) for a in inner)], cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {spec}")


def shell_quote(arg: str) -> str:
    """One word a POSIX shell reads back as `arg`."""
    return "'" + arg.replace("'", "'\\''") + "'"


class IsolateIO:
    """Tool I/O as commands run through `argv(inner, needs_stdin)`; POSIX paths, against `cwd`."""

    def __init__(self, argv: Callable[[list[str], bool], list[str]], cwd: str = "") -> None:
        self.argv = argv
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        return path if not self.cwd or path.startswith("/") else f"{self.cwd}/{path}"

    async def _exec(self, inner: list[str], max_output: int = 4096, merge_stderr: bool = True) -> ExecResult:
        return await run_command(self.argv(inner, False), max_output, EXEC_TIMEOUT_S, merge_stderr=merge_stderr)

    async def _ok(self, inner: list[str]) -> bool:
        res = await self._exec(inner)
        return res.exit_code == 0 and not res.timed_out

    async def is_file(self, path: str) -> bool:
        return await self._ok(["sh", "-c", '[ -f "$1" ]', "_", self.resolve(path)])

    async def is_dir(self, path: str) -> bool:
        return await self._ok(["sh", "-c", '[ -d "$1" ]', "_", self.resolve(path)])

    async def file_size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        try:
            return int(res.output) if res.exit_code == 0 and not res.timed_out else None
        except ValueError:
            return None

    async def read(self, path: str) -> bytes | None:
        res = await self._exec(["cat", "--", self.resolve(path)], READ_MAX_SIZE, merge_stderr=False)
        return res.output if res.exit_code == 0 and not res.timed_out else None

    async def write(self, path: str, data: bytes) -> bool:
        """The content travels on stdin: nothing for the far side to parse, no file on the host."""
        inner = ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)]
        res = await run_command(self.argv(inner, True), 4096, EXEC_TIMEOUT_S, stdin_data=data)
        return res.exit_code == 0 and not res.timed_out

    async def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        full = self.resolve(base)
        if not await self.is_dir(base):
            return Listing(err="path does not exist or is not a directory")
        if kind == "file":
            res = await self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard',
                                    "_", full], GIT_LS_FILES_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                return Listing(entries=[(rel, False) for rel in _lines(res.output, False)
                                        if max_depth <= 0 or rel.count("/") < max_depth])
        out = Listing()
        for dirs in ((True,) if kind == "dir" else (False,) if kind == "file" else (True, False)):
            rels, truncated = await self._find(full, max_depth, dirs)
            out.entries += [(rel, dirs) for rel in rels]
            out.truncated = out.truncated or truncated
        return out

    async def _find(self, full: str, max_depth: int, dirs: bool) -> tuple[list[str], bool]:
        """One `find` pass: junk directories listed but pruned; -mindepth/-maxdepth suit busybox too."""
        prune = " -o ".join(f"-name {name}" for name in sorted(JUNK_DIR_NAMES))
        cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "")
        cmd += f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if dirs else " -o -type f -print")
        res = await self._exec(["sh", "-c", cmd, "_", full], GIT_LS_FILES_MAX_OUTPUT)
        return _lines(res.output, True), res.timed_out

    async def run(self, args: list[str], max_output: int, timeout_s: float,
                  on_chunk: Callable[[bytes], Awaitable[bool]] | None = None) -> ExecResult:
        """Wrapped in the isolate's own `timeout` (killing the host-side client leaves the far side
        running), the host's limit 5 s later so that one ends first."""
        inner = ["timeout", f"{int(timeout_s)}s", *args]
        if self.cwd:  # no `-w` on every transport: the command changes directory itself
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return await run_command(self.argv(inner, True), max_output, timeout_s + 5, on_chunk=on_chunk, stdin_data=b"")


def _lines(output: bytes, strip_dot_slash: bool) -> list[str]:
    lines = [line.rstrip("\r").replace("\\", "/") for line in output.decode("utf-8", errors="replace").split("\n")]
    return [line[2:] if strip_dot_slash and line.startswith("./") else line for line in lines if line]


class SpawnedContainer:
    """`--tools-runtime ENGINE:IMAGE` (server-tools.cpp `server_tools_container_runtime`): the server
    runs `ENGINE run --rm -i --cidfile F IMAGE sh`, whose shell lives as long as its stdin stays
    open; tools attach to it by id; one that died is spawned again; at exit stdin is closed and
    `--rm` removes the container."""

    START_TIMEOUT_S = 10.0
    """How long the container id may take to appear."""

    def __init__(self, engine: str, image: str) -> None:
        self.engine, self.image = engine, image
        self.proc: asyncio.subprocess.Process | None = None
        self.cid = ""
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        """Spawn it and read its id; ToolRuntimeError when it does not come up."""
        cidfile = os.path.join(tempfile.gettempdir(), f"llama-tools-runtime-cid-{os.getpid()}-{id(self)}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.remove(cidfile)  # the engine refuses an existing cidfile
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        except OSError:
            raise ToolRuntimeError(f"failed to spawn {self.engine} container for tools runtime "
                                   f"(image: {self.image})") from None
        deadline = asyncio.get_running_loop().time() + self.START_TIMEOUT_S
        while not self.cid and asyncio.get_running_loop().time() < deadline and self.proc.returncode is None:
            with contextlib.suppress(OSError):
                with open(cidfile) as f:
                    self.cid = f.readline().strip()
            if not self.cid:
                await asyncio.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            os.remove(cidfile)
        if not self.cid:
            await self.close()
            raise ToolRuntimeError(f"timed out waiting for {self.engine} container to start (image: {self.image})")

    async def spec(self) -> str:
        """The runtime a tool call attaches to, the container spawned again if it died."""
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                print(f"srv    {self.engine} tools runtime container \"{self.cid}\" died, respawning", flush=True)
                self.cid = ""
                await self.start()
            return f"{self.engine}-container:{self.cid}"

    async def close(self) -> None:
        """Close its stdin (its shell exits, --rm removes it) and reap the client; kill it after 10 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
