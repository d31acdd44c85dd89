"""How each router is started in front of a list of backend URLs: the command line, the config
files it needs and the URL that says it is ready. Peers run from their own venvs under
bench/.peers/ (see install.py); nginx from Debian's package."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench import compiled

REPO = Path(__file__).resolve().parents[2]
PEERS_DIR = REPO / "bench" / ".peers"
LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
               "LITELLM_TELEMETRY": "False", "DISABLE_ADMIN_UI": "True"}


@dataclass
class RouterSpec:
    """One router under test: which program and which of its policies."""

    label: str
    """Name in tables and plots, e.g. 'sglang-router cache_aware'."""
    kind: str
    """flotilla, sglang, vllm-router, litellm, nginx or direct."""
    policy: str = ""
    """The router's own policy name; empty where it has none."""
    workers: int = 1
    """Flotilla's `--workers`: processes serving the one address."""
    flags: tuple[str, ...] = ()
    """More of Flotilla's flags (`--no-fast-path`: its request path before proxy/fastpath.py)."""
    compiled: bool = False
    """Flotilla's compiled build (bench/compiled.py, `make compiled`) instead of the working tree."""


@dataclass
class Launch:
    """What to run for one router: argv, extra environment and the readiness URL."""

    argv: list[str]
    url: str
    """Base URL clients send to."""
    ready_url: str
    env: dict[str, str] = field(default_factory=dict)
    ready_headers: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def venv_bin(peer: str, program: str) -> str:
    return str(PEERS_DIR / peer / "bin" / program)


def litellm_config(backends: list[str], model: str, strategy: str) -> dict:
    """A LiteLLM proxy config with one deployment per backend, all under one model name."""
    deployments = [{"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": f"{b}/v1",
                                                            "api_key": "none"}} for b in backends]
    return {"model_list": deployments, "router_settings": {"routing_strategy": strategy},
            "litellm_settings": {"drop_params": False, "telemetry": False},
            # No key: the load generator sends no Authorization header, and other routers check none.
            "general_settings": {"dangerously_permit_weak_or_unset_master_key": True}}


def nginx_config(backends: list[str], port: int, workdir: Path) -> str:
    """A plain L7 reverse proxy: keep-alive upstream, no buffering (streams pass at once), no log."""
    servers = "\n".join(f"    server {b.removeprefix('http://')};" for b in backends)
    return f"""worker_processes auto;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  upstream fleet {{
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fleet;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


def _metrics_port() -> list[str]:
    # Both Rust routers export metrics on 29000 by default; two at once would collide.
    from bench.peers.procs import free_port
    return ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]


def launch(spec: RouterSpec, backends: list[str], port: int, workdir: Path, model: str) -> Launch:
    """The command that starts `spec` on 127.0.0.1:`port` in front of `backends`."""
    url = f"http://127.0.0.1:{port}"
    if spec.kind == "flotilla":
        argv = [sys.executable, "-m", "flotilla", "proxy", "--port", str(port), "--policy", spec.policy,
                "--workers", str(spec.workers), "--log-level", "warning", *spec.flags,
                *[a for b in backends for a in ("--backend", f"vllm={b}")]]
        if spec.compiled:
            return Launch(argv, url, url + "/ready", env=compiled.env(), cwd=compiled.DEST)
        return Launch(argv, url, url + "/ready")
    if spec.kind == "sglang":
        argv = [venv_bin("sglang-router", "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--policy", spec.policy, "--log-level", "warn", *_metrics_port(), "--worker-urls", *backends]
        return Launch(argv, url, url + "/health")
    if spec.kind == "vllm-router":
        argv = [venv_bin("vllm-router", "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--policy", spec.policy, "--log-level", "warning", *_metrics_port(), "--worker-urls", *backends]
        return Launch(argv, url, url + "/health")
    if spec.kind == "litellm":
        cfg = workdir / f"litellm-{port}.yaml"
        cfg.write_text(yaml.safe_dump(litellm_config(backends, model, spec.policy)))
        argv = [venv_bin("litellm", "litellm"), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                "--num_workers", "1"]
        return Launch(argv, url, url + "/health/liveliness", env=dict(LITELLM_ENV))
    if spec.kind == "nginx":
        nwd = workdir / f"nginx-{port}"
        nwd.mkdir(parents=True, exist_ok=True)
        (nwd / "nginx.conf").write_text(nginx_config(backends, port, nwd))
        return Launch(["nginx", "-c", str(nwd / "nginx.conf"), "-g", "daemon off;"], url, url + "/health")
    raise ValueError(f"kind={spec.kind!r}: expected flotilla, sglang, vllm-router, litellm or nginx")
