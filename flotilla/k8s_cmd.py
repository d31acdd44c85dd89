"""`flotilla k8s`: Kubernetes manifests of a fleet, the fleet `flotilla up` starts, in a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flotilla.cli_errors import fail

HELP = "print Kubernetes manifests for a fleet file: the fleet `flotilla up` starts, in a cluster"
DESCRIPTION = """\
Print Kubernetes manifests that run the fleet `flotilla up` starts: a Deployment and a headless
Service per engine group with the same engine command lines, and the proxy, which finds the
engine pods through their Services' EndpointSlices and scales the autoscaled group through the
Kubernetes API (its Role allows exactly that).

  flotilla k8s | kubectl apply -f -                 # the packaged default fleet
  flotilla k8s fleet.yaml -o deploy/k8s             # engines.yaml and proxy.yaml in a folder
  flotilla k8s fleet.yaml -o fleet.yaml             # one file
  flotilla k8s --scaler keda -o deploy/k8s/keda     # KEDA scales on the proxy's recommendation
  flotilla k8s --scaler hpa -o deploy/k8s/hpa       # an HPA does, through the Prometheus adapter

The image is built locally (docker build -t flotilla:latest ., then loaded into the cluster).
The admin API's token is a Secret you create (the command is in proxy.yaml). The repository's
deploy/k8s is this command's output for proxy/fleet.default.yaml, deploy/k8s/keda and
deploy/k8s/hpa with --scaler keda and hpa (a test keeps them equal). When to use which:
docs/autoscaling.md#hpa-and-keda.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fleet", nargs="?", type=Path, help="fleet YAML (default: the packaged default fleet)")
    parser.add_argument("-o", "--output", type=Path, metavar="DIR|FILE",
                        help="a folder for engines.yaml and proxy.yaml, or one .yaml file; default stdout")
    parser.add_argument("--scaler", choices=("proxy", "keda", "hpa"), default="proxy",
                        help="who scales the autoscaled group: the proxy's own actuator (default), or KEDA / an "
                             "HPA on the proxy's recommendation (its autoscaler then only recommends; adds "
                             "keda.yaml or hpa.yaml)")


def run(args: argparse.Namespace) -> int:
    from proxy.config import ConfigError
    from proxy.deploy.fleet import load
    from proxy.deploy.kubernetes import manifests, render_manifests

    try:
        fleet = load(args.fleet)
        files = manifests(fleet, args.scaler)
    except ConfigError as exc:
        return _fail(str(exc))
    out: Path | None = args.output
    if out is None:
        sys.stdout.write(render_manifests(fleet, args.scaler))
        return 0
    try:
        if out.suffix in (".yaml", ".yml"):
            out.write_text(render_manifests(fleet, args.scaler))
        else:
            out.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (out / name).write_text(text)
    except OSError as exc:
        return _fail(f"cannot write {exc.filename or out}: {exc.strerror or exc}")
    return 0


def _fail(message: str) -> int:
    return fail("flotilla k8s", message)
