"""The docker actuator against a recorded Docker Engine API contract: a fake engine on a unix
socket that checks each request's method, path, query and JSON body, and answers in the shapes
the Docker Engine API (v1.43) documents."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from proxy.autoscale.actuator import ActuatorError
from proxy.autoscale.docker import MANAGED_LABEL, DockerActuator, DockerSettings

ID = "4fa6e0f0c6786287e131c3852c58a2e01cc697a68231826813597e4994f1d6e2"
COMPOSE_ID = "9cd87474be90f4a7f1c0da9b3c1a8f8e1e7b4f1fb6f5f0b4d9dcd0a6a0f3c2b1"


@dataclass
class FakeDocker:
    calls: list[tuple[str, str, dict, object]] = field(default_factory=list)
    created: dict[str, dict] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    removing: asyncio.Event | None = None
    """When set, a remove waits for it: a stop caught between the container's exit and its removal."""
    refuses: set[str] = field(default_factory=set)
    """Containers whose stop fails with an error that does not say they are gone."""

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1.43/containers/create", self.create),
            web.post("/v1.43/containers/{id}/start", self.start),
            web.get("/v1.43/containers/{id}/json", self.inspect),
            web.post("/v1.43/containers/{id}/stop", self.stop),
            web.delete("/v1.43/containers/{id}", self.remove),
            web.get("/v1.43/containers/json", self.list),
        ])
        return app

    async def record(self, request: web.Request) -> object:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, dict(request.query), body))
        return body

    async def create(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.headers.get("Content-Type") != "application/json":
            return web.json_response({"message": "Content-Type must be application/json"}, status=400)
        if body.get("Image") == "missing:latest":
            return web.json_response({"message": "No such image: missing:latest"}, status=404)
        cid = ID if ID not in self.created else secrets.token_hex(32)  # the first is ID, as tests expect
        self.created[cid] = {**body, "Name": "/" + request.query["name"]}
        self.state[cid] = "created"
        return web.json_response({"Id": cid, "Warnings": []}, status=201)

    async def start(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.state[request.match_info["id"]] = "running"
        return web.Response(status=204)

    async def inspect(self, request: web.Request) -> web.Response:
        await self.record(request)
        cid = request.match_info["id"]
        if cid == COMPOSE_ID:
            return web.json_response(COMPOSE_CONTAINER)
        ports = {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}]}
        return web.json_response({"Id": cid, "Name": self.created[cid]["Name"], "State": {"Status": self.state[cid]},
                                  "NetworkSettings": {"Ports": ports, "Networks": {}}})

    async def stop(self, request: web.Request) -> web.Response:
        await self.record(request)
        cid = request.match_info["id"]
        if cid in self.refuses:
            return web.json_response({"message": "container state improper"}, status=500)
        if cid not in self.state:  # as podman's Docker API answers for a container removed already
            return web.json_response({"message": f"container {cid} does not exist in database: no such container"},
                                     status=500)
        self.state[cid] = "exited"
        return web.Response(status=204)

    async def remove(self, request: web.Request) -> web.Response:
        await self.record(request)
        if request.match_info["id"] not in self.state:
            return web.json_response({"message": "no such container"}, status=404)
        if self.removing is not None:
            await self.removing.wait()
        self.state.pop(request.match_info["id"], None)
        return web.Response(status=204)

    async def list(self, request: web.Request) -> web.Response:
        await self.record(request)
        filters = json.loads(request.query["filters"])
        if filters["label"] == ["com.docker.compose.service=vllm"]:
            return web.json_response([{"Id": COMPOSE_ID, "Names": ["/flotilla-vllm-1"], "State": "running"}])
        statuses = filters.get("status")
        if "dead" in (statuses or ()):  # as podman's Docker API answers
            return web.json_response({"message": "unknown container state: dead: invalid argument"}, status=500)
        return web.json_response([{"Id": cid, "State": s} for cid, s in self.state.items()
                                  if statuses is None or s in statuses])


COMPOSE_CONTAINER = {
    "Id": COMPOSE_ID,
    "Config": {"Image": "flotilla:latest", "Cmd": ["fake-vllm", "serve", "llama-3.1-8b", "--port", "8000"],
               "Env": ["PATH=/usr/local/bin"], "ExposedPorts": {"8000/tcp": {}},
               "Labels": {"com.docker.compose.project": "flotilla", "com.docker.compose.service": "vllm",
                          "com.docker.compose.container-number": "1"}},
    "HostConfig": {"NetworkMode": "flotilla_default"},
    "NetworkSettings": {"Networks": {"flotilla_default": {"IPAddress": "172.18.0.3"}}},
}


@pytest.fixture
async def docker(tmp_path):
    fake = FakeDocker()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    path = str(tmp_path / "docker.sock")
    await web.UnixSite(runner, path).start()
    yield fake, path
    await runner.cleanup()


