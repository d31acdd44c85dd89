"""The grid: workloads x routing policies, each cell one simulated run (`sim.run.simulate`) through
the same fleet, summed up as a `Cell`.

Every policy the registry lists runs, so a policy added later appears without touching this file;
the peers' algorithms are told from Flotilla's own by `is_peer`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.results import RunResult, Slo
from loadgen.trace import TraceRequest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "data" / "traces"

PEER_POLICIES = ("sglang-cache-aware", "llm-d", "dynamo-kv", "aibrix-prefix")
"""The peers' algorithms issue 18 names; a registered policy whose class sets `peer = True` or
names its `source` counts too."""

SLO = Slo(ttft_s=2.0, tpot_s=0.1)
"""Goodput SLO, seconds of H100 time: first token within 2 s (a 12k-token Mooncake prompt
prefills in about 1 s on an idle H100, so this allows one such queue ahead), then at most 100 ms
per output token (a reader's pace)."""


@dataclass(frozen=True)
class Workload:
    """One workload of the grid."""

    name: str
    source: str
    """A trace file under tests/data/traces, or a `loadgen` synthetic spec (`agents:...`)."""
    note: str = ""
    """What the window is, for the page."""

    def requests(self, max_requests: int | None = None) -> Iterator[TraceRequest]:
        """The workload's requests in arrival order, the first `max_requests` when given."""
        if ":" in self.source and not self.source.endswith((".jsonl", ".csv")):
            from loadgen.synthetic import synthetic_requests
            reqs: Iterator[TraceRequest] = synthetic_requests(self.source, seed=0)
        else:
            from loadgen.readers import read_trace
            reqs = read_trace(TRACES / self.source)
        return itertools.islice(reqs, max_requests) if max_requests else reqs

    def count(self, max_requests: int | None = None) -> int:
        return sum(1 for _ in self.requests(max_requests))


AGENTS = "agents:sessions=60,turns=16,system=2000,output=200,think=30,stagger=0.2"
"""60 sessions, not a multiple of the 8 replicas: with 64, round-robin would send every turn of a
session to one replica (turn t of session s is request 64t + s) and look like session affinity."""

WORKLOADS = (
    Workload("mooncake-conversation", "mooncake_conversation_trace.first30min.jsonl",
             "Mooncake conversation trace, first 30 min (5,719 requests)"),
    Workload("mooncake-synthetic", "mooncake_synthetic_trace.first510s.jsonl",
             "Mooncake synthetic trace, first 510 s (1,920 requests): all the slice holds, not 30 min"),
    Workload("azure-code", "AzureLLMInferenceTrace_code.before1845.csv",
             "Azure LLM inference 2023, code, 27 min (5,100 requests)"),
    Workload("azure-conversation", "AzureLLMInferenceTrace_conv.before1845.csv",
             "Azure LLM inference 2023, conversation, 29 min (9,754 requests)"),
    Workload("agents", AGENTS,
             "60 agent sessions x 16 turns over a shared 2,000-token system prompt (960 requests, 7.7 min)"),
)


def workload(name: str) -> Workload:
    for w in WORKLOADS:
        if w.name == name:
            return w
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(w.name for w in WORKLOADS)}")


def is_peer(spec: str) -> bool:
    """Whether the policy of `spec` (`NAME[:key=value,...]`) is a peer's algorithm rather than
    Flotilla's own; an unknown name raises UnknownPolicyError (a ValueError)."""
    from policies.routing.registry import policy_spec

    name = spec.split(":", 1)[0]
    cls = policy_spec(name).cls
    return name in PEER_POLICIES or bool(getattr(cls, "peer", False) or getattr(cls, "source", None))


def policies() -> list[str]:
    """Every registered routing policy: Flotilla's first, then the peers', each alphabetical."""
    from policies.routing.registry import available_policies

    names = available_policies()
    return [n for n in names if not is_peer(n)] + [n for n in names if is_peer(n)]


@dataclass(frozen=True)
class FleetConfig:
    """The simulated fleet every cell runs on."""

    replicas: int = 8
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    scrape_interval_s: float | None = 0.25
    """Policies see engine metrics as fresh as the proxy's default scrape (0.25 s)."""
    kv_events_delay_s: float | None = None
    """Engine KV events reach a policy's index this long after the step (None: the simulator's default)."""
    slo: Slo = SLO
    max_requests: int | None = None
    """Cut every workload to its first N requests (the quick mode)."""

    def key(self) -> dict[str, Any]:
        """What a stored cell must match to be reused."""
        return {**dataclasses.asdict(self), "slo": dataclasses.asdict(self.slo)}


