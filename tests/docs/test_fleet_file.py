"""docs/fleet-file.md: its example fleet loads as written and its error example is the real one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from proxy.fleetfile import parse_up_fleet
from tests.conftest import REPO

DOC = (REPO / "docs" / "fleet-file.md").read_text()


def test_the_documented_fleet_parses_with_the_autoscaled_group_named() -> None:
    example = re.search(r"```yaml\n(.*?)```", DOC, re.S).group(1)
    fleet = parse_up_fleet(example)
    assert [g.name for g in fleet.engines] == ["vllm", "llama"]
    assert fleet.scaled_group().name == "vllm"
    assert fleet.engines[1].ctx_size == 32768 and fleet.engines[0].args == ("--max-num-seqs", "128")


def test_the_documented_error_is_what_flotilla_up_prints(tmp_path: Path) -> None:
    shown = re.search(r"\$ flotilla up fleet.yaml\n(.*)\n", DOC).group(1)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {flavor: vllm, model: llama-3.1-8b, replicas: 5, max: 2}\n")
    out = subprocess.run([sys.executable, "-m", "flotilla", "up", fleet.name], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)  # the file as the example names it
    assert out.returncode == 2 and out.stderr.strip() == shown
