"""What `make compose-test` expects of a running Compose fleet, read from the compose file itself,
and the judgements of what it observes: each function returns the problems it finds (empty: all
good), so a broken file or a broken fleet is named in one line per fault.

Nothing here names a service: the proxy is the service running `flotilla proxy`, Prometheus the
one running the prom/prometheus image, the engines those running a look-alike engine, and what
each listens on comes from its own command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from proxy.status import parse_proxy_metrics

NOT_STARTED = {"docker.io/grafana/grafana": "no Debian, PyPI or npm package ships a Grafana server"}
"""Images of services that cannot run on these machines, and why; their files are checked elsewhere."""
FLAVOR_METRIC = {"vllm": "vllm:num_requests_running", "llamacpp": "llamacpp:requests_processing"}
"""One metric each engine flavor exposes, one series per engine."""
ENGINE_PORT = {"vllm": 8000, "llamacpp": 8080}
"""The port each look-alike engine listens on without --port (as the real ones do)."""
ENGINES = {"vllm": ("fake-vllm", "fake_engines.vllm.cli"), "llamacpp": ("fake-llama-server", "fake_engines.llamacpp.cli")}
"""The commands (or modules) that start each look-alike engine."""


@dataclass(frozen=True)
class Engine:
    """A fixed engine: its compose service, flavor, served model and port."""

    service: str
    flavor: str
    model: str
    port: int


@dataclass(frozen=True)
class Scaled:
    """The engine group the proxy's autoscaler starts through the Docker actuator."""

    flavor: str
    model: str
    fleet: str
    """Value of the autoscaler's container label; the name every replica answers to."""
    port: int
    min: int
    max: int
    network: str | None
    """The network the replicas join."""
    socket_path: str
    """Where the proxy finds the Docker API inside its container."""


@dataclass(frozen=True)
class Expected:
    """The fleet a compose file describes, as the checks need it."""

    proxy: str
    """The proxy's service."""
    proxy_port: int
    """Port the proxy listens on inside its container."""
    proxy_url: str
    """The proxy as the host reaches it (its published port)."""
    prometheus: str | None
    prometheus_url: str | None
    engines: tuple[Engine, ...]
    scaled: Scaled | None
    backends: tuple[tuple[str, str], ...]
    """The proxy's configured backends: (url, flavor)."""
    scrape: dict[str, Any]
    """Prometheus' configuration."""
    not_started: dict[str, str]
    """Services left out, and why."""
    networks: tuple[str, ...]
    """Names of the project's networks."""
    mounts: tuple[str, ...]
    """Where the proxy's volumes are mounted inside it."""

    @property
    def models(self) -> set[str]:
        return {e.model for e in self.engines} | ({self.scaled.model} if self.scaled else set())

    @property
    def started(self) -> list[str]:
        return [s for s in (self.proxy, self.prometheus, *(e.service for e in self.engines)) if s]


