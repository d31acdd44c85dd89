"""Routing quality: the same trace slices replayed by `flotilla loadgen` through each router to a
fresh fleet of 4 look-alike vLLM engines (Llama 3.1 8B on H100, time-scaled), with each engine's
prefix-cache counters scraped before and after the run."""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from bench.peers.launch import REPO, RouterSpec, launch
from bench.peers.noise import GuardConfig, guarded
from bench.peers.procs import Proc, free_port, spawn, tree_cpu_s, wait_http

MODEL = "llama-3.1-8b"
ROUTERS = (RouterSpec("flotilla round-robin", "flotilla", "round-robin"),
           RouterSpec("flotilla least-outstanding", "flotilla", "least-outstanding"),
           RouterSpec("flotilla prefix-aware", "flotilla", "prefix-aware"),
           RouterSpec("flotilla session-affinity", "flotilla", "session-affinity"),
           RouterSpec("flotilla weighted", "flotilla", "weighted"),
           RouterSpec("sglang-router cache_aware", "sglang", "cache_aware"),
           RouterSpec("vllm-router cache_aware", "vllm-router", "cache_aware"),
           RouterSpec("litellm least-busy", "litellm", "least-busy"))


@dataclass(frozen=True)
class Workload:
    """One trace slice, as loadgen arguments."""

    name: str
    args: tuple[str, ...]
    """Workload arguments of `flotilla loadgen` (--trace/--synthetic and its cut)."""


WORKLOADS = (
    Workload("mooncake", ("--trace", "tests/data/traces/mooncake_conversation.first60s.jsonl", "--duration", "10")),
    Workload("agents", ("--synthetic", "agents:sessions=16,turns=6,system=2000,output=64,think=8,stagger=0.5",
                        "--seed", "0")),
    Workload("azure-conv", ("--trace", "tests/data/traces/AzureLLMInferenceTrace_conv.before1845.csv",
                            "--duration", "10")),
)


@dataclass(frozen=True)
class FleetConfig:
    """The look-alike fleet and how fast it runs."""

    engines: int = 4
    gpu: str = "h100"
    time_scale: float = 0.2
    """Engines run 1/time_scale times faster than an H100; the loadgen's speedup is 1/time_scale so
    the offered load per engine matches the trace's."""
    max_model_len: int = 131072
    slo_ttft_s: float = 0.2
    """Goodput SLO on TTFT, in measured (time-scaled) seconds: 1 s of H100 time at time_scale 0.2."""
    slo_tpot_s: float = 0.01
    """Goodput SLO on time per output token, measured seconds (50 ms of H100 time at 0.2)."""

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines={self.engines}: must be >= 1")
        if not 0 < self.time_scale <= 1:
            raise ValueError(f"time_scale={self.time_scale}: must be in (0, 1]")


@dataclass
class QualityRecord:
    """One workload through one router in one round (the JSON rows)."""

    router: str
    workload: str
    round: int
    ok: int
    sent: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    goodput_per_s: float | None
    """Requests per second meeting both SLOs."""
    throughput_per_s: float
    engine_hit_rate: float
    """Prefix-cache hits over queries, in tokens, summed over the engines' counters."""
    per_engine: list[int] = field(default_factory=list)
    """Prefix-cache queries (tokens) each engine saw: how the router spread the work."""
    router_cpu_s: float = 0.0
    other_cores: float = 0.0
    attempts: int = 1
    noisy: bool = False
    result_path: str = ""


def prefix_counters(metrics_text: str) -> tuple[float, float]:
    """(hits, queries) in tokens from an engine's /metrics text, summed over label sets."""
    hits = queries = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "vllm:prefix_cache_hits_total":
                hits += s.value
            elif s.name == "vllm:prefix_cache_queries_total":
                queries += s.value
    return hits, queries


