"""Process-tree CPU accounting from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.peers.procs import CLK_TCK, parse_stat, tree_cpu_s, tree_pids


def test_stat_fields_are_read_after_a_name_with_spaces_and_parentheses() -> None:
    text = f"4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 {3 * CLK_TCK} {CLK_TCK} 0 0 20 0 1 0"
    assert parse_stat(text) == (17, 4.0)


def test_tree_holds_every_descendant_and_nothing_else() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert tree_pids(10, parents) == {10, 11, 12, 13}
    assert tree_pids(13, parents) == {13}


def test_tree_cpu_counts_a_busy_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                              "while time.process_time()-t<0.3: pass\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        while tree_cpu_s(child.pid) < 0.25:  # the child burns 0.3 s of CPU, then waits
            pass
        assert tree_cpu_s(os.getpid()) >= tree_cpu_s(child.pid) >= 0.25
    finally:
        child.communicate(b"")
    assert child.returncode == 0


def test_stat_of_this_process_parses() -> None:
    with open(f"/proc/{os.getpid()}/stat") as f:
        ppid, cpu = parse_stat(f.read())
    assert ppid == os.getppid()
    assert cpu == pytest.approx(sum(os.times()[:2]), abs=0.05)
