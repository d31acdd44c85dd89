"""`flotilla compose` as a user runs it: stdout or -o FILE, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def flotilla(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla", *argv], capture_output=True, text=True, timeout=120)


def test_compose_prints_the_committed_compose_file_for_the_default_fleet() -> None:
    out = flotilla("compose")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "compose.yaml").read_text()


def test_compose_writes_the_file_named_by_o(tmp_path: Path) -> None:
    target = tmp_path / "compose.yaml"
    out = flotilla("compose", str(REPO / "proxy" / "fleet.default.yaml"), "-o", str(target))
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert target.read_text() == (REPO / "compose.yaml").read_text()


@pytest.mark.parametrize("fleet,cause", [
    ("engines:\n  - {flavor: vllm, model: llama-3.1-8b, replicas: two}\n", "engines[0].replicas='two': must be int"),
    ("engines:\n  - {name: GPU_1, flavor: vllm, model: llama-3.1-8b}\n", "engines[0].name='GPU_1': must be a DNS label"),
])
def test_a_bad_fleet_file_is_one_line_naming_the_file_and_the_field(tmp_path: Path, fleet: str, cause: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet)
    out = flotilla("compose", str(path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"flotilla compose: error: {path}: {cause}" + out.stderr.split(cause, 1)[1]
    assert out.stderr.count("\n") == 1


def test_an_unwritable_output_is_one_line_naming_it(tmp_path: Path) -> None:
    out = flotilla("compose", "-o", str(tmp_path / "absent" / "compose.yaml"))
    assert out.returncode == 2
    assert out.stderr.startswith(f"flotilla compose: error: cannot write {tmp_path / 'absent' / 'compose.yaml'}: ")