@dataclass
class Cell:
    """One workload through one policy: the JSON row of the results."""

    workload: str
    policy: str
    family: str
    """`flotilla` or `peer`."""
    requests: int = 0
    ok: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    e2e_p90_s: float | None = None
    goodput_per_s: float | None = None
    """Requests per second (of the run's duration) meeting the SLO."""
    slo_attained: float | None = None
    """Share of requests meeting the SLO."""
    hit_rate: float | None = None
    """Prompt tokens served from the engines' prefix caches over all prompt tokens."""
    prefill_max_over_mean: float | None = None
    """Most prefill tokens any replica computed over the mean: 1.0 is an even spread."""
    prefill_tokens_per_replica: list[int] = field(default_factory=list)
    decisions_by_rule: dict[str, int] = field(default_factory=dict)
    """How many requests each of the policy's rules decided (`meta.decisions_by_rule`)."""
    virtual_s: float | None = None
    wall_s: float | None = None
    error: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


def cell_of(result: RunResult, wl: str, policy: str, family: str, cfg: FleetConfig, wall_s: float) -> Cell:
    """The figures of one run."""
    s, m = result.summary, result.meta
    prefill = list(m["prefill_tokens_per_replica"])
    mean = sum(prefill) / len(prefill) if prefill else 0.0
    met = s.goodput_per_s * s.duration_s if s.goodput_per_s is not None else None
    return Cell(workload=wl, policy=policy, family=family, requests=s.num_requests, ok=s.num_ok,
                ttft_p50_s=s.ttft_s.p50, ttft_p99_s=s.ttft_s.p99, e2e_p90_s=s.e2e_s.p90,
                goodput_per_s=s.goodput_per_s,
                slo_attained=(met / s.num_requests if met is not None and s.num_requests else None),
                hit_rate=m["hit_rate"], prefill_max_over_mean=(max(prefill) / mean if mean else None),
                prefill_tokens_per_replica=prefill, decisions_by_rule=dict(m["decisions_by_rule"]),
                virtual_s=m["virtual_duration_s"], wall_s=wall_s,
                config=cfg.key())


def _counted(reqs: Iterable[TraceRequest], tick: Callable[[int], None] | None) -> Iterator[TraceRequest]:
    # arrivals are pulled as virtual time reaches them, so counting them follows the simulation
    for n, req in enumerate(reqs, 1):
        if tick is not None and n % 50 == 0:
            tick(50)
        yield req


def run_cell(wl: Workload, policy: str, cfg: FleetConfig, tick: Callable[[int], None] | None = None) -> Cell:
    """Simulate `wl` through `policy` on the fleet of `cfg`; a failing policy gives a cell with its error."""
    from sim.build import EngineSpec
    from sim.run import simulate

    family = "peer" if is_peer(policy) else "flotilla"
    spec = EngineSpec(kind="vllm", model=cfg.model, gpu=cfg.gpu)
    started = time.perf_counter()
    options: dict[str, Any] = {}
    if cfg.kv_events_delay_s is not None:
        options["kv_events_delay_s"] = cfg.kv_events_delay_s
    try:
        result = simulate(lambda: _counted(wl.requests(cfg.max_requests), tick), spec, cfg.replicas, policy,
                          scrape_interval_s=cfg.scrape_interval_s, slo=cfg.slo, **options)
    except Exception as exc:  # noqa: BLE001 (one policy's failure is a row of the table, not the end of the grid)
        return Cell(wl.name, policy, family, error=f"{type(exc).__name__}: {exc}"[:300], config=cfg.key(),
                    wall_s=time.perf_counter() - started)
    return cell_of(result, wl.name, policy, family, cfg, time.perf_counter() - started)


def ideal_hit_rate(wl: Workload, max_requests: int | None = None) -> float | None:
    """Prompt reuse with one unbounded cache, at the trace's block granularity: each request's
    longest run of leading `hash_ids` blocks seen before, over all prompt tokens. None for
    workloads without hash ids (the Azure traces)."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node: a trie of prefixes
    reused = total = 0
    any_ids = False
    for req in wl.requests(max_requests):
        total += req.input_length
        if not req.hash_ids:
            continue
        any_ids = True
        hit, node, matching = 0, -1, True
        for block in req.hash_ids:
            key = (node, block)
            if key in nodes and matching:
                hit += 1
            else:
                matching = False
                nodes[key] = len(nodes)
            node = nodes[key]
        reused += min(hit * req.block_tokens, req.input_length)
    return reused / total if any_ids and total else None
