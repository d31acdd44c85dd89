"""/tools of the fake llama-server over real sockets: off (403) without --tools, the built-in tools'
listing, results, errors and statuses as llama-server answers them (tools/server/server-tools.cpp),
the x-tool-cwd / x-tool-runtime headers and the streamed shell command."""

from __future__ import annotations

import json
import os
import stat

import aiohttp
import pytest

from fake_engines.factory.llamacpp_config import config_from_args
from fake_engines.llamacpp.cli import build_parser
from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.server import start_llama
from fake_engines.llamacpp.tools_route import TOOLS_KEY, build_endpoint


def _config(**overrides) -> LlamaServerConfig:
    base = {"model": "llama-3.1-8b-Q4_K_M.gguf", "port": 0, "time_scale": 0.01, "n_parallel": 1, "n_ctx": 512}
    return LlamaServerConfig(**{**base, **overrides})


async def _served(config: LlamaServerConfig):
    running = await start_llama(config, cold_start=False)
    running.server.ready = True
    return running, f"http://127.0.0.1:{running.port}/tools"


async def _call(session, url: str, tool: str, params: dict, headers: dict | None = None) -> tuple[int, dict]:
    async with session.post(url, json={"tool": tool, "params": params}, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_tools_are_off_without_the_flag_and_only_the_named_ones_with_it():
    running, url = await _served(_config())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as resp:
                off_get = resp.status, await resp.json()
            off_post = await _call(s, url, "exec_shell_command", {"command": "true"})
    finally:
        await running.close()
    assert off_get == off_post[:1] + (off_get[1],)
    assert off_get == (403, {"error": {"message": "this feature is disabled", "type": "feature_disabled"}})
    running, url = await _served(_config(server_tools=("read_file", "grep_search")))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as resp:
                listed = await resp.json()
            shell = await _call(s, url, "exec_shell_command", {"command": "true"})
    finally:
        await running.close()
    assert [t["tool"] for t in listed] == ["read_file", "grep_search"]
    assert listed[0] == {"display_name": "Read file", "tool": "read_file", "type": "builtin",
                         "permissions": {"write": False}, "uses_cwd": True, "definition": listed[0]["definition"]}
    assert listed[0]["definition"]["function"]["parameters"]["required"] == ["path"]
    assert shell == (404, {"error": {"code": 400, "message": 'unknown tool "exec_shell_command"',
                                     "type": "invalid_request_error"}})
    with pytest.raises(ServerConfigError, match='unknown tool "rm_rf"'):
        build_endpoint(_config(server_tools=("rm_rf",)))
    with pytest.raises(ServerConfigError, match="unknown tool runtime: fake:x"):
        build_endpoint(_config(server_tools=("all",), tools_runtime="fake:x"))


async def test_file_tools_resolve_against_x_tool_cwd_and_answer_as_llama_server(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "dup.txt").write_text("dup\ndup\n")
    headers = {"x-tool-cwd": str(work)}
    running, url = await _served(_config(server_tools=("all",)))
    try:
        async with aiohttp.ClientSession() as s:
            wrote = await _call(s, url, "write_file", {"path": "sub/a.log", "content": "line1\nline2\nline3\n",
                                                        "cwd": "/not/a/dir"}, headers)
            edited = await _call(s, url, "edit_file", {"path": "sub/a.log", "edits": [
                {"old_text": "line2", "new_text": "line2-edited"}, {"old_text": "line3\n", "new_text": "line3\nline4\n"}]},
                headers)
            read = await _call(s, url, "read_file", {"path": "sub/a.log", "start_line": 2, "append_loc": True}, headers)
            not_unique = await _call(s, url, "edit_file", {"path": "dup.txt", "edits": [{"old_text": "dup",
                                                                                          "new_text": "x"}]}, headers)
            overlap = await _call(s, url, "edit_file", {"path": "sub/a.log", "edits": [
                {"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2", "new_text": "b"}]}, headers)
            missing = await _call(s, url, "read_file", {"path": "nope.txt"}, headers)
            no_path = await _call(s, url, "read_file", {}, headers)
    finally:
        await running.close()
    assert wrote == (200, {"result": "file written successfully", "path": "sub/a.log", "bytes": 18})
    assert edited == (200, {"result": "file edited successfully", "path": "sub/a.log", "edits_applied": 2})
    assert (work / "sub" / "a.log").read_text() == "line1\nline2-edited\nline3\nline4\n"
    assert read == (200, {"plain_text_response": "2\u2192line2-edited\n3\u2192line3\n4\u2192line4\n"})
    assert not_unique == (200, {"error": "found 2 occurrences of edits[0].old_text in dup.txt, it must be unique"})
    assert overlap[1]["error"].startswith("edits[0] and edits[1] overlap in sub/a.log")
    assert missing == (200, {"error": "cannot stat file: nope.txt"})
    assert no_path[0] == 400 and no_path[1]["error"]["message"] == "[json.exception.out_of_range.403] key 'path' not found"


async def test_searches_skip_junk_directories_and_count_what_they_cut(tmp_path):
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("needle")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "top.txt").write_text("top needle\n")
    (tmp_path / "a" / "mid.txt").write_text("x\nmid needle\ny\n")
    (tmp_path / "a" / "b" / "deep.cpp").write_text("deep")
    base = str(tmp_path)
    running, url = await _served(_config(server_tools=("all",)))
    try:
        async with aiohttp.ClientSession() as s:
            dirs = (await _call(s, url, "file_glob_search", {"path": base, "type": "dir"}))[1]
            shallow = (await _call(s, url, "file_glob_search", {"path": base, "max_depth": 1}))[1]
            limited = (await _call(s, url, "file_glob_search", {"path": base, "limit": 1}))[1]
            cpp = (await _call(s, url, "file_glob_search", {"path": base, "include": "a/**/*.cpp"}))[1]
            bogus = (await _call(s, url, "file_glob_search", {"path": base, "type": "bogus"}))[1]
            grep = (await _call(s, url, "grep_search", {"path": base, "pattern": "need.e", "include": "*.txt",
                                                         "return_line_numbers": True}))[1]
            context = (await _call(s, url, "grep_search", {"path": base + "/a/mid.txt", "pattern": "mid",
                                                            "context_lines": 1}))[1]
    finally:
        await running.close()
    assert {e["path"]: e["type"] for e in dirs["entries"]} == {"a": "dir", "a/b": "dir", "build": "dir"}
    assert "a/b/\n" in dirs["plain_text_response"] and dirs["base"] == base
    assert [e["path"] for e in shallow["entries"]] == ["top.txt"]
    assert len(limited["entries"]) == 1 and "Total matches: 3" in limited["plain_text_response"]
    assert "[1 results limit reached (3 total matches)." in limited["plain_text_response"]
    assert [e["path"] for e in cpp["entries"]] == ["a/b/deep.cpp"]
    assert bogus == {"error": 'invalid type: bogus (expected "file", "dir" or "all")'}
    assert sorted(grep["plain_text_response"].split("\n---\n")[0].splitlines()) == ["a/mid.txt:2:mid needle",
                                                                                  "top.txt:1:top needle"]
    assert grep["plain_text_response"].endswith("Total matches: 2\n")  # build/ is never walked
    assert context["plain_text_response"].startswith(f"{base}/a/mid.txt-1-x\n{base}/a/mid.txt:2:mid needle\n")


