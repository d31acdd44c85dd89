"""The fleet as the deployment generators see it: the one module that reads the fleet model.

`flotilla compose` and `flotilla k8s` describe the fleet `flotilla up` starts. They take its
engine command lines and its proxy fleet file from the code `flotilla up` runs
(`EngineGroup.command`, `fleetfile.without_address`, `supervisor.proxy_fleet_file`), with
two changes a container needs: the interpreter is the image's `python` rather than this one's,
and every engine listens on 0.0.0.0 at its flavor's usual port.

What is read of the fleet model, so a rename there is a change here only:
  UpFleet: engines, port, scaled_group(); EngineGroup: name, flavor, replicas, min_replicas,
  max_replicas, capacity_weight(), command(port=...); fleetfile.load_up_fleet,
  fleetfile.without_address; supervisor.proxy_fleet_file(fleet, backends).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.config import ConfigError

if TYPE_CHECKING:
    from proxy.fleetfile import UpFleet

CONTAINER_PYTHON = "python"
"""The interpreter on the image's PATH (python:3.11-slim, with Flotilla pip-installed)."""
ENGINE_PORTS = {"vllm": 8000, "llamacpp": 8080}
"""Each flavor listens where the real engine does by default: vllm serve 8000, llama-server 8080."""
RESERVED_NAMES = ("proxy", "prometheus", "grafana", "flotilla-proxy")
"""Names the generated files give the other parts of the fleet."""
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
"""An RFC 1035 label: a Kubernetes Service name and a Compose service name alike."""


@dataclass(frozen=True)
class Group:
    """One engine group as containers run it."""

    name: str
    """The group's name: the Compose service prefix, the Kubernetes Deployment and Service."""
    flavor: str
    """vllm or llamacpp."""
    replicas: int
    """Replicas `flotilla up` starts (for the scaled group, the autoscaler's floor)."""
    argv: tuple[str, ...]
    """The engine's command line in a container, without --host and --port."""
    port: int
    """Port the engine listens on inside its container."""
    weight: float
    """Capacity weight of one replica for routing."""
    scaled: bool
    """True for the group the proxy's autoscaler owns."""
    min_replicas: int
    max_replicas: int

    def command(self) -> list[str]:
        """The full command line of one replica's container."""
        return [*self.argv, "--host", "0.0.0.0", "--port", str(self.port)]


@dataclass(frozen=True)
class Fleet:
    """A fleet file, read for deployment."""

    groups: tuple[Group, ...]
    port: int
    """Port the proxy serves on."""
    source: str
    """The fleet file the fleet came from, as given; empty for the default fleet (for the
    generated files' header: the command that makes them again)."""
    _up: UpFleet

    def made_by(self, command: str) -> str:
        """How the generated files name the command that makes them, e.g. `flotilla k8s fleet.yaml`."""
        if not self.source:
            return f"`flotilla {command}` from the default fleet (proxy/fleet.default.yaml)"
        return f"`flotilla {command} {self.source}`"

    @property
    def scaled(self) -> Group | None:
        return next((g for g in self.groups if g.scaled), None)

    def proxy_file(self, backends: list[tuple[Group, str]]) -> dict[str, object]:
        """The proxy's fleet file as `flotilla up` writes it, for these (group, url) backends; its
        `autoscaler:` section (if any) runs the scaled group's container command."""
        from proxy.supervisor import proxy_fleet_file

        data = proxy_fleet_file(self._up, [(g.flavor, url, g.name) for g, url in backends])
        autoscaler = data.get("autoscaler")
        if isinstance(autoscaler, dict) and self.scaled is not None:
            autoscaler["engine_cmd"] = list(self.scaled.argv)
        return data


def in_container(argv: list[str]) -> tuple[str, ...]:
    """An engine command line of this machine as the image runs it."""
    return (CONTAINER_PYTHON, *argv[1:]) if argv and argv[0] == sys.executable else tuple(argv)


def _group(up: UpFleet, index: int) -> Group:
    from proxy.fleetfile import without_address

    g = up.engines[index]
    if not _DNS_LABEL.fullmatch(g.name) or g.name in RESERVED_NAMES:
        raise ConfigError(f"engines[{index}].name", g.name, "must be a DNS label (a-z, 0-9, -, starting with a "
                          f"letter) other than {', '.join(RESERVED_NAMES)}, to name containers and Services")
    scaled = g is up.scaled_group()
    return Group(name=g.name, flavor=g.flavor, replicas=g.min_replicas if scaled else g.replicas,
                 argv=in_container(without_address(g.command(port=0))), port=ENGINE_PORTS[g.flavor],
                 weight=g.capacity_weight(), scaled=scaled, min_replicas=g.min_replicas,
                 max_replicas=g.max_replicas)


def from_up_fleet(up: UpFleet, source: str) -> Fleet:
    groups = tuple(_group(up, i) for i in range(len(up.engines)))
    return Fleet(groups=groups, port=up.port, source=source, _up=up)


def load(path: Path | None = None) -> Fleet:
    """A fleet file (default: the packaged default fleet of `flotilla up`), validated as
    `flotilla up` validates it."""
    from proxy.fleetfile import load_up_fleet

    up = load_up_fleet(path)
    try:
        return from_up_fleet(up, "" if path is None or _is_default(path) else str(path))
    except ConfigError as exc:
        raise (exc.located(str(path)) if path is not None else exc) from None


def _is_default(path: Path) -> bool:
    """The packaged default fleet file, however it is named: the generated files then say so
    the same way."""
    import importlib.resources

    from proxy.fleetfile import DEFAULT_FLEET

    default = Path(str(importlib.resources.files("proxy") / DEFAULT_FLEET))
    return Path(path).resolve() == default.resolve()
