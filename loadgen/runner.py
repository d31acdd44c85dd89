"""The open-loop runner: every request leaves at its trace time, finished or not.

A single dispatcher walks the workload in order, builds each prompt ahead of time, sleeps until
the request's scheduled time (trace time / speedup) and starts it as its own task, so a slow
backend never delays later sends. Multi-turn sessions keep their trace timestamps too: a turn is
not held back until the previous turn of its session has finished (the Mooncake and Azure traces
record arrivals, not think times, so holding turns back would change the offered load).
The only back-pressure is the optional concurrency cap; under it `send_time_s` is when a slot
freed, so lateness shows the cap at work.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm

from loadgen.client import stream_request
from loadgen.cost import live_cost
from loadgen.prompts import PromptBuilder
from loadgen.replicas import poll_replicas
from loadgen.results import RequestRecord, RunResult, Slo
from loadgen.stats import summarize
from loadgen.timebase import SEEN_KEY, TIME_SCALE_HEADER, count_scales
from loadgen.trace import TraceRequest

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RunnerConfig:
    """How to replay a workload against a target."""

    target_url: str
    """Base URL of the router or engine, e.g. http://127.0.0.1:8000."""
    model: str | None = None
    """Model name sent with every request without a LoRA; None asks the target's /v1/models."""
    endpoint: str = "completions"
    """API to call: `completions` (raw prompt, exact prefix reuse) or `chat`."""
    speedup: float = 1.0
    """Trace time is divided by this: 10 replays a minute of trace in six seconds."""
    max_requests: int | None = None
    """Stop after this many requests; None sends the whole workload."""
    duration_s: float | None = None
    """Send only requests scheduled within this many seconds of the start (after speedup)."""
    concurrency: int | None = None
    """Most requests in flight at once; None leaves the loop fully open."""
    request_timeout_s: float = 600.0
    """Give up on one request after this long, seconds."""
    ignore_eos: bool = True
    """Ask the engine to generate exactly output_length tokens (vLLM's ignore_eos)."""
    slo: Slo | None = None
    """SLOs for goodput; None reports no goodput."""
    replicas_url: str | None = None
    """Router /metrics URL polled for the ready-replica count; None does not poll."""
    replicas_interval_s: float = 1.0
    """Seconds between replica-count polls."""
    gpus_per_replica: int = 1
    """GPUs each replica holds, for `meta.gpu_seconds`."""
    show_progress: bool = True
    """Show a tqdm bar on stderr (only when it is a terminal)."""
    expected_requests: int | None = None
    """Requests the workload holds, when known: the progress bar's total, for its ETA."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Copied into the result's meta (trace name, label, seed)."""

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, got {self.endpoint!r}")
        if self.speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {self.speedup}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_requests is not None and self.max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, got {self.max_requests}")


def build_payload(req: TraceRequest, prompt: str, model: str, cfg: RunnerConfig) -> dict[str, Any]:
    """The JSON body of one streamed request."""
    body: dict[str, Any] = {
        "model": req.lora or model,
        "max_tokens": max(1, req.output_length),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if req.priority is not None:
        body["priority"] = req.priority
    if req.session_id is not None:
        body["user"] = req.session_id  # OpenAI's end-user id: the router's session key
    return body


def scheduled(requests: Iterable[TraceRequest], cfg: RunnerConfig) -> Iterator[tuple[float, TraceRequest]]:
    """(seconds after start, request) in order, cut by max_requests and duration_s."""
    limited = itertools.islice(requests, cfg.max_requests)
    first_ts: float | None = None
    for req in limited:
        first_ts = req.timestamp_s if first_ts is None else first_ts
        at = (req.timestamp_s - first_ts) / cfg.speedup
        if cfg.duration_s is not None and at > cfg.duration_s:
            return
        yield at, req


async def _default_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url.rstrip("/") + "/v1/models") as resp:
        resp.raise_for_status()
        data = (await resp.json()).get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])


def progress_total(cfg: RunnerConfig) -> int | None:
    """Requests the progress bar counts to: the workload's size, capped by max_requests; None
    when neither is known (the bar then shows a rate without an ETA)."""
    known = [n for n in (cfg.expected_requests, cfg.max_requests) if n is not None]
    return min(known) if known else None


PREPARE_MARGIN_S = 0.002  # stop preparing ahead this long before the next send is due
MAX_PREPARED = 512  # prepared payloads held at once: bounds memory on long idle gaps


