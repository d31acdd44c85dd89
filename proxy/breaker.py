"""Per-backend circuit breaker and the reading of health probes (pure: callers pass `now_s`).

Closed: requests flow, consecutive failures are counted. After `failure_threshold` of them the
circuit opens and the backend is ejected. After `open_s` it is half-open: one probe at a time
(an active health probe or one real request) may go; `success_threshold` consecutive successes
close it, any failure opens it again for another `open_s`.

Only the backend's own faults count as failures (see `outcome_of_status`): what a client caused
(a 4xx answer, a client that went away or stopped reading) is neutral, neither a failure nor a
success, so no client can eject a healthy backend or keep a broken one in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.config import BreakerConfig


class CircuitState(enum.Enum):
    CLOSED = "closed"  # healthy: every request may go
    OPEN = "open"  # ejected: nothing goes until open_s has passed
    HALF_OPEN = "half_open"  # on trial: one probe at a time


class Outcome(enum.Enum):
    """What one request or probe says about its backend's health."""

    SUCCESS = "success"  # the backend answered
    FAILURE = "failure"  # the backend's fault: counts toward ejection
    NEUTRAL = "neutral"  # the client's doing (4xx, gone, stalled): counts neither way


# Python 3.11's EnumType has a __getattr__, which makes every read of `Outcome.SUCCESS` a slow
# lookup (about 75 ns, against 9 for a module name): each request reads these.
SUCCESS, FAILURE, NEUTRAL = Outcome.SUCCESS, Outcome.FAILURE, Outcome.NEUTRAL
_HALF_OPEN = CircuitState.HALF_OPEN


def outcome_of_status(status: int) -> Outcome:
    """A backend's answer judged for its circuit. A 4xx (429 included) is about the request;
    a 5xx is the backend's, since the proxy validates what it forwards and forwards the body
    decoded, so a well-formed request is all a backend gets."""
    if status >= 500:
        return FAILURE
    return NEUTRAL if status >= 400 else SUCCESS


class CircuitBreaker:
    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.state = CircuitState.CLOSED
        self.failures = 0
        """Consecutive failures while closed."""
        self.successes = 0
        """Consecutive successes while half-open."""
        self.opened_at_s: float | None = None
        self.probe_in_flight = False

    def allows_request(self, now_s: float) -> bool:
        """Whether a request may be sent now (moves open -> half-open when the wait is over)."""
        if self.state is CircuitState.OPEN and self.opened_at_s is not None:
            if now_s - self.opened_at_s >= self.config.open_s:
                self.state = CircuitState.HALF_OPEN
                self.successes = 0
        if self.state is CircuitState.HALF_OPEN:
            return not self.probe_in_flight
        return self.state is CircuitState.CLOSED

    def start_probe(self) -> None:
        if self.state is CircuitState.HALF_OPEN:
            self.probe_in_flight = True

    def record_success(self) -> bool:
        """Count a success; True when this closed the circuit."""
        self.probe_in_flight = False
        if self.state is _HALF_OPEN:
            self.successes += 1
            if self.successes >= self.config.success_threshold:
                self.state = CircuitState.CLOSED
                self.failures = 0
                return True
            return False
        self.failures = 0
        return False

    def record_neutral(self) -> None:
        """A request that says nothing about the backend ended: only a half-open probe slot is freed."""
        self.probe_in_flight = False

    def record_failure(self, now_s: float) -> bool:
        """Count a failure; True when this opened the circuit."""
        self.probe_in_flight = False
        if self.state is CircuitState.HALF_OPEN:
            self._open(now_s)
            return True
        if self.state is CircuitState.OPEN:
            return False
        self.failures += 1
        if self.failures >= self.config.failure_threshold:
            self._open(now_s)
            return True
        return False

    def _open(self, now_s: float) -> None:
        self.state = CircuitState.OPEN
        self.opened_at_s = now_s
        self.successes = 0


class ProbeOutcome(enum.Enum):
    HEALTHY = "healthy"  # answered 200: ready
    LOADING = "loading"  # still starting: not a failure
    FAILED = "failed"  # counts against the breaker
    INCONCLUSIVE = "inconclusive"  # the proxy itself stalled past the timeout: says nothing


@dataclass(frozen=True)
class ProbeResult:
    """What one /health probe saw."""

    status: int | None
    """HTTP status, or None when no response came back."""
    body: bytes = b""
    connection_refused: bool = False
    """The TCP connect was refused (vLLM while loading; any engine that is down)."""
    stalled: bool = False
    """The timeout fired well after it was due: the proxy's own event loop was stalled (a GC pause,
    a starved CPU), so the silence may be the proxy's, not the backend's."""


def classify_probe(result: ProbeResult, ever_ready: bool) -> ProbeOutcome:
    """Tell startup from failure.

    vLLM refuses connections for the whole model load, so a refusal before the backend was ever
    ready means loading; after that it means the engine went away. llama-server listens at once
    and answers 503 `Loading model` while loading, at any point in its life.
    """
    if result.status == 200:
        return ProbeOutcome.HEALTHY
    if result.stalled:
        return ProbeOutcome.INCONCLUSIVE
    if result.status == 503 and b"Loading model" in result.body:
        return ProbeOutcome.LOADING
    if result.connection_refused and not ever_ready:
        return ProbeOutcome.LOADING
    return ProbeOutcome.FAILED
