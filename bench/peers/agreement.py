"""Does `sglang-cache-aware` decide as the real sglang-router does? One request sequence, both routers.

The real router (`sglang-router`, installed by `install.py`, policy `cache_aware`) runs in front
of look-alike backends served here, each of which reports which request reached it and holds it
until the script releases it, so the router's load counters (in-flight requests) follow a script
rather than timing. The same sequence of arrivals and completions is replayed through the policy,
fed its own placements as its loads, with its backends in the router's worker-list order, so
ties go where SGLang's documented rule (the first in its worker list) sends them. Each request is
sent only when the router's loads equal the script's (polled from `GET /workers`), so the run is
deterministic. Agreement is the share of requests both send to the same backend.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.peers.launch import RouterSpec, launch, venv_bin
from bench.peers.procs import free_port, spawn, wait_http
from policies.routing import BackendView, RequestInfo, create_policy

MODEL = "agreement-model"
WORDS = ("the", "cache", "router", "prefix", "token", "model", "request", "engine", "batch", "queue",
         "serve", "decode", "prefill", "block", "radix", "tree", "worker", "load", "balance", "hit")


@dataclass(frozen=True)
class AgreementConfig:
    label: str
    router_args: tuple[str, ...] = ()
    """Extra sglang-router flags; the policy spec below must say the same."""
    policy: str = "sglang-cache-aware"
    backends: int = 4
    requests: int = 1000
    sessions: int = 24
    release_p: float = 0.35
    """Chance that each open request completes before the next one arrives."""
    seed: int = 0


CONFIGS = (
    AgreementConfig("defaults"),
    AgreementConfig("tight balance thresholds",
                    ("--balance-abs-threshold", "1", "--balance-rel-threshold", "1.2"),
                    "sglang-cache-aware:balance_abs_threshold=1,balance_rel_threshold=1.2"),
    AgreementConfig("control: a different policy", policy="prefix-aware"),
)
"""The third run shows the harness can tell policies apart."""


@dataclass(frozen=True)
class Step:
    prompt: str
    releases: tuple[int, ...]
    """Requests (by position) that complete before this one arrives."""


@dataclass
class Outcome:
    label: str
    policy: str
    router_args: list[str]
    requests: int
    agree: int
    first_disagreement: int | None
    by_rule: dict[str, list[int]] = field(default_factory=dict)
    """Policy rule -> [requests, agreeing]."""


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + " "


def workload(cfg: AgreementConfig) -> list[Step]:
    """Multi-turn sessions over a few shared system prompts, some one-off prompts, and a
    completion schedule drawn independently of where requests go."""
    rng = random.Random(cfg.seed)
    systems = [f"System {i}: " + _words(rng, rng.randint(5, 120)) for i in range(8)]
    history = [rng.choice(systems) for _ in range(cfg.sessions)]
    turns_left = [rng.randint(1, 6) for _ in range(cfg.sessions)]
    steps: list[Step] = []
    open_: list[int] = []
    for _ in range(cfg.requests):
        released = tuple(r for r in open_ if rng.random() < cfg.release_p)
        open_ = [r for r in open_ if r not in released]
        if rng.random() < 0.15:
            prompt = _words(rng, rng.randint(5, 80))
        else:
            s = rng.randrange(cfg.sessions)
            if turns_left[s] == 0:  # the session ends; a new one starts on a system prompt
                history[s], turns_left[s] = rng.choice(systems), rng.randint(1, 6)
            turns_left[s] -= 1
            history[s] += "User: " + _words(rng, rng.randint(3, 60))
            prompt = history[s]
            history[s] += "Assistant: " + _words(rng, rng.randint(3, 30))
        open_.append(len(steps))
        steps.append(Step(prompt, released))
    return steps


class MockFleet:
    """Backends that record each arrival (requests come one at a time, so the k-th arrival is
    request k) and answer only when released."""

    def __init__(self, count: int) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.arrivals: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        self.releases: dict[int, asyncio.Future[None]] = {}
        self._seq = 0
        self._runners: list[web.AppRunner] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    async def start(self) -> None:
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the router's HTTP/2 probes
        for i, port in enumerate(self.ports):
            app = web.Application()
            app.router.add_post("/v1/completions", functools.partial(self._complete, backend=i))
            app.router.add_route("*", "/{tail:.*}", self._other)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def release(self, seq: int) -> None:
        self.releases.setdefault(seq, asyncio.get_running_loop().create_future()).set_result(None)

    async def _complete(self, request: web.Request, backend: int) -> web.Response:
        await request.read()
        seq, self._seq = self._seq, self._seq + 1
        done = self.releases.setdefault(seq, asyncio.get_running_loop().create_future())
        self.arrivals.put_nowait((seq, backend))
        await done
        return web.json_response({"id": f"cmpl-{seq}", "object": "text_completion", "created": 0, "model": MODEL,
                                  "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def _other(self, request: web.Request) -> web.Response:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        return web.json_response({})


async def _router_loads(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with session.get(url + "/workers") as r:
        return {w["url"]: w["load"] for w in (await r.json())["workers"]}


async def _wait_loads(session: aiohttp.ClientSession, url: str, want: dict[str, int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (have := await _router_loads(session, url)) != want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"router loads {have} never reached {want}")
        await asyncio.sleep(0.005)


async def _router_order(session: aiohttp.ClientSession, url: str, count: int, timeout_s: float = 60) -> list[str]:
    """The router's worker list once every backend is healthy: the order its policy sees."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(url + "/workers") as r:
            workers = (await r.json())["workers"]
        if len(workers) == count and all(w["is_healthy"] for w in workers):
            return [w["url"] for w in workers]
        await asyncio.sleep(0.2)
    raise RuntimeError("the router never listed every backend as healthy")


