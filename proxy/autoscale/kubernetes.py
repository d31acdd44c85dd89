"""The kubernetes actuator: scale a Deployment or StatefulSet, follow its pods' endpoints.

It calls the API server through lightkube (proxy/kube.py: kubeconfig with exec plugins, or the
pod's rotating service-account token):

    GET   /apis/apps/v1/namespaces/NS/deployments/NAME/scale        the current spec.replicas
    PATCH /apis/apps/v1/namespaces/NS/deployments/NAME/scale        {"spec": {"replicas": N}}
    PATCH /api/v1/namespaces/NS/pods/POD                            pod-deletion-cost, before a scale-down
    GET   /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=SVC
          ... &watch=true&resourceVersion=RV                        then follow the changes

Every endpoint that is not terminating is a replica (its pod name is the replica id), ready or
not: the proxy's own probes decide when it serves. A scale-up is a replica still being scheduled
until its pod shows up in an EndpointSlice. To make a scale-down remove the pod the autoscaler
drained, the pod gets `controller.kubernetes.io/pod-deletion-cost: "-1000"` first (Deployments;
a StatefulSet always removes its highest ordinal). `shutdown()` leaves the workload as it is:
the engines outlive a proxy restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.autoscale.actuator import Actuator, ActuatorError, ReplicaHandle
from proxy.kube import EndpointSliceFollower, KubeError, api_error, client

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
WORKLOAD_KINDS = {"deployment": "deployments", "statefulset": "statefulsets"}


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
    """Default: in-cluster configuration, else $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """kubeconfig context; default its current context."""
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
    def __init__(self, settings: KubernetesSettings, flavor: str = "vllm", api: AsyncClient | None = None) -> None:
        self.settings = settings
        self.flavor = flavor
        if api is None:
            try:
                api, self.namespace = client(settings.kubeconfig, settings.context, settings.namespace)
            except KubeError as exc:
                raise ActuatorError(str(exc)) from None
        else:
            self.namespace = settings.namespace or api.namespace
        self.api = api
        self.follower = EndpointSliceFollower(self.api, self.namespace, settings.service or settings.name,
                                              settings.port_name)
        self._pending: list[str] = []
        self._launched = 0
        self._desired: int | None = None
        self._watch: asyncio.Task | None = None

    @property
    def scale_resource(self) -> Any:
        from lightkube.resources.apps_v1 import Deployment, StatefulSet

        return Deployment.Scale if self.settings.kind == "deployments" else StatefulSet.Scale

    async def _call(self, what: str, call: Any) -> Any:
        try:
            return await call
        except Exception as exc:  # lightkube raises httpx's errors and ApiError (an httpx error)
            raise ActuatorError(str(api_error(what, exc))) from None

    # --- scaling -------------------------------------------------------------------------

    async def current_scale(self) -> int:
        s = self.settings
        scale = await self._call(f"get {s.kind}/{s.name}/scale",
                                 self.api.get(self.scale_resource, s.name, namespace=self.namespace))
        self._desired = int(scale.spec.replicas or 0) if scale.spec is not None else 0
        return self._desired

    async def set_scale(self, replicas: int) -> None:
        from lightkube.types import PatchType

        s = self.settings
        await self._call(f"patch {s.kind}/{s.name}/scale", self.api.patch(
            self.scale_resource, s.name, {"spec": {"replicas": replicas}}, namespace=self.namespace,
            patch_type=PatchType.MERGE))
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
                await self._mark_for_deletion(replica_id)
            except ActuatorError as exc:  # e.g. no RBAC for pods/patch: the ReplicaSet picks the pod
                log.warning("%s", exc)
        if replica_id in self._pending:
            self._pending.remove(replica_id)
        desired = self._desired if self._desired is not None else await self.current_scale()
        await self.set_scale(max(0, desired - 1))

    async def _mark_for_deletion(self, pod: str) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-1000"}}}
        await self._call(f"patch pods/{pod}", self.api.patch(Pod, pod, patch, namespace=self.namespace,
                                                             patch_type=PatchType.MERGE))

    async def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        with contextlib.suppress(Exception):  # closing must not hide why the proxy stops
            await self.api.close()

    # --- endpoints ---------------------------------------------------------------------------

    async def replicas(self) -> list[ReplicaHandle]:
        await self._ensure_watch()
        live = self.endpoints()
        while self._pending and len(live) + len(self._pending) > (self._desired or 0):
            self._pending.pop(0)  # a scheduled pod showed up: its placeholder is resolved
        return live + [ReplicaHandle(p, None) for p in self._pending]

    def endpoints(self) -> list[ReplicaHandle]:
        return [ReplicaHandle(e.pod, e.url) for e in self.follower.endpoints()]

    async def _ensure_watch(self) -> None:
        if self._watch is None:
            if self._desired is None:
                await self.current_scale()
            self._watch = asyncio.create_task(self.follower.run())
        await self.follower.synced.wait()
