"""The compose test fails on a running fleet with a broken scrape target: its live check finds
what the file's wiring check was told to let through, and the failed run still leaves nothing.

Starts the fleet on podman (about a minute and a half once the images are cached): only under
FLOTILLA_COMPOSE_TEST=1, as `make compose-test` runs it after the fleet's own run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.compose import checks
from tests.compose.run import REPO, compose_document

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("FLOTILLA_COMPOSE_TEST") != "1" or os.geteuid() != 0,
                                 reason="starts containers with podman as root: make compose-test")]


def test_a_fleet_scraping_a_wrong_port_fails_the_live_check(tmp_path) -> None:
    engine = checks.expected(compose_document(REPO / "compose.yaml")).engines[0]
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())
    for config in raw["configs"].values():
        config["content"] = config["content"].replace(f"'{engine.service}:{engine.port}'", f"'{engine.service}:9999'")
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "tests.compose.run", "--compose-file", str(broken), "--skip-wiring",
                          "--no-scale"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"wiring problem left for the live checks to find: scrape target {engine.service}:9999" in out.stdout
    assert f"target {engine.service}:9999 (job " in out.stderr and " is down: " in out.stderr, out.stderr
    assert "after docker compose down -v" not in out.stderr, out.stderr
