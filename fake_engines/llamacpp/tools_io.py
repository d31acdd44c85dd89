"""Where llama-server's built-in tools touch the machine (tools/server/server-tools.cpp `tools_io`):
this host (HostIO), or an isolate a runtime names (tools_isolate.py). Paths resolve against the
`x-tool-cwd` directory; listings come from git's file list, else a bounded walk that never descends
into junk directories; globs follow llama.cpp's; commands run with a time limit and an output cap.
HostIO acts on THIS host, as the real server's tools do: they exist only behind `--tools` and are
for local use only.

File system work runs in worker threads and commands are asyncio subprocesses, so a slow disk or a
long command never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fake_engines.llamacpp.tools_isolate import IsolateIO

GIT_LS_FILES_MAX_OUTPUT = 8 * 2**20
"""Bytes of `git ls-files` output read for one listing."""
LIST_ENTRIES_TIMEOUT_S = 15
"""Budget of one listing call (git, then the walker)."""
JUNK_DIR_NAMES = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist",
                            "build", "target", ".cache", ".idea", ".vscode"})
"""Directories a listing reports but never walks: they can be enormous."""
KINDS = ("file", "dir", "all")
"""Entry kinds a listing returns: regular files, directories, both."""


class ToolRuntimeError(RuntimeError):
    """A tool runtime the server refuses (answered 500 server_error with this text)."""


@dataclass(frozen=True)
class ExecResult:
    """What a command left: its output (stdout and stderr together), exit code, whether it timed out."""

    output: bytes
    """Output up to the cap, then `\\n[output truncated]` when cut."""
    exit_code: int = -1
    """The exit status; -1 when it could not be spawned, 1 when a signal ended it."""
    timed_out: bool = False
    """True when the time limit killed it."""


@dataclass
class Listing:
    """Entries under a base directory."""

    entries: list[tuple[str, bool]] = field(default_factory=list)
    """('/'-separated path relative to the base, is a directory)."""
    err: str = ""
    """Set when the base is not a directory."""
    truncated: bool = False
    """The walk ran out of time or met an unreadable directory."""


class HostIO:
    """Tool I/O on this host (llama-server's tools_io_basic): paths against `cwd`, blocking file work
    in worker threads, commands in `cwd`."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        """Absolute, against the cwd."""
        return resolve(path, self.cwd)

    async def is_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    async def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        """Bytes of a regular file; None when it cannot be stat'ed (or is a directory)."""
        full = self.resolve(path)
        try:
            return os.stat(full).st_size if os.path.isfile(full) else None
        except OSError:
            return None

    async def read(self, path: str) -> bytes | None:
        return await asyncio.to_thread(_read_bytes, self.resolve(path))

    async def write(self, path: str, data: bytes) -> bool:
        return await asyncio.to_thread(_write_bytes, self.resolve(path), data)

    async def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        return await list_entries(self.resolve(base), max_depth, kind)

    async def run(self, args: list[str], max_output: int, timeout_s: float,
                  on_chunk: Callable[[bytes], Awaitable[bool]] | None = None) -> ExecResult:
        return await run_command(args, max_output, timeout_s, self.cwd, on_chunk)


def _read_bytes(full: str) -> bytes | None:
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError:
        return None


def _write_bytes(full: str, data: bytes) -> bool:
    """Write `data` to `full`, creating its parent directories."""
    try:
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    except OSError:
        return False
    return True


def make_io(params: dict) -> HostIO | IsolateIO:
    """llama-server's make_tools_io: the host for an empty `runtime`, else the isolate it names
    (a running container, an ssh target); raises ToolRuntimeError for anything else, never
    falling back to the host."""
    from fake_engines.llamacpp.tools_isolate import isolate_io

    cwd, runtime = params.get("cwd") or "", params.get("runtime") or ""
    if not isinstance(cwd, str) or not isinstance(runtime, str):
        raise ToolRuntimeError("cwd and runtime must be strings")
    return HostIO(cwd) if not runtime else isolate_io(runtime, cwd)


def check_runtime(spec: str) -> None:
    """Refuse a tool runtime llama-server would refuse (`x-tool-runtime`, `--tools-runtime`)."""
    make_io({"runtime": spec})


def resolve(path: str, cwd: str = "") -> str:
    """`~` expanded, made absolute against `cwd` (else the server's directory), `.`/`..` dropped."""
    if path.startswith("~") and (len(path) == 1 or path[1] == "/"):
        path = os.environ.get("HOME", "~") + path[1:]
    full = Path(path) if os.path.isabs(path) else Path(cwd or os.getcwd()) / path
    return os.path.normpath(full)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """llama.cpp's glob_match as a regex: `**` (with a following `/`) spans directories, `*` and `?`
    stay within one path part, `[...]` is a class."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 3 if pattern.startswith("**/", i) else 2
            out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 2:] + pattern[i + 1:i + 2]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            negate = body[:1] in ("!", "^")
            out.append("[" + ("^" if negate else "") + re.escape(body[1:] if negate else body).replace("\\-", "-") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def path_glob_match(pattern: str, rel: str) -> bool:
    """No `/` in the pattern: match the base name at any depth; else the whole relative path,
    anchored with `**/` unless it already is."""
    if "/" not in pattern:
        return glob_regex(pattern).fullmatch(rel.rsplit("/", 1)[-1]) is not None
    if not (pattern == "**" or pattern.startswith("**/") or pattern.startswith("/")):
        pattern = "**/" + pattern
    return glob_regex(pattern).fullmatch(rel) is not None


async def list_entries(base: str, max_depth: int, kind: str) -> Listing:
    """Entries under an absolute `base`; `max_depth` 0 is unlimited, 1 the direct children.

    Files come from `git ls-files` (so .gitignore applies) inside a repository, else from the walk."""
    if not os.path.isdir(base):
        return Listing(err="path does not exist or is not a directory")
    deadline = time.monotonic() + LIST_ENTRIES_TIMEOUT_S
    if kind == "file":
        res = await run_command(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                                GIT_LS_FILES_MAX_OUTPUT, LIST_ENTRIES_TIMEOUT_S)
        if res.exit_code == 0 and not res.timed_out:
            return Listing(entries=await asyncio.to_thread(_git_files, base, res.output, max_depth))
    return await asyncio.to_thread(_walk, base, max_depth, kind, deadline)


def _git_files(base: str, output: bytes, max_depth: int) -> list[tuple[str, bool]]:
    lines = output.decode("utf-8", errors="replace").replace("\\", "/").splitlines()
    return [(rel, False) for rel in lines
            if rel and (max_depth <= 0 or rel.count("/") + 1 <= max_depth) and os.path.isfile(os.path.join(base, rel))]


def _walk(base: str, max_depth: int, kind: str, deadline: float) -> Listing:
    """Depth-first with a stack, as llama-server's walker: links are listed but never followed."""
    out = Listing()
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        directory, rel_dir, depth = stack.pop()
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            out.truncated = True
            continue
        for entry in children:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                if kind != "file":
                    out.entries.append((rel, True))
                if entry.name in JUNK_DIR_NAMES or entry.is_symlink():
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif kind != "dir" and entry.is_file():
                out.entries.append((rel, False))
    return out


async def run_command(args: list[str], max_output: int, timeout_s: float, cwd: str = "",
                      on_chunk: Callable[[bytes], Awaitable[bool]] | None = None, *,
                      stdin_data: bytes | None = None, merge_stderr: bool = True) -> ExecResult:
    """Run `args` with stdout and stderr merged (stderr dropped with `merge_stderr=False`, when the
    bytes are a file's), keep the first `max_output` bytes (draining the rest so the child never
    blocks), kill its process group after `timeout_s`. `stdin_data` is written, then stdin closed.

    `on_chunk` sees each piece as it arrives; returning False (the client left) ends the command."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL if stdin_data is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.DEVNULL,
            cwd=cwd or None, start_new_session=True)
    except OSError:
        return ExecResult(b"failed to spawn process")
    assert proc.stdout is not None
    if proc.stdin is not None:
        proc.stdin.write(stdin_data or b"")
        proc.stdin.close()  # a client waits for EOF on its stdin before it exits
    output, truncated, timed_out, aborted = bytearray(), False, False, False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_s, 0)
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(proc.stdout.read(4096), timeout=max(deadline - loop.time(), 0))
            except TimeoutError:
                timed_out = True
                break
            if not chunk:
                break
            if truncated:
                continue
            keep = chunk[:max_output - len(output)]
            output += keep
            truncated = len(keep) < len(chunk)
            if on_chunk is not None and keep and not await on_chunk(bytes(keep)):
                aborted = True
                break
        if not timed_out and not aborted:
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(deadline - loop.time(), 0))
            except TimeoutError:
                timed_out = True
    finally:
        _kill_group(proc)
    code = await _reap(proc)
    if truncated:
        output += b"\n[output truncated]"
    return ExecResult(bytes(output), code, timed_out)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command and everything it started (it leads its own session)."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def _reap(proc: asyncio.subprocess.Process) -> int:
    """The exit code; a process a signal ended reads 1, as subprocess.h reports it."""
    try:
        code = await asyncio.wait_for(proc.wait(), timeout=5)
    except TimeoutError:  # something outside the group still holds the pipe
        return -1
    return 1 if code < 0 else code
