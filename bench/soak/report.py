"""What a soak run found (pure): each request's outcome, process samples over time, and whether
memory, file descriptors or tasks grew past their bounds."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

NO_ANSWER = "no_answer"
"""The client gave up waiting."""
CONNECTION_ERROR = "connection_error"
"""The proxy's connection failed before an answer."""
UNANSWERED = (NO_ANSWER, CONNECTION_ERROR)
"""Outcomes that are not a terminal answer."""


def classify(status: int | None, body: bytes, stream: bool) -> str:
    """One request's outcome: ok, error_event (a stream ended by the proxy's error event),
    status_<code>, truncated (a body that ended without [DONE]) or no_answer."""
    if status is None:
        return NO_ANSWER
    if status != 200:
        return f"status_{status}"
    if not stream:
        return "ok"
    tail = body.rstrip()[-2048:]
    if not tail.endswith(b"data: [DONE]"):
        return "truncated"
    return "error_event" if b'"error"' in tail else "ok"


@dataclass(frozen=True)
class Sample:
    """The proxy process at one moment."""

    t_s: float
    """Seconds since the run started."""
    rss_bytes: int
    """Resident memory."""
    open_fds: int
    """Open file descriptors."""
    asyncio_tasks: int
    """Live asyncio tasks."""


@dataclass(frozen=True)
class Bounds:
    """How much each figure may grow from the warm-up quarter to the last quarter of the run."""

    rss_bytes: int = 64 * 2**20
    """Resident memory growth."""
    open_fds: int = 32
    """File descriptor growth."""
    asyncio_tasks: int = 64
    """Task count growth."""


FIGURES = ("rss_bytes", "open_fds", "asyncio_tasks")


def growth(samples: list[Sample]) -> dict[str, int]:
    """Peak of the last quarter of samples minus peak of the first quarter (after warm-up),
    per figure: a leak shows as steady growth, a busy moment as a peak in both."""
    if len(samples) < 4:
        raise ValueError("need at least 4 samples to compare the first and last quarter")
    q = len(samples) // 4
    first, last = samples[:q], samples[-q:]
    return {f: max(getattr(s, f) for s in last) - max(getattr(s, f) for s in first) for f in FIGURES}


def over_bounds(samples: list[Sample], bounds: Bounds) -> dict[str, int]:
    """Figures whose growth passed its bound, with the growth."""
    return {f: g for f, g in growth(samples).items() if g > getattr(bounds, f)}


@dataclass
class SoakReport:
    """Counts of a whole run."""

    sent: int = 0
    outcomes: Counter = field(default_factory=Counter)
    """Outcome -> requests (see `classify`)."""
    samples: list[Sample] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return self.outcomes["ok"]

    @property
    def failed(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.outcomes.items()) if k != "ok"}

    @property
    def unanswered(self) -> int:
        return sum(self.outcomes[k] for k in UNANSWERED) + self.sent - sum(self.outcomes.values())

    def text(self, bounds: Bounds) -> str:
        lines = [f"sent {self.sent}  completed {self.completed}  unanswered {self.unanswered}",
                 "failed by cause: " + (", ".join(f"{k} {v}" for k, v in self.failed.items()) or "none"),
                 f"{'t_s':>7} {'rss_MiB':>8} {'fds':>5} {'tasks':>6}"]
        lines += [f"{s.t_s:7.1f} {s.rss_bytes / 2**20:8.1f} {s.open_fds:5d} {s.asyncio_tasks:6d}" for s in self.samples]
        if len(self.samples) >= 4:
            lines.append("growth (last quarter peak - first quarter peak): " +
                         ", ".join(f"{k} {v}" for k, v in growth(self.samples).items()))
            lines.append(f"over bounds: {over_bounds(self.samples, bounds) or 'none'}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"sent": self.sent, "completed": self.completed, "failed": self.failed,
                           "unanswered": self.unanswered, "samples": [asdict(s) for s in self.samples]}, indent=1)
