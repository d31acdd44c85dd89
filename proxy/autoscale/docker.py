"""The docker actuator: engine replicas as containers, through the Docker Engine API.

It speaks HTTP over the engine's unix socket (aiohttp's UnixConnector), API version 1.43:

    POST   /containers/create?name=NAME      create from an image, with labels
    POST   /containers/{id}/start
    GET    /containers/{id}/json             the address the replica answers on
    POST   /containers/{id}/stop?t=GRACE     SIGTERM, SIGKILL after GRACE seconds
    DELETE /containers/{id}?force=true
    GET    /containers/json?all=true&filters={"label":[...]}

With `compose_service` the new containers copy an existing container of that compose service
(image, command, environment, labels, networks), so the service scales as `docker compose up
--scale` would. The proxy reaches a replica by its name on `network` when it shares one with
the engines (compose), else on the port Docker publishes on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.autoscale.actuator import Actuator, ActuatorError, ReplicaHandle

log = logging.getLogger(__name__)

API_VERSION = "v1.43"
MANAGED_LABEL = "io.flotilla.autoscaler"
"""Every container this actuator creates carries it, with the fleet name as value."""
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
COMPOSE_NUMBER_LABEL = "com.docker.compose.container-number"


@dataclass
class DockerSettings:
    """Where and what the docker actuator runs."""

    socket_path: str = "/var/run/docker.sock"
    """The Docker Engine API's unix socket (mount it into the proxy's container)."""
    image: str | None = None
    """Image of a replica; not needed with `compose_service`."""
    command: tuple[str, ...] = ()
    """Engine command inside the container; `--host 0.0.0.0 --port PORT` are appended."""
    port: int = 8000
    """Port the engine listens on inside the container."""
    network: str | None = None
    """Network shared with the proxy: replicas are reached as http://NAME:PORT on it, and all
    answer to `fleet` there too."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra container labels."""
    fleet: str = "engines"
    """Value of the managed label and prefix of container names."""
    compose_service: str | None = None
    """Scale this compose service: new containers copy one of its running containers."""

    def __post_init__(self) -> None:
        if self.image is None and self.compose_service is None:
            raise ActuatorError("docker: give an image (--docker-image) or a compose service "
                                "(--docker-compose-service)")
        if not 0 < self.port < 65536:
            raise ActuatorError(f"docker port={self.port!r}: must be in [1, 65535]")