async def test_shell_command_streams_runs_in_the_cwd_and_runtimes_never_fall_back_to_the_host(tmp_path):
    running, url = await _served(_config(server_tools=("all",)))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json={"tool": "exec_shell_command", "params": {"command": "echo a; echo b >&2"},
                                         "stream": True}) as resp:
                events = [json.loads(line[6:]) for line in (await resp.text()).splitlines() if line]
            here = await _call(s, url, "exec_shell_command", {"command": "echo hi > marker.txt; pwd; exit 3"},
                               {"x-tool-cwd": str(tmp_path)})
            slow = await _call(s, url, "exec_shell_command", {"command": "echo started; sleep 30", "timeout": 1})
            async with s.post(url, json={"tool": "read_file", "params": {"path": "x"}, "stream": True}) as resp:
                no_stream = resp.status, await resp.json()
            runtimes = [await _call(s, url, "exec_shell_command", {"command": "echo hi"},
                                    {"x-tool-runtime": spec})
                        for spec in ("fake:does-not-exist", "ssh:-oProxyCommand=touch /tmp/pwned",
                                     "docker-container:--privileged")]
    finally:
        await running.close()
    assert "".join(e.get("chunk", "") for e in events) == "a\nb\n\n[exit code: 0]" and events[-1] == {"done": True}
    assert here == (200, {"plain_text_response": f"{tmp_path}\n\n[exit code: 3]"})
    assert (tmp_path / "marker.txt").read_text() == "hi\n"
    assert slow == (200, {"plain_text_response": "started\n\n[exit code: 1] [exit due to timed out]"})
    assert no_stream[0] == 404 and no_stream[1]["error"]["message"] == 'tool "read_file" does not support stream = true'
    assert [r[0] for r in runtimes] == [500] * 3
    assert [r[1]["error"]["message"] for r in runtimes] == [
        "unknown tool runtime: fake:does-not-exist", "invalid ssh target: -oProxyCommand=touch /tmp/pwned",
        "invalid container id: --privileged"]
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.parametrize(("flags", "tools", "proxy"), [
    (["--tools", "read_file,grep_search"], ("read_file", "grep_search"), False),
    (["-ag"], ("all",), True), (["--agent", "--tools", "get_info"], ("get_info",), True),
    (["--agent", "-no-ag"], (), False), ([], (), False)])
