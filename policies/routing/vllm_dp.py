"""`vllm-dp`: the score of vLLM's built-in data-parallel load balancer, applied across replicas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import register_policy
from policies.routing.signals import load_of
from policies.routing.validation import require_at_least, require_fraction, require_non_negative


@dataclass(frozen=True)
class VllmDPConfig:
    waiting_weight: float = 4.0
    """Weight of a waiting request against a running one (vLLM: `waiting * 4 + running`)."""
    kv_pressure_threshold: float = 0.5
    """KV-cache usage in [0, 1] above which waiting requests weigh more."""
    kv_pressure_factor: float = 2.0
    """Extra multiplier on the waiting term above the threshold; 1 gives vLLM's score exactly."""

    def __post_init__(self) -> None:
        require_non_negative("waiting_weight", self.waiting_weight)
        require_fraction("kv_pressure_threshold", self.kv_pressure_threshold)
        require_at_least("kv_pressure_factor", self.kv_pressure_factor, 1.0)


@register_policy("vllm-dp", config=VllmDPConfig)
class VllmDP(RoutingPolicy):
    """Pick the least score = w x waiting + running, with w raised under KV-cache pressure.

    What vLLM does: `DPLBAsyncMPClient.get_core_engine_for_request` in
    vllm/v1/engine/core_client.py scores each engine `waiting * 4 + running` from the counts
    its coordinator publishes (about every 100 ms), takes the lowest, and adds to the chosen
    engine's local waiting count until the next update.
    What this implements:
    - waiting = `num_requests_waiting`, into which the proxy folds the requests it sent since
      the last scrape (the same local reservation); running = `num_requests_running`; a
      backend never scraped scores its router in-flight count;
    - w = `waiting_weight` (4), times `kv_pressure_factor` (2) when `kv_cache_usage` exceeds
      `kv_pressure_threshold` (0.5). The KV term follows the seed lesson's description of the
      balancer ("increased for waiting requests when the KV cache is more than 50% full");
      vLLM's own code has no KV term, so `kv_pressure_factor=1` reproduces it exactly.
    - ties go to the lowest index; vLLM instead starts its scan at the client's index, which
      only matters with several API servers.
    Rules: `kv-pressure` when the chosen backend's waiting term was raised, else `dp-score`.
    """

    config: VllmDPConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        best = min(backends, key=lambda b: (self.score(b), b.index))
        rule = "kv-pressure" if self._under_pressure(best) else "dp-score"
        return Decision(best.index, rule)

    def score(self, backend: BackendView) -> float:
        weight = self.config.waiting_weight
        if self._under_pressure(backend):
            weight *= self.config.kv_pressure_factor
        if backend.num_requests_waiting is None and backend.num_requests_running is None:
            return float(backend.in_flight)
        waiting = backend.num_requests_waiting or 0.0
        return weight * waiting + (backend.num_requests_running or 0.0)

    def _under_pressure(self, backend: BackendView) -> bool:
        return load_of(backend, "kv_cache_usage") > self.config.kv_pressure_threshold
