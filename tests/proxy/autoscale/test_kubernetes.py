"""The kubernetes actuator against a recorded API contract: a fake API server on 127.0.0.1 that
checks the bearer token, each request's method, path, query, content type and JSON body, and
answers Scale, EndpointSliceList and watch events in the shapes the Kubernetes API documents."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from policies.routing.base import BackendState
from policies.scaling import create_policy
from proxy.autoscale.actuator import ActuatorError
from proxy.autoscale.kubernetes import KubernetesActuator, KubernetesSettings, from_kubeconfig
from proxy.autoscale.loop import Autoscaler
from proxy.autoscale.signals import ArrivalCounter, PoolSignals
from proxy.pool import BackendPool
from tests.waiting import wait_until

TOKEN = "eyJhbGciOiJSUzI1NiJ9.test"
SCALE = "/apis/apps/v1/namespaces/ml/deployments/vllm/scale"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices"


def endpoint(pod: str, ip: str, ready: bool = True, terminating: bool = False) -> dict:
    return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": "ml", "name": pod}}


def endpoint_slice(*endpoints: dict, name: str = "vllm-abcde") -> dict:
    return {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "ml", "labels": {"kubernetes.io/service-name": "vllm"}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}], "endpoints": list(endpoints)}


class FakeApiServer:
    def __init__(self) -> None:
        self.replicas = 2
        self.calls: list[tuple[str, str, dict, object]] = []
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.slice = endpoint_slice(endpoint("vllm-7d9f-a", "10.0.0.11"), endpoint("vllm-7d9f-b", "10.0.0.12"))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.add_routes([web.get(SCALE, self.get_scale), web.patch(SCALE, self.patch_scale),
                        web.patch("/api/v1/namespaces/ml/pods/{pod}", self.patch_pod),
                        web.get(SLICES, self.slices)])
        return app

    @web.middleware
    async def auth(self, request: web.Request, handler):
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "Unauthorized",
                                      "code": 401, "message": "Unauthorized"}, status=401)
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, dict(request.query), body))
        if request.method == "PATCH" and request.headers["Content-Type"] != "application/merge-patch+json":
            return web.json_response({"kind": "Status", "code": 415, "message": "unsupported patch"}, status=415)
        return await handler(request)

    def scale(self) -> dict:
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "vllm", "namespace": "ml", "resourceVersion": "1201"},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": "app.kubernetes.io/name=vllm"}}

    async def get_scale(self, request: web.Request) -> web.Response:
        return web.json_response(self.scale())

    async def patch_scale(self, request: web.Request) -> web.Response:
        self.replicas = self.calls[-1][3]["spec"]["replicas"]
        return web.json_response(self.scale())

    async def patch_pod(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {
            "name": request.match_info["pod"], "namespace": "ml", **self.calls[-1][3]["metadata"]}})

    async def slices(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                      "metadata": {"resourceVersion": "5001"}, "items": [self.slice]})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while True:
            event = await self.events.get()
            await response.write(json.dumps(event).encode() + b"\n")


@pytest.fixture
async def api(tmp_path):
    fake = FakeApiServer()
    # the watch handler waits on a queue: cancel it when its client goes
    runner = web.AppRunner(fake.app(), handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
current-context: test
clusters:
- name: test
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: flotilla
  user: {{token: "{TOKEN}"}}
contexts:
- name: test
  context: {{cluster: test, user: flotilla, namespace: ml}}
""")
    yield fake, kubeconfig
    await runner.cleanup()


