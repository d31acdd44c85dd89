"""`flotilla compose`: the Compose file of a fleet, the fleet `flotilla up` starts, in containers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flotilla.cli_errors import fail

HELP = "print a Compose file for a fleet file: the fleet `flotilla up` starts, in containers"
DESCRIPTION = """\
Print a Compose file that runs the fleet `flotilla up` starts: the same engine command lines,
the autoscaled group scaled by the proxy through the Docker API, the proxy with the fleet's
routing policy, and Prometheus and Grafana with the Flotilla dashboards.

  flotilla compose                                  # the packaged default fleet
  flotilla compose fleet.yaml -o compose.yaml       # then: docker compose up --build

Write it at the repository root: the image is built from `.` and the dashboards are mounted
from ./deploy/grafana. The repository's compose.yaml is this command's output for
proxy/fleet.default.yaml (a test keeps them equal).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fleet", nargs="?", type=Path, help="fleet YAML (default: the packaged default fleet)")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from proxy.config import ConfigError
    from proxy.deploy.compose import render_compose
    from proxy.deploy.fleet import load

    try:
        text = render_compose(load(args.fleet))
    except ConfigError as exc:
        return _fail(str(exc))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text)
    except OSError as exc:
        return _fail(f"cannot write {args.output}: {exc.strerror or exc}")
    return 0


def _fail(message: str) -> int:
    return fail("flotilla compose", message)