class _Lookahead:
    """Payloads built ahead of their send time, so a burst of long prompts leaves on time.

    The dispatcher builds the next requests' prompts while it waits for the current one's time,
    so at a Mooncake tick (10+ requests at the same millisecond) every payload is ready.
    """

    def __init__(self, items: Iterator[tuple[int, tuple[float, TraceRequest]]],
                 build: Callable[[int, TraceRequest], dict[str, Any]]) -> None:
        self._items, self._build = items, build
        self._ready: deque[tuple[int, float, TraceRequest, dict[str, Any]]] = deque()

    def _prepare_one(self) -> bool:
        nxt = next(self._items, None)
        if nxt is None:
            return False
        index, (at, req) = nxt
        self._ready.append((index, at, req, self._build(index, req)))
        return True

    def pop(self) -> tuple[int, float, TraceRequest, dict[str, Any]] | None:
        """The next request and its payload; None when the workload is exhausted."""
        if not self._ready and not self._prepare_one():
            return None
        return self._ready.popleft()

    def prepare_while(self, has_time: Callable[[], bool]) -> None:
        """Build upcoming payloads for as long as `has_time()` says there is slack."""
        while len(self._ready) < MAX_PREPARED and has_time() and self._prepare_one():
            pass


class OpenLoopRunner:
    """Replays a workload against `cfg.target_url` and returns a `RunResult`."""

    def __init__(self, cfg: RunnerConfig, builder: PromptBuilder | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        self.builder = builder or PromptBuilder()
        self._clock = clock
        self._start = clock()
        self._slots = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else None
        self._time_scales: Counter[str | None] = Counter()  # header value -> successful responses

    def now_s(self) -> float:
        """Seconds since the run started."""
        return self._clock() - self._start

    async def run(self, requests: Iterable[TraceRequest]) -> RunResult:
        """Send every request at its time, wait for all, and summarize."""
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        # limit=0: an open loop must never queue behind a connection-pool cap
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            model = self.cfg.model or await _default_model(session, self.cfg.target_url)
            replicas: list[tuple[float, int]] = []
            listed: list[tuple[float, int]] = []
            self._start = self._clock()  # time zero of the schedule and of every record
            self._time_scales.clear()
            poller = self._start_poller(session, replicas, listed)
            # objects from before the run (a loaded trace, earlier runs) leave the collector's
            # view: a full collection over them pauses every send for tens of milliseconds
            gc.freeze()
            try:
                records = await self._dispatch(session, model, requests)
            finally:
                gc.unfreeze()
                if poller is not None:
                    poller.cancel()
            end_s = self.now_s()
        return RunResult(summary=summarize(records, self.cfg.slo), requests=records, replicas=replicas,
                         meta={"target": self.cfg.target_url, "model": model, "speedup": self.cfg.speedup,
                               SEEN_KEY: count_scales(self._time_scales),
                               **live_cost(listed, end_s, self.cfg.gpus_per_replica), **self.cfg.meta})

    def _start_poller(self, session: aiohttp.ClientSession, samples: list[tuple[float, int]],
                      listed: list[tuple[float, int]]) -> asyncio.Task[None] | None:
        if self.cfg.replicas_url is None:
            return None
        return asyncio.create_task(poll_replicas(session, self.cfg.replicas_url, self.now_s,
                                                 self.cfg.replicas_interval_s, samples, listed))

    async def _dispatch(self, session: aiohttp.ClientSession, model: str,
                        requests: Iterable[TraceRequest]) -> list[RequestRecord]:
        url = self.cfg.target_url.rstrip("/") + ENDPOINTS[self.cfg.endpoint]
        tasks: list[asyncio.Task[RequestRecord]] = []
        bar = tqdm(total=progress_total(self.cfg), unit="req", disable=not self._bar_wanted())
        ahead = _Lookahead(enumerate(scheduled(requests, self.cfg)),
                           lambda i, req: build_payload(req, self.builder.build(req, i), model, self.cfg))
        while (item := ahead.pop()) is not None:
            index, at, req, payload = item
            ahead.prepare_while(lambda at=at: self.now_s() < at - PREPARE_MARGIN_S)  # type: ignore[misc]
            delay = at - self.now_s()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = RequestRecord(index=index, session_id=req.session_id, scheduled_time_s=at)
            task = asyncio.create_task(self._one(session, url, payload, rec))
            task.add_done_callback(lambda _t: bar.update(1))
            tasks.append(task)
            await asyncio.sleep(0)  # let it start sending before the next one is handled
        records = list(await asyncio.gather(*tasks))
        bar.close()
        return records

    async def _one(self, session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                   rec: RequestRecord) -> RequestRecord:
        if self._slots is None:
            return await self._send(session, url, payload, rec)
        async with self._slots:
            return await self._send(session, url, payload, rec)

    async def _send(self, session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                    rec: RequestRecord) -> RequestRecord:
        rec.send_time_s = self.now_s()
        scale: list[str | None] = []
        await stream_request(session, url, payload, rec, self.now_s,
                             on_headers=lambda headers: scale.append(headers.get(TIME_SCALE_HEADER)))
        if rec.ok:  # only engines stream tokens: a proxy's own error answer names no time scale
            self._time_scales[scale[0] if scale else None] += 1
        return rec

    def _bar_wanted(self) -> bool:
        return self.cfg.show_progress and sys.stderr.isatty()
