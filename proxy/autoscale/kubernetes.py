"""The kubernetes actuator: scale a Deployment or StatefulSet, follow its pods' endpoints.

Plain HTTP against the API server (no client library):

    GET   /apis/apps/v1/namespaces/NS/deployments/NAME/scale        the current spec.replicas
    PATCH /apis/apps/v1/namespaces/NS/deployments/NAME/scale        {"spec": {"replicas": N}}
    PATCH /api/v1/namespaces/NS/pods/POD                            pod-deletion-cost, before a scale-down
    GET   /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=SVC
          ... &watch=1&resourceVersion=RV&allowWatchBookmarks=true  then follow the changes

Every endpoint that is not terminating is a replica (its pod name is the replica id), ready or
not: the proxy's own probes decide when it serves. A scale-up is a replica still being scheduled
until its pod shows up in an EndpointSlice. To make a scale-down remove the pod the autoscaler
drained, the pod gets `controller.kubernetes.io/pod-deletion-cost: "-1000"` first (Deployments;
a StatefulSet always removes its highest ordinal). `shutdown()` leaves the workload as it is:
the engines outlive a proxy restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from proxy.autoscale.actuator import Actuator, ActuatorError, ReplicaHandle

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
WORKLOAD_KINDS = {"deployment": "deployments", "statefulset": "statefulsets"}


@dataclass
class ApiServer:
    """How to reach the API server."""

    url: str
    """Base URL, e.g. https://10.96.0.1:443."""
    token: str | None = None
    """Bearer token (a service account's)."""
    ssl_context: ssl.SSLContext | bool | None = None
    """TLS trust (the cluster CA, a client certificate); None: the system's defaults."""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def in_cluster(sa_dir: Path = SERVICE_ACCOUNT_DIR, env: dict[str, str] | None = None) -> ApiServer:
    """The API server as a pod sees it: service-account token and CA, KUBERNETES_SERVICE_* env."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ActuatorError("kubernetes: not in a cluster (KUBERNETES_SERVICE_HOST unset); give --kubeconfig")
    context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    host = f"[{host}]" if ":" in host else host
    return ApiServer(f"https://{host}:{port}", (sa_dir / "token").read_text().strip(), context)


def in_cluster_namespace(sa_dir: Path = SERVICE_ACCOUNT_DIR) -> str | None:
    path = sa_dir / "namespace"
    return path.read_text().strip() if path.exists() else None


def from_kubeconfig(path: Path, context_name: str | None = None) -> tuple[ApiServer, str | None]:
    """The API server of a kubeconfig's (current) context, and the context's namespace."""
    config = yaml.safe_load(path.read_text()) or {}
    name = context_name or config.get("current-context")
    context = _named(config, "contexts", name, path)["context"]
    cluster = _named(config, "clusters", context["cluster"], path)["cluster"]
    user = (_named(config, "users", context["user"], path).get("user") or {}) if context.get("user") else {}
    server = cluster["server"]
    ssl_context: ssl.SSLContext | bool | None = None
    if server.startswith("https"):
        ssl_context = _tls(cluster, user, path.parent)
    return ApiServer(server, user.get("token"), ssl_context), context.get("namespace")


def _named(config: dict, section: str, name: str | None, path: Path) -> dict:
    for item in config.get(section) or ():
        if item.get("name") == name:
            return item
    raise ActuatorError(f"kubeconfig {path}: no {section[:-1]} named {name!r}")


def _tls(cluster: dict, user: dict, base: Path) -> ssl.SSLContext | bool:
    if cluster.get("insecure-skip-tls-verify"):
        return False
    context = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
    if "client-certificate-data" in user:
        # ssl wants files; the key lives in a private temporary directory only while it is loaded.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(str(cert), str(key))
    elif "client-certificate" in user:
        context.load_cert_chain(str(base / user["client-certificate"]), str(base / user["client-key"]))
    return context


@dataclass
class KubernetesSettings:
    """Which workload to scale and which Service's endpoints to follow."""

    workload: str = "deployment/vllm"
    """KIND/NAME of the engines' Deployment or StatefulSet."""
    service: str | None = None
    """Service whose EndpointSlices list the engine pods; default the workload's name."""
    namespace: str | None = None
    """Default: the kubeconfig context's, or the pod's own namespace, else `default`."""
    port_name: str | None = None
    """EndpointSlice port to route to (by name); default the slice's first port."""
    kubeconfig: Path | None = None
    """Default: in-cluster configuration."""
    context: str | None = None
    """kubeconfig context; default its current context."""
    watch_timeout_s: int = 300
    """Server-side timeout of one watch request; the watch is then resumed."""
    deletion_cost: bool = True
    """Mark a drained pod as the cheapest to delete before scaling down."""

    kind: str = field(init=False)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.kubeconfig is not None:
            self.kubeconfig = Path(self.kubeconfig)  # a fleet file gives text
        kind, sep, name = self.workload.partition("/")
        if not sep or kind.lower() not in WORKLOAD_KINDS or not name:
            raise ActuatorError(f"kubernetes workload={self.workload!r}: expected deployment/NAME or "
                                "statefulset/NAME")
        self.kind, self.name = WORKLOAD_KINDS[kind.lower()], name


