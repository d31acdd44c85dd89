"""llama-server's built-in agent tools (tools/server/server-tools.cpp), served at /tools with `--tools`:
read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info, with
the real server's definitions, result fields (`plain_text_response`, `result`, `entries`, `error`),
wording and limits (16 KB reads and command output, 100 search results, 60 s command time limit).

They act on THIS host, as the real ones do (read and write any file the server's user can, run any
shell command): off unless `--tools` names them, for local use only, never on a shared machine.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fake_engines.llamacpp import tools_edit
from fake_engines.llamacpp.tools_io import KINDS, make_io, path_glob_match

READ_FILE_MAX_SIZE = 16 * 1024
"""Bytes read_file returns without a line range."""
READ_FILE_MAX_SIZE_BASE64 = 32 * 2**20
"""Bytes of a file read_file returns as base64 (`x-resp-type: base64`)."""
SEARCH_MAX_RESULTS = 100
"""Entries file_glob_search and matches grep_search return at most."""
EXEC_MAX_OUTPUT = 16 * 1024
"""Bytes of a command's output kept."""
EXEC_MAX_TIMEOUT_S = 60
"""Longest a command may run (its `timeout` is capped here; default 10 s)."""

Stream = Callable[[str], Awaitable[bool]]
"""Pushes one chunk of a streamed tool call; False once the client has gone."""


class ToolParamError(ValueError):
    """A parameter nlohmann::json refuses (missing, wrong type): 400 invalid_request_error."""


@dataclass(frozen=True)
class Tool:
    """One tool of /tools: what GET lists, and how POST invokes it."""

    name: str
    """What POST /tools names in `tool`."""
    display_name: str
    """For the web UI."""
    definition: dict
    """Its function-calling definition, as a chat request's `tools` entry."""
    invoke: Callable[[dict, Stream | None], Awaitable[dict | None]]
    """Runs it with the request's params; None when it streamed its result."""
    uses_cwd: bool = True
    """Resolves paths against `x-tool-cwd`."""
    permission_write: bool = False
    """Changes files or runs commands."""
    support_stream: bool = False
    """Accepts `stream: true`."""
    kind: str = "builtin"
    """`type` in the listing: builtin, or mcp."""

    def to_json(self) -> dict:
        """The GET /tools entry."""
        return {"display_name": self.display_name, "tool": self.name, "type": self.kind,
                "permissions": {"write": self.permission_write}, "uses_cwd": self.uses_cwd,
                "definition": self.definition}


_JSON_TYPES = {str: "string", bool: "boolean", int: "number", float: "number", list: "array", dict: "object",
               type(None): "null"}


def required(params: dict, key: str, kind: type = str):
    """`params.at(key).get<kind>()`, with nlohmann's exception text."""
    if key not in params:
        raise ToolParamError(f"[json.exception.out_of_range.403] key '{key}' not found")
    value = params[key]
    if not isinstance(value, kind):
        raise ToolParamError(f"[json.exception.type_error.302] type must be {_JSON_TYPES[kind]}, "
                             f"but is {_JSON_TYPES.get(type(value), 'number')}")
    return value


def value(params: dict, key: str, default):
    """llama-server's json_value: the default when absent, null or of another type."""
    got = params.get(key)
    if isinstance(default, bool):
        return got if isinstance(got, bool) else default
    if isinstance(default, int):
        return int(got) if isinstance(got, int | float) and not isinstance(got, bool) else default
    return got if isinstance(got, type(default)) else default


def _lines(content: bytes) -> list[bytes]:
    """std::getline's lines: a last line without a newline counts, a final newline opens none."""
    parts = content.split(b"\n")
    return parts[:-1] if parts[-1] == b"" else parts