async def test_a_replica_is_a_labelled_container_reached_on_its_published_port(docker):
    fake, socket_path = docker
    settings = DockerSettings(socket_path=socket_path, image="flotilla:latest", fleet="vllm",
                              command=("fake-vllm", "serve", "llama-3.1-8b"), labels={"team": "ml"})
    actuator = DockerActuator(settings, flavor="vllm")
    handle = await actuator.start_replica()
    assert handle.replica_id == ID and handle.url == "http://127.0.0.1:49153"
    (m1, p1, q1, create), (m2, p2, q2, _), (m3, p3, _, _) = fake.calls
    assert (m1, p1) == ("POST", "/v1.43/containers/create") and q1["name"].startswith("vllm-")
    assert create == {
        "Image": "flotilla:latest",
        "Cmd": ["fake-vllm", "serve", "llama-3.1-8b", "--host", "0.0.0.0", "--port", "8000"],
        "Labels": {"team": "ml", MANAGED_LABEL: "vllm"},
        "ExposedPorts": {"8000/tcp": {}},
        "HostConfig": {"PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}},
    }
    assert (m2, p2, q2) == ("POST", f"/v1.43/containers/{ID}/start", {})
    assert (m3, p3) == ("GET", f"/v1.43/containers/{ID}/json")
    fake.calls.clear()
    await actuator.stop_replica(ID, grace_s=30)
    assert [c[:3] for c in fake.calls] == [("POST", f"/v1.43/containers/{ID}/stop", {"t": "30"}),
                                           ("DELETE", f"/v1.43/containers/{ID}", {"force": "true"})]
    await actuator.shutdown()


async def test_a_replica_on_a_network_is_reached_by_name_and_answers_to_the_fleet_name(docker):
    """flotilla compose's autoscaled engines: on the fleet's network, each replica is reached by
    its container name and also answers to the fleet name, which Prometheus resolves to them all."""
    fake, socket_path = docker
    settings = DockerSettings(socket_path=socket_path, image="flotilla:latest", network="flotilla", fleet="vllm",
                              command=("python", "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b"))
    actuator = DockerActuator(settings, flavor="vllm")
    handle = await actuator.start_replica()
    name, create = fake.calls[0][2]["name"], fake.calls[0][3]
    assert handle.url == f"http://{name}:8000"
    assert create["HostConfig"] == {"NetworkMode": "flotilla"}
    assert create["NetworkingConfig"] == {"EndpointsConfig": {"flotilla": {"Aliases": ["vllm"]}}}
    assert create["Cmd"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    await actuator.shutdown()
    assert fake.state == {}


async def test_a_compose_service_scales_with_copies_of_its_container(docker):
    fake, socket_path = docker
    actuator = DockerActuator(DockerSettings(socket_path=socket_path, compose_service="vllm", fleet="vllm"))
    handle = await actuator.start_replica()
    assert fake.calls[0][:3] == ("GET", "/v1.43/containers/json",
                                 {"filters": '{"label": ["com.docker.compose.service=vllm"]}'})
    assert fake.calls[1][:2] == ("GET", f"/v1.43/containers/{COMPOSE_ID}/json")
    create = fake.calls[2][3]
    assert create == {
        "Image": "flotilla:latest", "Cmd": ["fake-vllm", "serve", "llama-3.1-8b", "--port", "8000"],
        "Env": ["PATH=/usr/local/bin"],
        "Labels": {"com.docker.compose.project": "flotilla", "com.docker.compose.service": "vllm",
                   MANAGED_LABEL: "vllm"},
        "ExposedPorts": {"8000/tcp": {}}, "HostConfig": {"NetworkMode": "flotilla_default"},
        "NetworkingConfig": {"EndpointsConfig": {"flotilla_default": {"Aliases": ["vllm"]}}},
    }
    name = fake.calls[2][2]["name"]
    assert handle.url == f"http://{name}:8000"
    await actuator.shutdown()
    assert fake.state == {}


async def test_a_container_that_exited_is_reported_and_shutdown_removes_every_container(docker):
    fake, socket_path = docker
    actuator = DockerActuator(DockerSettings(socket_path=socket_path, image="flotilla:latest", fleet="vllm"))
    await actuator.start_replica()
    assert await actuator.exited() == []
    fake.state[ID] = "exited"
    assert await actuator.exited() == [ID]
    # no "status" filter: podman's Docker API answers status=dead with a 500
    assert fake.calls[-1][2] == {"all": "true", "filters": json.dumps({"label": [f"{MANAGED_LABEL}=vllm"]})}
    await actuator.shutdown()
    assert fake.state == {}


async def test_a_replica_being_stopped_is_not_reported_as_exited_on_its_own(docker):
    # The autoscaler's reconcile would stop it a second time, racing the removal (podman answers 500).
    fake, socket_path = docker
    actuator = DockerActuator(DockerSettings(socket_path=socket_path, image="flotilla:latest", fleet="vllm"))
    await actuator.start_replica()
    fake.removing = asyncio.Event()
    stopping = asyncio.create_task(actuator.stop_replica(ID))
    while fake.calls[-1][0] != "DELETE":
        await asyncio.sleep(0.01)
    assert fake.state[ID] == "exited"
    assert await actuator.exited() == []
    fake.removing.set()
    await stopping
    assert fake.state == {}
    await actuator.shutdown()


async def test_shutdown_removes_every_container_it_can_when_one_is_gone_or_refuses(docker, caplog):
    # `docker compose down` removes the copies of a compose service too, racing the proxy's shutdown
    fake, socket_path = docker
    actuator = DockerActuator(DockerSettings(socket_path=socket_path, image="flotilla:latest", fleet="vllm"))
    gone, refusing, kept = [(await actuator.start_replica()).replica_id for _ in range(3)]
    del fake.state[gone]
    fake.refuses.add(refusing)
    await actuator.shutdown()
    assert kept not in fake.state and ("DELETE", f"/v1.43/containers/{kept}") in [c[:2] for c in fake.calls]
    assert fake.state == {refusing: "running"}
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"docker: container {refusing[:12]} was not removed at shutdown: docker POST /containers/{refusing}/stop: "
        "500 container state improper"]


async def test_an_api_error_names_the_call_and_the_engine_message(docker):
    _, socket_path = docker
    actuator = DockerActuator(DockerSettings(socket_path=socket_path, image="missing:latest"))
    with pytest.raises(ActuatorError, match="create: 404 No such image: missing:latest"):
        await actuator.start_replica()
    await actuator.shutdown()


def test_settings_need_an_image_or_a_compose_service():
    with pytest.raises(ActuatorError, match="image"):
        DockerSettings()
