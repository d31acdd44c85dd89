"""The Kubernetes API as the proxy uses it: a client, and the endpoints of one Service.

The client is lightkube's (the `k8s` extra: `pip install 'flotilla[k8s]'`). It reads a kubeconfig
(its exec credential plugins included, run again when the API answers 401) or, inside a pod, the
service account, whose token it reads again on a 401 (the kubelet rotates it).

`EndpointSliceFollower` lists the EndpointSlices of a Service, then watches them from the list's
resourceVersion, and keeps every endpoint that is not terminating, named by its pod: ready or
not, since the proxy's own probes decide when a backend serves. A watch that ends or fails is
resumed by listing again. The autoscaler's Kubernetes actuator and the proxy's `--discover
k8s:SERVICE` both follow a Service through it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""Label the EndpointSlice controller puts on every slice of a Service."""
RELIST_DELAY_S = 1.0
"""Pause before listing again after a failed list or watch."""


class KubeError(RuntimeError):
    """The Kubernetes API could not be reached or refused a call; the message says which."""


@dataclass(frozen=True)
class Endpoint:
    """One pod behind a Service, as an EndpointSlice lists it."""

    pod: str
    """The pod's name (the endpoint's address when the slice names no pod)."""
    url: str
    """http://ADDRESS:PORT of the slice's port."""


def client(kubeconfig: Path | str | None = None, context: str | None = None,
           namespace: str | None = None) -> tuple[AsyncClient, str]:
    """An async API client and the namespace to work in: `namespace`, else the kubeconfig
    context's (or, in a pod, its own), else `default`. Without `kubeconfig`: the pod's service
    account, else $KUBECONFIG or ~/.kube/config."""
    try:
        from lightkube import AsyncClient, KubeConfig
        from lightkube.core.exceptions import ConfigError as LightkubeConfigError
    except ImportError:
        raise KubeError("kubernetes: the client library is missing; pip install 'flotilla[k8s]'") from None
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
        single = config.get(context_name=context)
        if single is None:
            raise KubeError(f"kubernetes: no context {context or '(current)'} in the configuration")
        chosen = namespace or single.namespace or "default"
        return AsyncClient(config=single, namespace=chosen), chosen
    except (LightkubeConfigError, OSError, AssertionError, KeyError, ValueError) as exc:
        # lightkube asserts that a context names a user
        raise KubeError(f"kubernetes: no usable configuration: {exc or type(exc).__name__}") from None


def api_error(what: str, exc: Exception) -> KubeError:
    """A KubeError naming the call and what the API (or the network) said."""
    status = getattr(exc, "status", None)
    if status is not None and getattr(status, "code", None):  # lightkube's ApiError: the API's Status
        return KubeError(f"kubernetes {what}: {status.code} {status.message or status.reason}")
    response = getattr(exc, "response", None)
    if response is not None:  # an HTTP error answer lightkube did not decode (a 401 from its auth flow)
        return KubeError(f"kubernetes {what}: {response.status_code} {_message(response)}")
    return KubeError(f"kubernetes {what}: {exc!r}")


def _message(response: Any) -> str:
    try:
        return str(response.json()["message"])
    except Exception:  # not a Status body: the status line says enough
        return str(response.reason_phrase)


def live_endpoints(item: Any, port_name: str | None = None) -> list[Endpoint]:
    """The endpoints of one EndpointSlice that are not terminating, on the port named
    `port_name` (default the slice's first port)."""
    port = _port(item.ports or (), port_name)
    if port is None:
        return []
    found = []
    for endpoint in item.endpoints or ():
        conditions = endpoint.conditions
        if (conditions is not None and conditions.terminating) or not endpoint.addresses:
            continue
        address = endpoint.addresses[0]
        host = f"[{address}]" if ":" in address else address
        pod = endpoint.targetRef.name if endpoint.targetRef is not None and endpoint.targetRef.name else address
        found.append(Endpoint(pod, f"http://{host}:{port}"))
    return found


def _port(ports: Iterable[Any], name: str | None) -> int | None:
    for p in ports:
        if name is None or p.name == name:
            return p.port
    return None


class EndpointSliceFollower:
    """The live endpoints of one Service, kept current by a list and a watch."""

    def __init__(self, api: AsyncClient, namespace: str, service: str, port_name: str | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.slices: dict[str, list[Endpoint]] = {}
        """EndpointSlice name -> its live endpoints."""
        self.synced = asyncio.Event()
        """Set once the first list answered (or failed: callers then see no endpoints yet)."""

    @property
    def labels(self) -> dict[str, Any]:
        return {SERVICE_NAME_LABEL: self.service}

    def endpoints(self) -> list[Endpoint]:
        """Every live endpoint, each pod once, sorted by pod name."""
        seen: dict[str, Endpoint] = {}
        for found in self.slices.values():
            for e in found:
                seen.setdefault(e.pod, e)
        return sorted(seen.values(), key=lambda e: e.pod)

    async def run(self, on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        """List, then watch, until cancelled; `on_change` runs after the list and after every event."""
        while True:
            try:
                version = await self.list()
                self.synced.set()
                if on_change is not None:
                    await on_change()
                await self.watch(version, on_change)
            except KubeError as exc:
                log.warning("%s; listing again", exc)
            except Exception:  # a bug in on_change must not end the following for good
                log.exception("kubernetes: following service %s failed; listing again", self.service)
            self.synced.set()
            await asyncio.sleep(RELIST_DELAY_S)

    async def list(self) -> str:
        """Replace the known slices with a fresh list; return its resourceVersion."""
        from lightkube.resources.discovery_v1 import EndpointSlice

        listing = self.api.list(EndpointSlice, namespace=self.namespace, labels=self.labels)
        try:
            items = [item async for item in listing]
            version = listing.resourceVersion
        except Exception as exc:  # lightkube raises httpx's errors, ApiError and its own
            raise api_error(f"list endpointslices of service {self.service}", exc) from None
        self.slices = {item.metadata.name: live_endpoints(item, self.port_name)
                       for item in items if item.metadata is not None and item.metadata.name}
        return version

    async def watch(self, version: str, on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        """Apply watch events from `version` on, until an error (lightkube resumes a watch the
        server ended from the last version seen)."""
        from lightkube.resources.discovery_v1 import EndpointSlice

        events = self.api.watch(EndpointSlice, namespace=self.namespace, labels=self.labels,
                                resource_version=version)
        stream = aiter(events)
        while True:
            try:
                kind, item = await anext(stream)
            except StopAsyncIteration:
                return
            except Exception as exc:  # e.g. 410 Gone: the version is too old; list again
                raise api_error(f"watch endpointslices of service {self.service}", exc) from None
            self.apply(kind, item)
            if on_change is not None:
                await on_change()

    def apply(self, kind: str, item: Any) -> None:
        name = item.metadata.name if item.metadata is not None else None
        if not name:
            return
        if kind in ("ADDED", "MODIFIED"):
            self.slices[name] = live_endpoints(item, self.port_name)
        elif kind == "DELETED":
            self.slices.pop(name, None)