def _option(cmd: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(cmd[:-1]):
        if arg in names:
            return cmd[i + 1]
    for arg in cmd:
        for name in names:
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def engine_of(cmd: Sequence[str]) -> tuple[str, str, int] | None:
    """(flavor, served model, port) of a look-alike engine's command line; None for anything else."""
    for flavor, names in ENGINES.items():
        start = next((i for i, arg in enumerate(cmd) if arg.rsplit("/", 1)[-1] in names), None)
        if start is None:
            continue
        args = list(cmd[start + 1:])  # the engine's own flags, not python's -m
        if flavor == "vllm":
            if "serve" not in args:
                return None
            model = _option(args, "--served-model-name") or args[args.index("serve") + 1]
        else:
            path = _option(args, "-m", "--model") or ""
            model = _option(args, "-a", "--alias") or re.sub(r"\.gguf$", "", path.rsplit("/", 1)[-1])
        return flavor, model, int(_option(args, "--port") or ENGINE_PORT[flavor])
    return None


def is_proxy(cmd: Sequence[str]) -> bool:
    return bool(re.search(r"\bflotilla(\.cli)?\s+proxy\b", " ".join(cmd)))


def _published(service: Mapping[str, Any], target: int) -> str | None:
    for p in service.get("ports") or ():
        if int(p["target"]) == target and p.get("published"):
            return f"http://{p.get('host_ip') or '127.0.0.1'}:{p['published']}"
    return None


def _config(doc: Mapping[str, Any], service: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A config file mounted into a service, parsed."""
    for ref in service.get("configs") or ():
        if ref.get("target") == path:
            return yaml.safe_load(doc["configs"][ref["source"]]["content"]) or {}
    raise ValueError(f"no config mounted at {path}")


def _image(service: Mapping[str, Any]) -> str:
    from tests.compose.engine import docker_name

    return docker_name(service.get("image") or "")


def expected(doc: Mapping[str, Any]) -> Expected:
    """What the compose file (`docker compose config --format json`) describes."""
    services: Mapping[str, Any] = doc["services"]
    proxies = [n for n, s in services.items() if is_proxy(s.get("command") or ())]
    if len(proxies) != 1:
        raise ValueError(f"expected one service running `flotilla proxy`, found {proxies}")
    proxy = services[proxies[0]]
    cmd = proxy["command"]
    port = int(_option(cmd, "--port") or 8000)
    fleet = _config(doc, proxy, _option(cmd, "--config") or "") if _option(cmd, "--config") else {}
    proms = [n for n, s in services.items() if _image(s).split(":")[0] == "docker.io/prom/prometheus"]
    prometheus = proms[0] if proms else None
    engines = tuple(Engine(n, *found) for n, s in services.items() if (found := engine_of(s.get("command") or ())))
    return Expected(
        proxy=proxies[0], proxy_port=port, proxy_url=_published(proxy, port) or "",
        prometheus=prometheus,
        prometheus_url=_published(services[prometheus], 9090) if prometheus else None,
        engines=engines, scaled=_scaled(fleet.get("autoscaler")),
        backends=tuple((b["url"], b.get("flavor", "")) for b in (fleet.get("proxy") or {}).get("backends") or ()),
        scrape=_prometheus_config(doc, services[prometheus]) if prometheus else {},
        not_started={n: why for n, s in services.items() for image, why in NOT_STARTED.items()
                     if _image(s).split(":")[0] == image},
        networks=tuple(n.get("name") or k for k, n in (doc.get("networks") or {}).items()),
        mounts=tuple(v["target"] for v in proxy.get("volumes") or ()))


def _scaled(scaler: Mapping[str, Any] | None) -> Scaled | None:
    if not scaler or scaler.get("actuator") != "docker":
        return None
    docker = scaler.get("docker") or {}
    found = engine_of([str(a) for a in scaler.get("engine_cmd") or ()])
    flavor, model = (found[0], found[1]) if found else (scaler.get("flavor", "vllm"), "")
    return Scaled(flavor=flavor, model=model, fleet=docker.get("fleet", "engines"), port=int(docker.get("port", 8000)),
                  min=int(scaler.get("min", 1)), max=int(scaler.get("max", 1)), network=docker.get("network"),
                  socket_path=docker.get("socket_path", "/var/run/docker.sock"))


def _prometheus_config(doc: Mapping[str, Any], service: Mapping[str, Any]) -> dict[str, Any]:
    path = _option(service.get("command") or (), "--config.file") or "/etc/prometheus/prometheus.yml"
    return _config(doc, service, path)


def wiring_problems(exp: Expected) -> list[str]:
    """Names and ports that cannot meet, found before anything starts: every backend of the proxy
    and every scrape target must be a service (or the autoscaled group's name) on the port it
    listens on, and every engine must be routed to and scraped."""
    listening = {e.service: e.port for e in exp.engines} | {exp.proxy: exp.proxy_port}
    if exp.scaled:
        listening[exp.scaled.fleet] = exp.scaled.port
    problems = [f"proxy backend {url}: {why}" for url, _ in exp.backends
                if (why := _address_problem(url.removeprefix("http://").rstrip("/"), listening))]
    targets = scrape_targets(exp.scrape)
    problems += [f"scrape target {t}: {why}" for t in targets if (why := _address_problem(t, listening))]
    routed = {url.removeprefix("http://").split(":")[0] for url, _ in exp.backends}
    problems += [f"engine service {e.service} is not among the proxy's backends" for e in exp.engines
                 if e.service not in routed]
    scraped = {t.split(":")[0] for t in targets}
    problems += [f"{name} is not scraped by Prometheus" for name in [exp.proxy, *(e.service for e in exp.engines),
                                                                     *([exp.scaled.fleet] if exp.scaled else [])]
                 if exp.prometheus and name not in scraped]
    if exp.scaled and exp.scaled.network not in exp.networks:
        problems.append(f"the autoscaler starts replicas on network {exp.scaled.network!r}, the project has "
                        f"{list(exp.networks)}")
    if exp.scaled and exp.scaled.socket_path not in exp.mounts:
        problems.append(f"the autoscaler calls the Docker API at {exp.scaled.socket_path}, nothing is mounted there")
    if not exp.proxy_url:
        problems.append(f"the proxy's port {exp.proxy_port} is not published to the host")
    if exp.prometheus and not exp.prometheus_url:
        problems.append("Prometheus' port 9090 is not published to the host")
    return problems


def _address_problem(address: str, listening: Mapping[str, int]) -> str | None:
    host, _, port = address.partition(":")
    if host not in listening:
        return f"no service or replica group named {host!r} (have {sorted(listening)})"
    if port and int(port) != listening[host]:
        return f"{host} listens on {listening[host]}, not {port}"
    return None


def scrape_targets(config: Mapping[str, Any]) -> list[str]:
    """host:port of every static target and DNS name of a Prometheus configuration."""
    found: list[str] = []
    for job in config.get("scrape_configs") or ():
        for static in job.get("static_configs") or ():
            found += static.get("targets") or []
        for dns in job.get("dns_sd_configs") or ():
            found += [f"{name}:{dns.get('port', '')}".rstrip(":") for name in dns.get("names") or ()]
    return found


def model_problems(models: set[str], body: Mapping[str, Any]) -> list[str]:
    listed = {m.get("id") for m in body.get("data") or ()}
    return [f"/v1/models through the proxy lacks {m!r} (lists {sorted(map(str, listed))})" for m in sorted(models)
            if m not in listed]


def backend_problems(exp: Expected, proxy_metrics: str, replicas: int | None = None) -> list[str]:
    """The proxy routes to every configured backend and to `replicas` autoscaled ones (default
    the group's minimum), all ready."""
    rows, _ = parse_proxy_metrics(proxy_metrics)
    fixed = {url.rstrip("/") for url, _ in exp.backends}
    problems = [f"backend {url} is {rows[url].state if url in rows else 'unknown to the proxy'}" for url in sorted(fixed)
                if url not in rows or rows[url].state != "ready"]
    # a removed replica's counters stay in /metrics, with no state: it is no longer a backend
    scaled = {u: r.state for u, r in rows.items() if u not in fixed and r.state != "unknown"}
    want = (replicas if replicas is not None else exp.scaled.min) if exp.scaled else 0
    ready = [u for u, s in scaled.items() if s == "ready"]
    if len(ready) != want or len(scaled) != want:
        problems.append(f"{want} autoscaled backends ready expected, the proxy has {scaled or 'none'}")
    return problems


def loadgen_problems(result: Mapping[str, Any]) -> list[str]:
    s = result["summary"]
    problems = [] if s["num_requests"] else ["loadgen sent no request"]
    if s["num_failed"] or s["num_ok"] != s["num_requests"]:
        errors = sorted({str(r.get("error")) for r in result["requests"] if r.get("error")})
        problems.append(f"loadgen: {s['num_ok']} of {s['num_requests']} requests answered; errors: {errors[:5]}")
    return problems


def target_problems(exp: Expected, targets: Mapping[str, Any], engines: int) -> list[str]:
    """Prometheus' active targets (/api/v1/targets data): the proxy and `engines` engines, all up."""
    active = targets.get("activeTargets") or []
    problems = [f"target {t['labels'].get('instance')} (job {t['labels'].get('job')}) is {t['health']}: "
                f"{t.get('lastError') or 'not scraped yet'}" for t in active if t.get("health") != "up"]
    instances = [t["labels"].get("instance", "") for t in active]
    if not any(i.split(":")[0] == exp.proxy for i in instances):
        problems.append(f"no scrape target for the proxy ({exp.proxy}); targets {instances}")
    if len(active) != 1 + engines:
        problems.append(f"{1 + engines} targets expected (the proxy and {engines} engines), Prometheus has {instances}")
    return problems


def series_problems(metric: str, want: int, result: Sequence[Mapping[str, Any]]) -> list[str]:
    if len(result) != want:
        got = sorted(r["metric"].get("instance", "?") for r in result)
        return [f"{metric}: {want} series expected (one per engine), Prometheus has {len(result)}: {got}"]
    return []


def flavor_counts(exp: Expected, replicas: int | None = None) -> dict[str, int]:
    """Engines per flavor: the fixed ones and the autoscaled group at `replicas` (default its minimum)."""
    counts: dict[str, int] = {}
    for e in exp.engines:
        counts[e.flavor] = counts.get(e.flavor, 0) + 1
    if exp.scaled:
        counts[exp.scaled.flavor] = counts.get(exp.scaled.flavor, 0) + (
            replicas if replicas is not None else exp.scaled.min)
    return counts


def leftover_problems(containers: Sequence[Mapping[str, Any]], networks: Sequence[str],
                      project_networks: Sequence[str]) -> list[str]:
    """After `docker compose down -v`: no container of the project or of the autoscaler, none of
    the project's networks."""
    problems = [f"container {(c.get('Names') or ['?'])[0]} is still there ({c.get('State')})" for c in containers]
    return problems + [f"network {n} is still there" for n in project_networks if n in networks]
