"""The built-in tools' host work: llama.cpp's glob rules, path resolution, runtime checks, and
commands bounded in time and output."""

from __future__ import annotations

import pytest

from fake_engines.llamacpp.tools_io import (
    ToolRuntimeError,
    check_runtime,
    path_glob_match,
    resolve,
    run_command,
)
from tests.waiting import wait_until


def test_globs_match_base_names_without_a_slash_and_anchor_paths_with_one():
    assert path_glob_match("*.py", "a/b/test_x.py") and not path_glob_match("*.py", "a/b.pyc")
    assert path_glob_match("test_?.py", "deep/test_1.py") and not path_glob_match("test_?.py", "test_12.py")
    assert path_glob_match("src/*.cpp", "x/src/main.cpp")  # auto-anchored with **/
    assert not path_glob_match("src/*.cpp", "src/sub/main.cpp")  # * stays in one part
    assert path_glob_match("src/**/*.cpp", "src/sub/deep/main.cpp") and path_glob_match("src/**/*.cpp", "src/m.cpp")
    assert path_glob_match("*proj*", "project-alpha") and path_glob_match("[ab]*.txt", "a1.txt")
    assert not path_glob_match("[!ab]*.txt", "a1.txt") and path_glob_match("**", "any/thing")


def test_paths_resolve_against_the_cwd_and_runtimes_are_checked_as_llama_server_does(tmp_path):
    assert resolve("sub/../x.txt", str(tmp_path)) == str(tmp_path / "x.txt")
    assert resolve("/abs/./y", str(tmp_path)) == "/abs/y"
    check_runtime("")  # the host
    check_runtime("ssh:user@build-1.example")
    check_runtime("docker-container:3f2a_b.c-d")
    for spec, message in (("fake:x", "unknown tool runtime: fake:x"), ("ssh:-oX=1", "invalid ssh target: -oX=1"),
                          ("podman-container:-rm", "invalid container id: -rm"),
                          ("docker:busybox", "tool runtime must name a running container: docker:busybox")):
        with pytest.raises(ToolRuntimeError) as err:
            check_runtime(spec)
        assert str(err.value) == message


async def test_commands_keep_the_first_bytes_and_die_with_their_children_at_the_time_limit(tmp_path):
    capped = await run_command(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; echo done"], 100, 10)
    assert capped.output == b"x" * 100 + b"\n[output truncated]" and capped.exit_code == 0
    pid_file = tmp_path / "child.pid"
    killed = await run_command(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; echo up; wait"], 100, 0.5)
    assert (killed.output, killed.exit_code, killed.timed_out) == (b"up\n", 1, True)
    child = int(pid_file.read_text())
    assert await wait_until(lambda: _dead(child), what="the background child went with its group")
    assert (await run_command(["/nonexistent/binary"], 100, 1)).output == b"failed to spawn process"


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