async def replay(cfg: AgreementConfig, router_url: str, fleet: MockFleet) -> Outcome:
    policy = create_policy(cfg.policy)
    out = Outcome(cfg.label, cfg.policy, list(cfg.router_args), cfg.requests, 0, None)
    async with aiohttp.ClientSession() as session:
        order = await _router_order(session, router_url, len(fleet.urls))
        router_at: dict[int, str] = {}
        policy_at: dict[int, str] = {}
        pending: dict[int, asyncio.Task[int]] = {}
        for i, step in enumerate(workload(cfg)):
            for r in step.releases:
                fleet.release(r)
                await pending.pop(r)
                del router_at[r], policy_at[r]
            await _wait_loads(session, router_url, _counts(order, router_at.values()))
            loads = _counts(order, policy_at.values())
            views = [BackendView(index=k, url=u, in_flight=loads[u]) for k, u in enumerate(order)]
            decision = policy.select(views, RequestInfo(model=MODEL, prompt=step.prompt))
            assert decision is not None
            pending[i] = asyncio.create_task(_send(session, router_url, step.prompt))
            seq, backend = await asyncio.wait_for(fleet.arrivals.get(), 30)
            assert seq == i, f"arrival {seq} while waiting for request {i}"
            router_at[i], policy_at[i] = fleet.urls[backend], order[decision.index]
            _score(out, i, decision.rule, router_at[i] == policy_at[i])
        for r in list(pending):
            fleet.release(r)
        await asyncio.gather(*pending.values())
    return out


def _counts(order: Sequence[str], placed: Iterable[str]) -> dict[str, int]:
    counts = dict.fromkeys(order, 0)
    for url in placed:
        counts[url] += 1
    return counts


def _score(out: Outcome, i: int, rule: str, agree: bool) -> None:
    tally = out.by_rule.setdefault(rule, [0, 0])
    tally[0] += 1
    tally[1] += agree
    out.agree += agree
    if not agree and out.first_disagreement is None:
        out.first_disagreement = i


async def _send(session: aiohttp.ClientSession, url: str, prompt: str) -> int:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    async with session.post(url + "/v1/completions", json=body) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"router answered {r.status}")
        return r.status


async def run_one(cfg: AgreementConfig, workdir: Path) -> Outcome:
    fleet = MockFleet(cfg.backends)
    await fleet.start()
    port = free_port()
    spec = launch(RouterSpec("sglang-router cache_aware", "sglang", "cache_aware"), fleet.urls, port, workdir, MODEL)
    proc = spawn("sglang-router", [*spec.argv, *cfg.router_args], workdir / f"sglang-router-{port}.log")
    try:
        await asyncio.to_thread(wait_http, spec.ready_url, 60.0, proc)
        return await replay(cfg, spec.url, fleet)
    finally:
        proc.stop()
        await fleet.stop()


def router_version() -> str:
    """The installed sglang-router's version, or "missing"."""
    python = Path(venv_bin("sglang-router", "python"))
    if not python.exists():
        return "missing"
    res = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"],
                         capture_output=True, text=True)
    return res.stdout.strip() or "missing"


def run_agreement(configs: Sequence[AgreementConfig], workdir: Path) -> list[Outcome]:
    workdir.mkdir(parents=True, exist_ok=True)
    return [asyncio.run(run_one(cfg, workdir)) for cfg in configs]


def table(outcomes: Sequence[Outcome]) -> str:
    from bench.peers.report import markdown_table
    rows = []
    for o in outcomes:
        rules = ", ".join(f"{rule} {a}/{n}" for rule, (n, a) in sorted(o.by_rule.items()))
        first = "none" if o.first_disagreement is None else str(o.first_disagreement)
        rows.append([o.label, f"`{o.policy}`", f"{o.agree}/{o.requests} ({100 * o.agree / o.requests:.1f} %)",
                     rules, first])
    return markdown_table(["run", "policy spec", "same backend", "by the policy's rule", "first disagreement"], rows)
