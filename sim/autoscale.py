"""Autoscaling under virtual time: the real scaling policy decides, replicas start cold.

Every `policy.interval_s` the fleet's signals (arrival rate over the interval, waiting and
running requests summed over ready replicas plus requests held for lack of one, mean KV usage)
and its replicas go to `policy.decide`; new replicas become ready `cold_start_s` after launch,
drained ones stop once their last request finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadgen.cost import ScaleEvent
from policies.scaling import FleetState, ReplicaInfo, ReplicaState, ScalingPolicy, ScalingSignals
from sim.replicas import ReplicaMetrics


@dataclass
class ReplicaLife:
    """When a simulated replica launched, became ready and stopped."""

    state: ReplicaState
    started_at_s: float
    ready_at_s: float | None = None
    stopped_at_s: float | None = None

    @property
    def live(self) -> bool:
        return self.stopped_at_s is None


@dataclass
class SimAutoscaler:
    """The scaling side of a simulated fleet: history in, launch and drain orders out."""

    policy: ScalingPolicy
    cold_start_s: float
    """Launch to ready, virtual seconds."""
    first_index: int = 0
    """Replicas below this index belong to groups it does not scale: it neither counts nor drains
    them (their load still shows in the signals, as in the proxy's pool)."""
    history: list[ScalingSignals] = field(default_factory=list)
    arrivals_since_last: int = 0
    capacity_rps: Callable[[int, int], float] | None = None
    """Requests per second one scaled replica completes at (prompt, output) tokens; None: unknown."""
    tokens_since_last: tuple[int, int] = (0, 0)
    """Prompt and output tokens of the requests that arrived since the last decision."""
    last_decision_s: float = 0.0
    last_scaled_at_s: float | None = None
    decisions: dict[str, int] = field(default_factory=dict)
    """reason -> count."""
    scale_events: list[ScaleEvent] = field(default_factory=list)
    """Every decision that launched or drained replicas."""

    def sample(self, now_s: float, metrics: Sequence[ReplicaMetrics], held: int) -> ScalingSignals:
        elapsed = now_s - self.last_decision_s
        rate = self.arrivals_since_last / elapsed if elapsed > 0 else 0.0
        kv = [m.kv_cache_usage for m in metrics]
        return ScalingSignals(
            at_s=now_s, arrival_rate_rps=rate, replica_capacity_rps=self._capacity(),
            num_requests_waiting=float(sum(m.num_requests_waiting for m in metrics) + held),
            num_requests_running=float(sum(m.num_requests_running for m in metrics)),
            kv_cache_usage=sum(kv) / len(kv) if kv else None)

    def arrived(self, prompt_tokens: int, output_tokens: int) -> None:
        """Count one arrival and its lengths towards the next sample."""
        self.arrivals_since_last += 1
        prompt, output = self.tokens_since_last
        self.tokens_since_last = (prompt + prompt_tokens, output + output_tokens)

    def _capacity(self) -> float | None:
        if self.capacity_rps is None or not self.arrivals_since_last:
            return None
        prompt, output = self.tokens_since_last
        return self.capacity_rps(round(prompt / self.arrivals_since_last), round(output / self.arrivals_since_last))

    def decide(self, now_s: float, lives: Sequence[ReplicaLife], in_flight: Sequence[int],
               metrics: Sequence[ReplicaMetrics], held: int) -> tuple[int, tuple[int, ...]]:
        """(replicas to launch, replica indexes to drain) at `now_s`."""
        self.history.append(self.sample(now_s, metrics, held))
        self.arrivals_since_last, self.last_decision_s, self.tokens_since_last = 0, now_s, (0, 0)
        replicas = tuple(
            ReplicaInfo(replica_id=str(i), state=life.state, started_at_s=life.started_at_s,
                        ready_at_s=life.ready_at_s, in_flight=in_flight[i])
            for i, life in enumerate(lives)
            if i >= self.first_index and life.live and life.state is not ReplicaState.DRAINING)
        ready = [r for r in replicas if r.ready_at_s is not None]
        fleet = FleetState(now_s=now_s, replicas=replicas, last_scaled_at_s=self.last_scaled_at_s,
                           cold_start_s=self.cold_start_s if ready else None)
        decision = self.policy.decide(self.history, fleet)
        self.decisions[decision.reason_label] = self.decisions.get(decision.reason_label, 0) + 1
        launch = max(0, decision.desired - fleet.current)
        if launch or decision.drain:
            self.last_scaled_at_s = now_s
            after = fleet.current + launch - len(decision.drain)
            self.scale_events.append(ScaleEvent(now_s, "up" if launch else "down", fleet.current, after,
                                                decision.reason_label, decision.detail))
        return launch, tuple(int(r) for r in decision.drain)