async def test_replicas_follow_the_endpoint_slices_and_scaling_patches_the_scale_subresource(api):
    fake, kubeconfig = api
    # a fleet file gives the kubeconfig path as text
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=str(kubeconfig)))
    try:
        found = await actuator.replicas()
        assert [(h.replica_id, h.url) for h in found] == [("vllm-7d9f-a", "http://10.0.0.11:8000"),
                                                           ("vllm-7d9f-b", "http://10.0.0.12:8000")]
        assert fake.calls[0][:3] == ("GET", SCALE, {})
        assert fake.calls[1][:3] == ("GET", SLICES, {"labelSelector": "kubernetes.io/service-name=vllm"})
        await wait_until(lambda: len(fake.calls) >= 3)
        assert fake.calls[2][:3] == ("GET", SLICES, {
            "labelSelector": "kubernetes.io/service-name=vllm", "watch": "1", "resourceVersion": "5001",
            "allowWatchBookmarks": "true", "timeoutSeconds": "300"})

        placeholder = await actuator.start_replica()
        assert placeholder.url is None
        assert fake.calls[-1] == ("PATCH", SCALE, {}, {"spec": {"replicas": 3}})
        assert [h.replica_id for h in await actuator.replicas()][-1] == placeholder.replica_id

        fake.slice = endpoint_slice(*fake.slice["endpoints"], endpoint("vllm-7d9f-c", "10.0.0.13", ready=False))
        await fake.events.put({"type": "MODIFIED", "object": fake.slice})
        await wait_until(lambda: len(actuator.endpoints()) == 3)
        assert [h.replica_id for h in await actuator.replicas()] == ["vllm-7d9f-a", "vllm-7d9f-b", "vllm-7d9f-c"]

        await actuator.stop_replica("vllm-7d9f-b")
        assert fake.calls[-2] == ("PATCH", "/api/v1/namespaces/ml/pods/vllm-7d9f-b", {}, {
            "metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}})
        assert fake.calls[-1] == ("PATCH", SCALE, {}, {"spec": {"replicas": 2}})
        terminating = endpoint("vllm-7d9f-b", "10.0.0.12", ready=False, terminating=True)
        await fake.events.put({"type": "MODIFIED", "object": endpoint_slice(
            fake.slice["endpoints"][0], terminating, fake.slice["endpoints"][2])})
        await wait_until(lambda: [h.replica_id for h in actuator.endpoints()] == ["vllm-7d9f-a", "vllm-7d9f-c"])
        await fake.events.put({"type": "DELETED", "object": fake.slice})
        await wait_until(lambda: actuator.endpoints() == [])
    finally:
        await actuator.shutdown()
    assert fake.replicas == 2  # shutdown leaves the workload as it is


async def test_the_loop_keeps_the_pool_in_step_with_the_pods(api):
    fake, kubeconfig = api
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    pool = BackendPool()
    scaler = Autoscaler(create_policy("seed"), actuator, pool, PoolSignals(pool, ArrivalCounter()))
    try:
        await scaler.reconcile(0.0)
        assert sorted(b.url for b in pool) == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]
        assert all(b.spec.flavor == "vllm" and b.source == "autoscaler" for b in pool)
        for backend in pool:
            backend.state = BackendState.READY
        await scaler.reconcile(1.0)
        assert scaler.fleet_state(1.0).ready == 2
        assert scaler.measured_cold_start_s is None  # found running: their launch time is unknown
        await scaler.start_replicas(1, 5.0)
        assert scaler.fleet_state(6.0).starting == 1  # the placeholder
        fake.slice = endpoint_slice(endpoint("vllm-7d9f-a", "10.0.0.11"))
        await fake.events.put({"type": "MODIFIED", "object": fake.slice})
        await wait_until(lambda: len(actuator.endpoints()) == 1)
        await scaler.reconcile(7.0)
        assert [b.url for b in pool] == ["http://10.0.0.11:8000"]  # the vanished pod left the pool
        assert sorted(scaler.replicas) == ["vllm-7d9f-a", "vllm-scheduling-1"]
        assert scaler.replicas["vllm-scheduling-1"].started_at_s == 5.0
    finally:
        await actuator.shutdown()


async def test_a_wrong_token_is_an_error_naming_the_call(api):
    fake, kubeconfig = api
    server, namespace = from_kubeconfig(kubeconfig)
    assert namespace == "ml"
    server.token = "wrong"
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", namespace="ml"), api=server)
    with pytest.raises(ActuatorError, match=f"GET {SCALE}: 401 Unauthorized"):
        await actuator.current_scale()
    await actuator.shutdown()


def test_the_workload_names_its_kind():
    with pytest.raises(ActuatorError, match="deployment/NAME"):
        KubernetesSettings(workload="vllm")
    assert KubernetesSettings(workload="StatefulSet/llama").kind == "statefulsets"
