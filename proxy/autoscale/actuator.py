"""What every actuator offers the autoscaler loop: start one replica, stop one, stop them all.

Actuators are the only part of the autoscaler that touches processes, containers or clusters.
The loop never assumes a replica is serving because an actuator started it: the proxy's health
probes decide that. A replica whose address is not known yet (a Kubernetes pod still being
scheduled) has `url` None until `replicas()` reports it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


class ActuatorError(RuntimeError):
    """The actuator could not do what it was asked (a process would not start, an API refused)."""


@dataclass(frozen=True)
class ReplicaHandle:
    """One engine replica an actuator started or found."""

    replica_id: str
    """Stable name of the replica: a local id, a container id or a pod name."""
    url: str | None
    """Base URL the proxy routes to (no /v1 suffix); None while the address is unknown."""
    pid: int | None = None
    """Process id (local actuator only); also the id of the replica's process group."""


class Actuator(abc.ABC):
    """Starts and stops engine replicas of one kind (`flavor`: vllm, llamacpp or openai)."""

    flavor: str = "openai"

    @abc.abstractmethod
    async def start_replica(self) -> ReplicaHandle:
        """Launch one more replica and return at once (it is loading, not serving)."""

    @abc.abstractmethod
    async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
        """Stop a replica the loop has already drained: a graceful stop, forced after `grace_s`."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop every replica this actuator started, leaving nothing behind."""

    async def replicas(self) -> list[ReplicaHandle] | None:
        """The replicas that exist now, for actuators that learn them from outside (Kubernetes);
        None where the actuator's own start/stop calls are the whole truth."""
        return None

    async def exited(self) -> list[str]:
        """Replicas that stopped on their own (crashed) since they were started."""
        return []


class ObserveNothing(Actuator):
    """The actuator of a recommend-only autoscaler without Kubernetes: it starts and stops
    nothing (the loop never asks it to), so the fleet the policy sees is the proxy's pool."""

    async def start_replica(self) -> ReplicaHandle:
        raise ActuatorError("recommend-only: this autoscaler starts no replica")

    async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
        raise ActuatorError("recommend-only: this autoscaler stops no replica")

    async def shutdown(self) -> None:
        return None