async def read_file(params: dict, _: Stream | None = None) -> dict:
    """A file's text (or a 1-based line range, optionally numbered `N→`), or base64 with x-resp-type."""
    path = required(params, "path")
    start, end = value(params, "start_line", 1), value(params, "end_line", -1)
    io = make_io(params)
    size = await io.file_size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if value(params, "resp_type", "") == "base64":
        if size > READ_FILE_MAX_SIZE_BASE64:
            return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE_BASE64})"}
    elif size > READ_FILE_MAX_SIZE and end == -1:
        return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE}). "
                         "Use start_line/end_line to read a portion."}
    content = await io.read(path)
    if content is None:
        return {"error": f"failed to open file: {path}"}
    if value(params, "resp_type", "") == "base64":
        return {"base64": base64.b64encode(content).decode(), "size_bytes": len(content)}
    numbered, out = value(params, "append_loc", False), bytearray()
    for lineno, line in enumerate(_lines(content), 1):
        if lineno < start:
            continue
        if end != -1 and lineno > end:
            break
        piece = (f"{lineno}\u2192".encode() if numbered else b"") + line + b"\n"
        if len(out) + len(piece) > READ_FILE_MAX_SIZE:
            out += b"[output truncated]"
            break
        out += piece
    return {"plain_text_response": out.decode("utf-8", errors="replace")}


async def file_glob_search(params: dict, _: Stream | None = None) -> dict:
    """Entries under a directory matching a glob, directories suffixed `/`, at most `limit` (≤ 100)."""
    io = make_io(params)
    path = required(params, "path")
    base = io.resolve(path)
    include, exclude = value(params, "include", "**"), value(params, "exclude", "")
    kind, max_depth = value(params, "type", "file"), max(0, value(params, "max_depth", 0))
    limit = value(params, "limit", SEARCH_MAX_RESULTS)
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    if kind not in KINDS:
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    listing = await io.list_entries(base, max_depth, kind)
    if listing.err:
        return {"error": f"{listing.err}: {path}"}
    matches = [(rel, is_dir) for rel, is_dir in listing.entries
               if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
    shown = matches[:min(limit, SEARCH_MAX_RESULTS)]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                 "Refine the glob pattern to narrow the search.]\n")
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    entries = [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


async def grep_search(params: dict, _: Stream | None = None) -> dict:
    """Lines matching a regex in a file or under a directory (`path:line`, `-n`-style numbers and
    context on request), at most 100 matches."""
    path, pattern = required(params, "path"), required(params, "pattern")
    include, exclude = value(params, "include", "**"), value(params, "exclude", "")
    context = max(0, value(params, "context_lines", 0))
    numbered = value(params, "return_line_numbers", False) or context > 0
    try:
        regex = re.compile(re.escape(pattern) if value(params, "literal", False) else pattern,
                           re.IGNORECASE if value(params, "ignore_case", False) else 0)
    except re.error as exc:
        return {"error": f"invalid regex: {exc}"}
    io = make_io(params)
    full = io.resolve(path)
    if await io.is_file(full):
        files = [(full, path)]
    elif await io.is_dir(full):
        listing = await io.list_entries(full, 0, "file")
        files = [(f"{full.rstrip('/')}/{rel}", rel) for rel, _ in listing.entries
                 if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
    else:
        return {"error": f"path does not exist: {path}"}
    out: list[str] = []
    total = 0
    for absolute, shown in files:
        content = await io.read(absolute)
        if content is None:
            continue
        total = _grep(content, shown, regex, context, numbered, out, total)
        if total > SEARCH_MAX_RESULTS:
            break
    capped = total > SEARCH_MAX_RESULTS
    text = "".join(out) + f"\n---\nTotal matches: {min(total, SEARCH_MAX_RESULTS)}\n"
    if capped:
        text += f"[{SEARCH_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def _grep(content: bytes, shown: str, regex: re.Pattern[str], context: int, numbered: bool, out: list[str],
          total: int) -> int:
    """Append one file's matches to `out`; the running total, past SEARCH_MAX_RESULTS when a match
    was left out for the cap."""
    lines = [line.decode("utf-8", errors="replace") for line in _lines(content)]
    for i, line in enumerate(lines):
        if total >= SEARCH_MAX_RESULTS:  # as llama-server: any further line reports the cap
            return total + 1
        if not regex.search(line):
            continue
        for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
            mark = ":" if j == i else "-"
            out.append(f"{shown}{mark}{f'{j + 1}{mark}' if numbered else ''}{lines[j]}\n")
        if context:
            out.append("--\n")
        total += 1
    return total


async def exec_shell_command(params: dict, stream: Stream | None = None) -> dict | None:
    """`sh -c command` in the tool cwd: output (stdout and stderr) then `[exit code: N]`."""
    command = required(params, "command")
    timeout = min(value(params, "timeout", 10), EXEC_MAX_TIMEOUT_S)
    max_output = value(params, "max_output_size", EXEC_MAX_OUTPUT)
    max_output = EXEC_MAX_OUTPUT if max_output < 0 else min(max_output, EXEC_MAX_OUTPUT)
    io = make_io(params)

    async def chunk(data: bytes) -> bool:
        assert stream is not None
        return await stream(data.decode("utf-8", errors="replace"))

    res = await io.run(["sh", "-c", command], max_output, timeout, chunk if stream else None)
    tail = f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
    if stream is not None:
        await stream(tail)
        return None
    return {"plain_text_response": res.output.decode("utf-8", errors="replace") + tail}


async def write_file(params: dict, _: Stream | None = None) -> dict:
    """Create or replace a file (and its parent directories)."""
    path, content = required(params, "path"), required(params, "content")
    data = content.encode()
    if not await make_io(params).write(path, data):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


async def edit_file(params: dict, _: Stream | None = None) -> dict:
    """Exact (else whitespace- and quote-tolerant) replacements, each old_text unique, none overlapping."""
    path = required(params, "path")
    if "edits" not in params:
        raise ToolParamError("[json.exception.out_of_range.403] key 'edits' not found")
    edits = params["edits"]
    if not isinstance(edits, list) or not edits:
        return {"error": '"edits" must be a non-empty array'}
    pairs = []
    for i, item in enumerate(edits):
        if not isinstance(item, dict):
            raise ToolParamError("[json.exception.type_error.304] cannot use at() with "
                                 f"{_JSON_TYPES.get(type(item), 'number')}")
        old, new = required(item, "old_text"), required(item, "new_text")
        if not old:
            return {"error": f"edits[{i}].old_text must not be empty"}
        pairs.append((old, new))
    io = make_io(params)
    original = await io.read(path)
    if original is None:
        return {"error": f"failed to open file: {path}"}
    edited = tools_edit.apply_edits(original, path, pairs)
    if isinstance(edited, dict):
        return edited
    if not await io.write(path, edited):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(pairs)}