def test_tools_and_agent_flags_read_as_llama_server_applies_them_in_order(flags, tools, proxy):
    config = config_from_args(build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf", *flags]))
    assert (config.server_tools, config.ui_mcp_proxy) == (tools, proxy)


FAKE_DOCKER = """#!/bin/sh
# a docker whose containers are this machine: `run ... --cidfile F IMAGE sh` writes the id and lives
# while its stdin is open, `exec [-i] ID CMD...` runs CMD here; each call is logged
case "$1" in
run)
    echo run >> "$FAKE_DOCKER_LOG"
    while [ "$1" != --cidfile ]; do shift; done
    echo c0ffee > "$2"
    exec cat > /dev/null ;;
exec)
    shift
    [ "$1" = -i ] && shift
    echo "exec $1" >> "$FAKE_DOCKER_LOG"
    shift
    exec "$@" ;;
esac
exit 125
"""


def _fake_docker(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker.log"))


async def test_a_container_runtime_runs_every_tool_through_docker_exec(tmp_path, monkeypatch):
    _fake_docker(tmp_path, monkeypatch)
    work = tmp_path / "work"
    headers = {"x-tool-runtime": "docker-container:c0ffee", "x-tool-cwd": str(work)}
    running, url = await _served(_config(server_tools=("all",)))
    try:
        async with aiohttp.ClientSession() as s:
            wrote = await _call(s, url, "write_file", {"path": "sub/test.log", "content": "hello container\n"}, headers)
            read = await _call(s, url, "read_file", {"path": "sub/test.log"}, headers)
            shell = await _call(s, url, "exec_shell_command", {"command": "cat sub/test.log; pwd"}, headers)
            found = await _call(s, url, "file_glob_search", {"path": "."}, headers)
            grep = await _call(s, url, "grep_search", {"path": ".", "pattern": "hello"}, headers)
            edit = await _call(s, url, "edit_file", {"path": "sub/test.log", "edits": [
                {"old_text": "hello", "new_text": "bye"}]}, headers)
    finally:
        await running.close()
    assert wrote[1]["result"] == "file written successfully" and edit[1]["edits_applied"] == 1
    assert read == (200, {"plain_text_response": "hello container\n"})
    assert shell == (200, {"plain_text_response": f"hello container\n{work}\n\n[exit code: 0]"})
    assert [e["path"] for e in found[1]["entries"]] == ["sub/test.log"] and found[1]["base"] == f"{work}/."
    assert grep[1]["plain_text_response"].startswith("sub/test.log:hello container\n")
    assert (work / "sub" / "test.log").read_text() == "bye container\n"
    assert set((tmp_path / "docker.log").read_text().splitlines()) == {"exec c0ffee"}  # all through the container


async def test_a_spawned_container_runtime_serves_every_call_respawns_and_goes_at_exit(tmp_path, monkeypatch):
    _fake_docker(tmp_path, monkeypatch)
    with pytest.raises(ServerConfigError, match="requires an image name"):
        build_endpoint(_config(server_tools=("all",), tools_runtime="docker:"))
    running, url = await _served(_config(server_tools=("all",), tools_runtime="docker:busybox"))
    container = running.app[TOOLS_KEY].container
    try:
        async with aiohttp.ClientSession() as s:
            first = await _call(s, url, "exec_shell_command", {"command": "echo hi"})
            container.proc.kill()  # the container died on its own
            await container.proc.wait()
            second = await _call(s, url, "exec_shell_command", {"command": "echo again"})
        client = container.proc
    finally:
        await running.close()
    assert first[1] == {"plain_text_response": "hi\n\n[exit code: 0]"}
    assert second[1] == {"plain_text_response": "again\n\n[exit code: 0]"}
    assert (tmp_path / "docker.log").read_text().splitlines() == ["run", "exec c0ffee", "run", "exec c0ffee"]
    assert client.returncode == 0 and container.proc is None  # stdin closed: the container's shell ended
