"""A fake Kubernetes API server on 127.0.0.1 that answers as a real one does, for the client library
the proxy uses (lightkube) to talk to.

It checks the bearer token and each request's method, path, query, content type and JSON body,
and answers with the recorded shapes of a v1.30 API server: Scale, EndpointSliceList, the
watch stream of EndpointSlice events (one JSON object a line), Status errors. Tests push
watch events into `events[SERVICE]` and read `calls`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from pathlib import Path

from aiohttp import web

TOKEN = "eyJhbGciOiJSUzI1NiJ9.test"
NAMESPACE = "ml"
SCALE = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/vllm/scale"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"

_versions = itertools.count(5001)


def endpoint(pod: str, ip: str, ready: bool = True, terminating: bool = False) -> dict:
    """One endpoint as the EndpointSlice controller writes it."""
    return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
            "nodeName": "node-a", "zone": "zone-1",
            "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": pod, "uid": f"uid-{pod}"}}


def endpoint_slice(*endpoints: dict, name: str = "vllm-abcde", service: str = "vllm", port: int = 8000) -> dict:
    """An EndpointSlice of `service` listing `endpoints`, with a fresh resourceVersion."""
    return {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
            "metadata": {"name": name, "generateName": f"{service}-", "namespace": NAMESPACE,
                         "uid": f"uid-{name}", "resourceVersion": str(next(_versions)), "generation": 1,
                         "creationTimestamp": "2024-06-01T10:00:00Z",
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                              "uid": f"uid-svc-{service}", "controller": True,
                                              "blockOwnerDeletion": True}]},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}], "endpoints": list(endpoints)}


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self) -> None:
        self.replicas = 2
        self.calls: list[tuple[str, str, dict, object]] = []
        self.events: defaultdict[str, asyncio.Queue[dict]] = defaultdict(asyncio.Queue)
        """Service name -> watch events its watchers get."""
        self.slices: dict[str, list[dict]] = {"vllm": [endpoint_slice(endpoint("vllm-7d9f-a", "10.0.0.11"),
                                                                      endpoint("vllm-7d9f-b", "10.0.0.12"))]}
        """Service name -> its EndpointSlices, as a list answers them."""
        self.token = TOKEN
        self.watchers = 0
        """Watch streams open now."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.add_routes([web.get(SCALE, self.get_scale), web.patch(SCALE, self.patch_scale),
                        web.patch(PODS + "/{pod}", self.patch_pod), web.get(SLICES, self.list_or_watch)])
        return app

    @web.middleware
    async def auth(self, request: web.Request, handler):
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, dict(request.query), body))
        if request.method == "PATCH" and request.headers["Content-Type"] != "application/merge-patch+json":
            return web.json_response(status(415, "UnsupportedMediaType", "unsupported patch"), status=415)
        return await handler(request)

    def scale(self) -> dict:
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "vllm", "namespace": NAMESPACE, "uid": "uid-deploy-vllm",
                             "resourceVersion": "1201", "creationTimestamp": "2024-06-01T10:00:00Z"},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": "app.kubernetes.io/name=vllm"}}

    async def get_scale(self, request: web.Request) -> web.Response:
        return web.json_response(self.scale())

    async def patch_scale(self, request: web.Request) -> web.Response:
        self.replicas = self.calls[-1][3]["spec"]["replicas"]
        return web.json_response(self.scale())

    async def patch_pod(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {
            "name": request.match_info["pod"], "namespace": NAMESPACE, "resourceVersion": "7001",
            **self.calls[-1][3]["metadata"]}, "spec": {"containers": [{"name": "engine", "image": "flotilla:latest"}]}})

    def service_of(self, request: web.Request) -> str:
        key, _, service = request.query.get("labelSelector", "").partition("=")
        assert key == "kubernetes.io/service-name", request.query
        return service

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        service = self.service_of(request)
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                      "metadata": {"resourceVersion": "5000"},
                                      "items": self.slices.get(service, [])})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.watchers += 1
        try:
            while True:
                event = await self.events[service].get()
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self.watchers -= 1


async def serve(fake: FakeApiServer, tmp_path: Path):
    """Start `fake` on 127.0.0.1; yield (runner, kubeconfig path) whose context points at it."""
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
  context: {{cluster: test, user: flotilla, namespace: {NAMESPACE}}}
""")
    return runner, kubeconfig
