"""The result schema of a run: per-request records and a summary, written as one JSON file.

`loadgen` writes it after replaying against a live target and `sim` emits the same schema
from virtual time, so the two can be compared with `flotilla loadgen compare`.
Latency definitions follow vLLM's serving benchmark (benchmarks/benchmark_serving.py):
TTFT is send to first token, ITL the gaps between successive streamed tokens,
TPOT = (e2e - ttft) / (completion_tokens - 1), and goodput the rate of requests meeting
every SLO.
"""

from __future__ import annotations

import dataclasses
import json
from array import array
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


def _json_dict(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: value.tolist() if isinstance(value, array) else value for key, value in items}


@dataclass
class RequestRecord:
    """What one request felt like, as measured by the client."""

    index: int
    """Position of the request in the workload (0-based)."""
    session_id: str | None = None
    """Session the request belongs to; None when the trace has none."""
    backend: str | None = None
    """Replica that served it (the router's x-flotilla-backend header); None when not told."""
    scheduled_time_s: float = 0.0
    """When the workload asked for it to leave, seconds from the run start."""
    send_time_s: float = 0.0
    """When it actually left, seconds from the run start."""
    ttft_s: float | None = None
    """Time to first token: send to the first streamed token, seconds."""
    itl_s: MutableSequence[float] = field(default_factory=list)
    """Inter-token latencies: each gap between successive streamed tokens, seconds (a list, or
    an `array('d')` where millions are kept, as the simulator keeps them; JSON has a list)."""
    tpot_s: float | None = None
    """Time per output token after the first: (e2e - ttft) / (completion_tokens - 1), seconds."""
    e2e_s: float | None = None
    """End-to-end latency: send to the last byte of the response, seconds."""
    prompt_tokens: int = 0
    """Prompt tokens from the response's usage."""
    completion_tokens: int = 0
    """Generated tokens from the response's usage."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens)."""
    ok: bool = False
    """True when the request completed with a 200 and a full stream."""
    error: str | None = None
    """Failure cause (HTTP status and message, timeout, connection error); None when ok."""

    @property
    def lateness_s(self) -> float:
        """How late the request left against its schedule, seconds."""
        return self.send_time_s - self.scheduled_time_s


@dataclass(frozen=True)
class LatencyStats:
    """Distribution of one latency, seconds; None when no sample exists."""

    mean: float | None = None
    """Arithmetic mean."""
    p50: float | None = None
    """Median."""
    p90: float | None = None
    """90th percentile."""
    p99: float | None = None
    """99th percentile."""
    std: float | None = None
    """Population standard deviation (numpy's default, as vLLM's `std_*_ms`)."""
    min: float | None = None
    """Smallest sample."""
    max: float | None = None
    """Largest sample."""
    percentiles: dict[str, float] = field(default_factory=dict)
    """The percentiles chosen with `--percentiles`, keyed as vLLM keys them: `p50`, `p99.9`."""


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput; a None bound is not checked."""

    ttft_s: float | None = None
    """Largest acceptable time to first token, seconds."""
    tpot_s: float | None = None
    """Largest acceptable time per output token, seconds."""
    e2e_s: float | None = None
    """Largest acceptable end-to-end latency, seconds."""


@dataclass
class Summary:
    """Aggregate figures of a run."""

    num_requests: int = 0
    """Requests sent."""
    num_ok: int = 0
    """Requests completed successfully."""
    num_failed: int = 0
    """Requests that failed (see each record's error)."""
    duration_s: float = 0.0
    """From the first send to the last completion, seconds."""
    ttft_s: LatencyStats = field(default_factory=LatencyStats)
    """Time to first token over successful requests."""
    tpot_s: LatencyStats = field(default_factory=LatencyStats)
    """Time per output token over successful requests with more than one token."""
    itl_s: LatencyStats = field(default_factory=LatencyStats)
    """Inter-token latency over every gap of every successful request."""
    e2e_s: LatencyStats = field(default_factory=LatencyStats)
    """End-to-end latency over successful requests."""
    total_prompt_tokens: int = 0
    """Sum of usage.prompt_tokens."""
    total_completion_tokens: int = 0
    """Sum of usage.completion_tokens."""
    total_cached_tokens: int = 0
    """Sum of cached prompt tokens."""
    request_throughput_per_s: float = 0.0
    """Successful requests per second of duration."""
    output_throughput_tok_per_s: float = 0.0
    """Completion tokens per second of duration."""
    total_throughput_tok_per_s: float = 0.0
    """Prompt plus completion tokens per second of duration."""
    slo: Slo | None = None
    """The SLOs goodput was measured under; None when none were given."""
    goodput_per_s: float | None = None
    """Successful requests meeting every SLO, per second of duration; None without SLOs."""
    slo_attainment: float | None = None
    """Share of sent requests that met every SLO bound, 0..1 (a failed request counts as missed);
    None without SLOs."""
    prefix_hit_rate: float = 0.0
    """Cached over prompt tokens, 0..1."""
    requests_per_backend: dict[str, int] = field(default_factory=dict)
    """Backend name -> requests it served ("unknown" when not told)."""
    max_lateness_s: float = 0.0
    """Largest send delay against the schedule, seconds: how open the loop stayed."""


@dataclass
class RunResult:
    """One run: its configuration, every request and the summary."""

    summary: Summary
    """Aggregate figures."""
    requests: list[RequestRecord]
    """Per-request records, in workload order."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form run description: target, trace, speedup, seed, label."""
    replicas: list[tuple[float, int]] = field(default_factory=list)
    """(seconds from run start, replica count) samples, when the router reported them."""
    schema_version: int = SCHEMA_VERSION
    """Version of this schema."""

    @property
    def label(self) -> str:
        """Short name for tables and plot legends."""
        return str(self.meta.get("label") or self.meta.get("trace") or "run")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole result."""
        return dataclasses.asdict(self, dict_factory=_json_dict)

    def save(self, path: str | Path) -> None:
        """Write the result as indented JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild a result from `to_json()` output."""
        summary = dict(data["summary"])
        for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            summary[name] = LatencyStats(**summary[name])
        summary["slo"] = Slo(**summary["slo"]) if summary.get("slo") else None
        return cls(
            summary=Summary(**summary),
            requests=[RequestRecord(**r) for r in data["requests"]],
            meta=dict(data.get("meta", {})),
            replicas=[(float(t), int(n)) for t, n in data.get("replicas", [])],
            schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
        )

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        """Read a result written by `save`."""
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
