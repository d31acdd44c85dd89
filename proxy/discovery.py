"""Backends found through the Kubernetes API: the pods behind a Service, followed as they come and go.

    flotilla proxy --discover llamacpp=k8s:llama          # [FLAVOR=]k8s:SERVICE, repeatable

or in the fleet file, beside (or instead of) `backends:`::

    proxy:
      discover:
        - source: k8s:llama
          flavor: llamacpp      # vllm | llamacpp | openai
          weight: 1.05          # capacity weight of each pod, as for backends
          port_name: http       # EndpointSlice port; default the first
          namespace: ml         # default the kubeconfig context's, or the pod's own

Each Service's EndpointSlices are listed and watched (proxy/kube.py). Every pod that is not
terminating is a backend: new pods join the pool as starting (the proxy's probes make them ready),
pods that go are drained out of it, the same way a fleet-file reload changes the file's backends
(proxy/reload.apply_fleet), under the source name `k8s:SERVICE`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.config import FLAVORS, BackendSpec, ConfigError, load_yaml, read_config_file

if TYPE_CHECKING:
    from aiohttp import web
    from lightkube import AsyncClient

    from proxy.kube import EndpointSliceFollower
    from proxy.pool import Backend, BackendPool

SCHEMES = ("k8s",)


@dataclass(frozen=True)
class DiscoverSpec:
    """One Service whose pods are backends."""

    source: str
    """k8s:SERVICE; also the pool's source name of its backends."""
    flavor: str = "openai"
    """vllm, llamacpp or openai, as for backends."""
    weight: float = 1.0
    """Capacity weight of each pod (`BackendSpec.weight`)."""
    models: tuple[str, ...] = ()
    """Models served; empty: learn them from each pod's /v1/models."""
    port_name: str | None = None
    """EndpointSlice port to route to; default the slice's first."""
    namespace: str | None = None
    """Default: the kubeconfig context's, or the pod's own, else `default`."""
    kubeconfig: Path | None = field(default=None, repr=False)
    """Default: in-cluster, else $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """kubeconfig context; default its current one."""

    def __post_init__(self) -> None:
        scheme, _, service = self.source.partition(":")
        if scheme not in SCHEMES or not service or "/" in service:
            raise ConfigError("source", self.source, "must be k8s:SERVICE")
        if self.flavor not in FLAVORS:
            raise ConfigError("flavor", self.flavor, f"must be one of {', '.join(FLAVORS)}")
        BackendSpec(url="http://discovered:1", flavor=self.flavor, weight=self.weight)  # the same checks

    @property
    def service(self) -> str:
        return self.source.partition(":")[2]

    def backend(self, url: str) -> BackendSpec:
        return BackendSpec(url=url, flavor=self.flavor, models=self.models, weight=self.weight)


def parse_discover_arg(text: str) -> DiscoverSpec:
    """`[FLAVOR=]k8s:SERVICE`, as given to --discover."""
    flavor, sep, source = text.partition("=")
    return DiscoverSpec(source=source, flavor=flavor) if sep else DiscoverSpec(source=text)


# key -> (type check, what it must be)
_KEYS: dict[str, tuple[Callable[[object], bool], str]] = {
    "source": (lambda v: isinstance(v, str), "a string, k8s:SERVICE"),
    "flavor": (lambda v: isinstance(v, str), f"one of {', '.join(FLAVORS)}"),
    "weight": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
               "a finite number"),
    "models": (lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v), "a list of model names"),
    "port_name": (lambda v: isinstance(v, str), "a string"),
    "namespace": (lambda v: isinstance(v, str), "a string"),
    "kubeconfig": (lambda v: isinstance(v, str), "a path"),
    "context": (lambda v: isinstance(v, str), "a string"),
}


def spec_from_mapping(item: object, where: str) -> DiscoverSpec:
    """One `discover:` entry: `k8s:SERVICE` text or a mapping of the keys above."""
    if isinstance(item, str):
        item = {"source": item}
    if not isinstance(item, dict) or "source" not in item:
        raise ConfigError(where, item, "must be k8s:SERVICE or a mapping with a source")
    for key, value in item.items():
        if key not in _KEYS:
            raise ConfigError(f"{where}.{key}", value, f"unknown key; known: {', '.join(_KEYS)}")
        check, what = _KEYS[key]
        if not check(value):
            raise ConfigError(f"{where}.{key}", value, f"must be {what}")
    kw = dict(item)
    kw["models"] = tuple(kw.get("models") or ())
    if "kubeconfig" in kw:
        kw["kubeconfig"] = Path(kw["kubeconfig"])
    try:
        return DiscoverSpec(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.reason) from None


def file_specs(path: Path) -> list[DiscoverSpec]:
    """The `discover:` entries of a fleet file (under `proxy:` or at the top level)."""
    data = load_yaml(read_config_file(path), str(path)) or {}
    if not isinstance(data, dict):
        return []
    section = data["proxy"] if isinstance(data.get("proxy"), dict) and "discover" in data["proxy"] else data
    where = "proxy.discover" if section is not data else "discover"
    items = section.get("discover") or []
    try:
        if not isinstance(items, list):
            raise ConfigError(where, items, "must be a list")
        return [spec_from_mapping(item, f"{where}[{i}]") for i, item in enumerate(items)]
    except ConfigError as exc:
        raise exc.located(str(path)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--discover", action="append", default=[], metavar="[FLAVOR=]k8s:SERVICE",
                        help="route to every pod of this Kubernetes Service, followed through its "
                             "EndpointSlices; repeat for more (cluster from --kubeconfig, else in-cluster)")


def specs_from_args(args: argparse.Namespace) -> list[DiscoverSpec]:
    """--discover flags and the --config file's `discover:` entries; --kubeconfig and
    --k8s-namespace fill what an entry leaves unset."""
    specs = [parse_discover_arg(text) for text in getattr(args, "discover", None) or ()]
    if getattr(args, "config", None) is not None:
        specs += file_specs(Path(args.config))
    defaults = {"kubeconfig": getattr(args, "kubeconfig", None), "namespace": getattr(args, "k8s_namespace", None)}
    return [replace(s, **{k: v for k, v in defaults.items() if v is not None and getattr(s, k) is None})
            for s in specs]


class ServiceDiscovery:
    """Keeps the pool's backends of one source equal to the live pods of one Service."""

    def __init__(self, spec: DiscoverSpec, pool: BackendPool, on_added: Callable[[Backend], Awaitable[None]],
                 api: AsyncClient | None = None) -> None:
        from proxy.kube import EndpointSliceFollower, client

        self.spec = spec
        self.pool = pool
        self.on_added = on_added
        namespace = spec.namespace
        if api is None:
            api, namespace = client(spec.kubeconfig, spec.context, spec.namespace)
        self.api = api
        self.follower: EndpointSliceFollower = EndpointSliceFollower(
            api, namespace or api.namespace, spec.service, spec.port_name)

    async def apply(self) -> None:
        """Bring the pool in line with the pods the follower knows."""
        from proxy.reload import apply_fleet

        specs = tuple(self.spec.backend(e.url) for e in self.follower.endpoints())
        for backend in apply_fleet(self.pool, specs, source=self.spec.source):
            await self.on_added(backend)

    async def run(self) -> None:
        await self.follower.run(self.apply)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not hide why the proxy stops
            await self.api.close()


def attach(app: web.Application, specs: list[DiscoverSpec]) -> list[ServiceDiscovery]:
    """Follow each spec's Service inside the proxy `app` (call before the app starts). The
    cluster configuration is read here, so a missing one fails before anything listens."""
    from proxy.app import PROXY_KEY

    proxy = app[PROXY_KEY]
    found = [ServiceDiscovery(spec, proxy.pool, proxy.probe_now) for spec in specs]
    tasks: list[asyncio.Task] = []

    async def on_startup(_app: web.Application) -> None:
        tasks.extend(asyncio.create_task(d.run()) for d in found)

    async def on_cleanup(_app: web.Application) -> None:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*(d.close() for d in found))

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return found