async def get_info(params: dict, _: Stream | None = None) -> dict:
    """The OS (`uname -a`) and the working directory tools run in."""
    io = make_io(params)
    res = await io.run(["uname", "-a"], 4096, 5)
    os_info = res.output.decode(errors="replace").strip() if res.exit_code == 0 and not res.timed_out else "unknown"
    cwd = value(params, "cwd", "")
    if not cwd and value(params, "runtime", ""):
        pwd = await io.run(["pwd"], 4096, 5)
        cwd = pwd.output.decode(errors="replace").strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
    return {"os": os_info, "cwd": cwd or os.getcwd()}


def build_tools() -> list[Tool]:
    """Every built-in tool, in llama-server's order."""
    from fake_engines.llamacpp.tools_defs import DEFINITIONS

    impl = {"read_file": ("Read file", read_file, False, False),
            "file_glob_search": ("File search", file_glob_search, False, False),
            "grep_search": ("Grep search", grep_search, False, False),
            "exec_shell_command": ("Execute shell command", exec_shell_command, True, True),
            "write_file": ("Write file", write_file, True, False),
            "edit_file": ("Edit file", edit_file, True, False),
            "get_info": ("Get Runtime Info", get_info, False, False)}
    return [Tool(name, display, DEFINITIONS[name], fn, permission_write=write, support_stream=streams)
            for name, (display, fn, write, streams) in impl.items()]


TOOL_NAMES = ("read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file",
              "get_info")
"""What `--tools` accepts (besides `all`), as its help lists them."""