class DockerActuator(Actuator):
    def __init__(self, settings: DockerSettings, flavor: str = "vllm",
                 session: aiohttp.ClientSession | None = None) -> None:
        self.settings = settings
        self.flavor = flavor
        self._session = session
        self._own_session = session is None
        self._started: list[str] = []
        self._stopping: set[str] = set()
        """Replicas being stopped here: their exit is no surprise to report."""
        self._template: dict | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.settings.socket_path))
        return self._session

    async def _call(self, method: str, path: str, params: dict | None = None, body: dict | None = None,
                    ok: tuple[int, ...] = (200, 201, 204), gone_ok: bool = False) -> Any:
        """The decoded JSON answer (None when empty); ActuatorError for any other status. With
        `gone_ok`, a container that no longer exists answers None too: Docker says so with a 404,
        podman with a 500 "no such container" (as when `docker compose down` removed it first)."""
        url = f"http://docker/{API_VERSION}{path}"
        try:
            async with self.session.request(method, url, params=params, json=body) as resp:
                text = await resp.text()
                if gone_ok and (resp.status == 404 or "no such container" in text.lower()):
                    return None
                if resp.status not in ok:
                    raise ActuatorError(f"docker {method} {path}: {resp.status} {_message(text)}")
                return json.loads(text) if text.strip() else None
        except aiohttp.ClientError as exc:
            raise ActuatorError(f"docker {method} {path}: {exc}") from exc

    async def start_replica(self) -> ReplicaHandle:
        name = f"{self.settings.fleet}-{secrets.token_hex(4)}"
        spec = await self._container_spec()
        created = await self._call("POST", "/containers/create", params={"name": name}, body=spec)
        container_id = created["Id"]
        self._started.append(container_id)
        await self._call("POST", f"/containers/{container_id}/start", ok=(204, 304))
        info = await self._call("GET", f"/containers/{container_id}/json")
        return ReplicaHandle(container_id, self._url(name, info))

    async def _container_spec(self) -> dict:
        s = self.settings
        if s.compose_service is not None:
            return await self._compose_spec()
        port = f"{s.port}/tcp"
        host_config: dict = {"PortBindings": {port: [{"HostIp": "127.0.0.1", "HostPort": ""}]}}
        if s.network:
            host_config = {"NetworkMode": s.network}
        cmd = [*s.command, "--host", "0.0.0.0", "--port", str(s.port)] if s.command else None
        spec: dict[str, Any] = {"Image": s.image, "Labels": {**s.labels, MANAGED_LABEL: s.fleet},
                                "ExposedPorts": {port: {}}, "HostConfig": host_config}
        if s.network:  # every replica also answers to the fleet name: one DNS name lists them all (Prometheus)
            spec["NetworkingConfig"] = {"EndpointsConfig": {s.network: {"Aliases": [s.fleet]}}}
        if cmd:
            spec["Cmd"] = cmd
        return spec

    async def _compose_spec(self) -> dict:
        """A copy of a running container of the compose service, under this actuator's label."""
        if self._template is None:
            found = await self._call("GET", "/containers/json", params={"filters": json.dumps(
                {"label": [f"{COMPOSE_SERVICE_LABEL}={self.settings.compose_service}"]})})
            if not found:
                raise ActuatorError(f"docker: no container of compose service {self.settings.compose_service!r}")
            self._template = await self._call("GET", f"/containers/{found[0]['Id']}/json")
        config, host = self._template["Config"], self._template["HostConfig"]
        labels = {k: v for k, v in (config.get("Labels") or {}).items() if k != COMPOSE_NUMBER_LABEL}
        networks = list((self._template.get("NetworkSettings") or {}).get("Networks") or {})
        spec: dict[str, Any] = {
            "Image": config["Image"], "Cmd": config.get("Cmd"), "Env": config.get("Env") or [],
            "Labels": {**labels, **self.settings.labels, MANAGED_LABEL: self.settings.fleet},
            "ExposedPorts": config.get("ExposedPorts") or {},
            "HostConfig": {"NetworkMode": host.get("NetworkMode") or "default"}}
        if networks:
            aliases = [self.settings.compose_service]
            spec["NetworkingConfig"] = {"EndpointsConfig": {networks[0]: {"Aliases": aliases}}}
        return spec

    def _url(self, name: str, info: dict) -> str:
        s = self.settings
        if s.network or s.compose_service:
            return f"http://{name}:{s.port}"
        bindings = (info.get("NetworkSettings") or {}).get("Ports") or {}
        published = bindings.get(f"{s.port}/tcp") or []
        if not published:
            raise ActuatorError(f"docker: container {name} publishes no port for {s.port}/tcp")
        return f"http://127.0.0.1:{published[0]['HostPort']}"

    async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
        self._stopping.add(replica_id)
        try:
            await self._call("POST", f"/containers/{replica_id}/stop", params={"t": str(int(grace_s))},
                             ok=(204, 304), gone_ok=True)
            await self._call("DELETE", f"/containers/{replica_id}", params={"force": "true"}, gone_ok=True)
        finally:
            self._stopping.discard(replica_id)
        if replica_id in self._started:
            self._started.remove(replica_id)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop and remove every container started here; one that fails is logged, and the others
        are still stopped and removed."""
        try:
            started = list(self._started)
            results = await asyncio.gather(*(self.stop_replica(c, grace_s) for c in started), return_exceptions=True)
            for container, result in zip(started, results, strict=True):
                if isinstance(result, ActuatorError):
                    log.warning("docker: container %s was not removed at shutdown: %s", container[:12], result)
                elif isinstance(result, BaseException):
                    raise result
        finally:
            if self._own_session and self._session is not None:
                await self._session.close()

    async def exited(self) -> list[str]:
        # The state is checked here, not by a "status" filter: podman's Docker API rejects
        # status=dead with a 500, and the managed containers are few.
        listed = await self._call("GET", "/containers/json", params={
            "all": "true", "filters": json.dumps({"label": [f"{MANAGED_LABEL}={self.settings.fleet}"]})})
        return [c["Id"] for c in listed or () if c["Id"] in self._started and c["Id"] not in self._stopping
                and c.get("State") in ("exited", "dead")]


def _message(text: str) -> str:
    try:
        return json.loads(text)["message"]
    except (ValueError, KeyError, TypeError):
        return text[:200]