class KubernetesActuator(Actuator):
    def __init__(self, settings: KubernetesSettings, api: ApiServer | None = None, flavor: str = "vllm") -> None:
        self.settings = settings
        self.flavor = flavor
        namespace = settings.namespace
        if api is None and settings.kubeconfig is not None:
            api, namespace = from_kubeconfig(settings.kubeconfig, settings.context)
            namespace = settings.namespace or namespace
        self.api = api or in_cluster()
        self.namespace = namespace or in_cluster_namespace() or "default"
        self._session: aiohttp.ClientSession | None = None
        self._slices: dict[str, list[ReplicaHandle]] = {}
        """EndpointSlice name -> the live (not terminating) endpoints it lists."""
        self._pending: list[str] = []
        self._launched = 0
        self._desired: int | None = None
        self._watch: asyncio.Task | None = None
        self._synced = asyncio.Event()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.api.headers(),
                                                  connector=aiohttp.TCPConnector(ssl=self.api.ssl_context))
        return self._session

    @property
    def scale_path(self) -> str:
        s = self.settings
        return f"/apis/apps/v1/namespaces/{self.namespace}/{s.kind}/{s.name}/scale"

    @property
    def slices_path(self) -> str:
        return f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"

    @property
    def selector(self) -> str:
        return f"kubernetes.io/service-name={self.settings.service or self.settings.name}"

    async def _call(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> dict:
        headers = {"Content-Type": MERGE_PATCH} if method == "PATCH" else {}
        data = json.dumps(body) if body is not None else None
        try:
            async with self.session.request(method, self.api.url + path, data=data, params=params,
                                            headers=headers) as resp:
                answer = await resp.json(content_type=None)
                if resp.status >= 400:
                    message = answer.get("message") if isinstance(answer, dict) else answer
                    raise ActuatorError(f"kubernetes {method} {path}: {resp.status} {message}")
                return answer
        except (aiohttp.ClientError, ValueError) as exc:
            raise ActuatorError(f"kubernetes {method} {path}: {exc}") from exc

    # --- scaling -------------------------------------------------------------------------

    async def current_scale(self) -> int:
        scale = await self._call("GET", self.scale_path)
        self._desired = int((scale.get("spec") or {}).get("replicas") or 0)
        return self._desired

    async def set_scale(self, replicas: int) -> None:
        await self._call("PATCH", self.scale_path, {"spec": {"replicas": replicas}})
        self._desired = replicas

    async def start_replica(self) -> ReplicaHandle:
        await self._ensure_watch()
        desired = self._desired if self._desired is not None else await self.current_scale()
        await self.set_scale(desired + 1)
        self._launched += 1
        placeholder = f"{self.settings.name}-scheduling-{self._launched}"
        self._pending.append(placeholder)
        return ReplicaHandle(placeholder, None)

    async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
        """Scale down by one, after marking `replica_id` (a pod) as the one to delete."""
        if self.settings.deletion_cost and self.settings.kind == "deployments" and replica_id not in self._pending:
            try:
                await self._call("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{replica_id}",
                                 {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-1000"}}})
            except ActuatorError as exc:  # e.g. no RBAC for pods/patch: the ReplicaSet picks the pod
                log.warning("%s", exc)
        if replica_id in self._pending:
            self._pending.remove(replica_id)
        desired = self._desired if self._desired is not None else await self.current_scale()
        await self.set_scale(max(0, desired - 1))

    async def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._session is not None:
            await self._session.close()

    # --- endpoints ---------------------------------------------------------------------------

    async def replicas(self) -> list[ReplicaHandle]:
        await self._ensure_watch()
        live = self.endpoints()
        while self._pending and len(live) + len(self._pending) > (self._desired or 0):
            self._pending.pop(0)  # a scheduled pod showed up: its placeholder is resolved
        return live + [ReplicaHandle(p, None) for p in self._pending]

    def endpoints(self) -> list[ReplicaHandle]:
        seen: dict[str, ReplicaHandle] = {}
        for handles in self._slices.values():
            for h in handles:
                seen.setdefault(h.replica_id, h)
        return sorted(seen.values(), key=lambda h: h.replica_id)

    async def _ensure_watch(self) -> None:
        if self._watch is None:
            if self._desired is None:
                await self.current_scale()
            self._watch = asyncio.create_task(self._follow())
        await self._synced.wait()

    async def _follow(self) -> None:
        while True:
            try:
                version = await self._list()
                self._synced.set()
                await self._watch_from(version)
            except (ActuatorError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("kubernetes: endpoint watch: %r; listing again", exc)
                self._synced.set()
                await asyncio.sleep(1.0)

    async def _list(self) -> str:
        listed = await self._call("GET", self.slices_path, params={"labelSelector": self.selector})
        self._slices = {item["metadata"]["name"]: self._live(item) for item in listed.get("items") or ()}
        return listed["metadata"]["resourceVersion"]

    async def _watch_from(self, version: str) -> None:
        params = {"labelSelector": self.selector, "watch": "1", "resourceVersion": version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(self.settings.watch_timeout_s)}
        async with self.session.get(self.api.url + self.slices_path, params=params,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
            if resp.status != 200:
                raise ActuatorError(f"kubernetes watch: {resp.status}")
            async for line in resp.content:
                if line.strip():
                    self.apply_event(json.loads(line))

    def apply_event(self, event: dict) -> None:
        kind, item = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
            raise ActuatorError(f"kubernetes watch: {item.get('message')}")
        name = (item.get("metadata") or {}).get("name")
        if kind in ("ADDED", "MODIFIED") and name:
            self._slices[name] = self._live(item)
        elif kind == "DELETED" and name:
            self._slices.pop(name, None)

    def _live(self, item: dict) -> list[ReplicaHandle]:
        port = self._port(item.get("ports") or [])
        handles = []
        for endpoint in item.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            if conditions.get("terminating") or not endpoint.get("addresses") or port is None:
                continue
            address = endpoint["addresses"][0]
            host = f"[{address}]" if ":" in address else address
            pod = (endpoint.get("targetRef") or {}).get("name") or address
            handles.append(ReplicaHandle(pod, f"http://{host}:{port}"))
        return handles

    def _port(self, ports: list[dict]) -> int | None:
        for p in ports:
            if self.settings.port_name is None or p.get("name") == self.settings.port_name:
                return p.get("port")
        return None
