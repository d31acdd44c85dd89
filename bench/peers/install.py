"""Install the peer routers, each into its own venv under bench/.peers/ (ignored by git), and
nginx + wrk from Debian's packages. Idempotent: what is already there is left as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

from bench.peers.launch import PEERS_DIR


@dataclass(frozen=True)
class PipPeer:
    """A peer installed from PyPI into bench/.peers/<name>."""

    name: str
    requirement: str
    """pip requirement, e.g. 'litellm[proxy]'."""
    program: str
    """A file in the venv's bin/ that exists once the install worked."""


PIP_PEERS = (PipPeer("sglang-router", "sglang-router", "sglang-router"),
             PipPeer("vllm-router", "vllm-router", "vllm-router"),
             PipPeer("litellm", "litellm[proxy]", "litellm"))
APT_PACKAGES = {"nginx": "nginx-light", "wrk": "wrk"}
"""Program on PATH -> Debian package that brings it."""


def _pip_install(peer: PipPeer, root: Path) -> str:
    home = root / peer.name
    if (home / "bin" / peer.program).exists():
        return f"{peer.name}: already installed"
    venv.EnvBuilder(with_pip=True, clear=home.exists()).create(home)
    subprocess.run([str(home / "bin" / "pip"), "install", "-q", peer.requirement], check=True)
    return f"{peer.name}: installed"


def _apt_install(missing: list[str]) -> str:
    if not missing:
        return "nginx, wrk: already installed"
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True)
    return f"{', '.join(missing)}: installed"


def install(root: Path = PEERS_DIR) -> list[str]:
    """Install what is missing; one line per peer saying what happened."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [_pip_install(p, root) for p in PIP_PEERS]
    lines.append(_apt_install([pkg for prog, pkg in APT_PACKAGES.items() if shutil.which(prog) is None]))
    return lines


def versions(root: Path = PEERS_DIR) -> dict[str, str]:
    """Installed version of each peer, for the report."""
    out = {}
    for p in PIP_PEERS:
        pkg = p.requirement.split("[")[0]
        if not (root / p.name / "bin" / "python").exists():  # not installed (a run with --only)
            out[p.name] = "missing"
            continue
        res = subprocess.run([str(root / p.name / "bin" / "python"), "-c",
                              f"import importlib.metadata as m; print(m.version({pkg!r}))"],
                             capture_output=True, text=True)
        out[p.name] = res.stdout.strip() or "missing"
    res = subprocess.run(["nginx", "-v"], capture_output=True, text=True) if shutil.which("nginx") else None
    out["nginx"] = res.stderr.strip().split("/")[-1] if res else "missing"
    return out


def main() -> int:
    for line in install():
        print(line, file=sys.stderr)
    return 0