def hit_rate(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> tuple[float, list[int]]:
    """Fleet hit rate over a run from per-engine counters, and each engine's queried tokens."""
    dq = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
    dh = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    return (dh / sum(dq) if sum(dq) > 0 else 0.0), [int(q) for q in dq]


def _scrape(urls: list[str]) -> list[tuple[float, float]]:
    out = []
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            out.append(prefix_counters(r.read().decode()))
    return out


def start_fleet(cfg: FleetConfig, workdir: Path) -> tuple[list[Proc], list[str]]:
    """Fresh engines (empty prefix caches) for every run."""
    procs, urls = [], []
    for i in range(cfg.engines):
        port = free_port()
        argv = [sys.executable, "-m", "fake_engines.vllm.cli", "serve", MODEL, "--gpu", cfg.gpu,
                "--time-scale", str(cfg.time_scale), "--max-model-len", str(cfg.max_model_len),
                "--enable-prompt-tokens-details", "--seed", str(i), "--port", str(port)]
        procs.append(spawn(f"engine{i}", argv, workdir / f"engine{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    for p, u in zip(procs, urls, strict=True):
        wait_http(u + "/health", timeout_s=120, proc=p)
    return procs, urls


def _loadgen(url: str, wl: Workload, cfg: FleetConfig, out: Path, label: str, log: Path) -> None:
    argv = [sys.executable, "-m", "flotilla", "loadgen", "--target", url, "--model", MODEL, *wl.args,
            "--speedup", f"{1 / cfg.time_scale:g}", "--slo", f"ttft={cfg.slo_ttft_s},tpot={cfg.slo_tpot_s}",
            "--timeout", "120", "--output", str(out), "--label", label, "--quiet"]
    proc = spawn("loadgen", argv, log, cwd=REPO)
    if proc.popen.wait(timeout=600) != 0:
        raise RuntimeError(f"loadgen exited with {proc.popen.returncode}; see {log}")


def one_run(spec: RouterSpec, wl: Workload, rnd: int, cfg: FleetConfig, workdir: Path) -> QualityRecord:
    """Fresh fleet, fresh router, one loadgen replay."""
    import json
    engines, urls = start_fleet(cfg, workdir)
    router: Proc | None = None
    try:
        how = launch(spec, urls, free_port(), workdir, MODEL)
        router = spawn(spec.label, how.argv, workdir / f"{spec.kind}-{spec.policy}.log", env=how.env, cwd=how.cwd)
        wait_http(how.ready_url, timeout_s=120, proc=router)
        before, c0 = _scrape(urls), tree_cpu_s(router.pid)
        out = workdir / f"{wl.name}-{spec.label.replace(' ', '_')}-r{rnd}.json"
        _loadgen(how.url, wl, cfg, out, spec.label, workdir / "loadgen.log")
        cpu, after = tree_cpu_s(router.pid) - c0, _scrape(urls)
    finally:
        for p in [router, *engines]:
            if p is not None:
                p.stop()
    s = json.loads(out.read_text())["summary"]
    rate, per_engine = hit_rate(before, after)
    return QualityRecord(spec.label, wl.name, rnd, s["num_ok"], s["num_requests"], s["ttft_s"]["p50"],
                         s["ttft_s"]["p99"], s["e2e_s"]["p99"], s["goodput_per_s"], s["request_throughput_per_s"],
                         rate, per_engine, cpu, result_path=str(out))


def run_quality(routers: list[RouterSpec], workloads: list[Workload], cfg: FleetConfig, guard: GuardConfig,
                rounds: int, workdir: Path) -> list[QualityRecord]:
    """Every router on every workload, rounds interleaved (router order reversed on odd rounds)."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    records = []
    with tqdm(total=rounds * len(workloads) * len(routers), unit="run", file=sys.stderr) as bar:
        for rnd in range(1, rounds + 1):
            for wl in workloads:
                for spec in (routers if rnd % 2 else routers[::-1]):
                    bar.set_description(f"round {rnd} {wl.name} {spec.label}")
                    g = guarded(lambda s=spec, w=wl, r=rnd: one_run(s, w, r, cfg, workdir), guard)
                    rec = g.value
                    rec.other_cores, rec.attempts = g.other_cores, g.attempts
                    rec.noisy = g.other_cores > guard.max_other_cores
                    records.append(rec)
                    bar.update()
    return records
