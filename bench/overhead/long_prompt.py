"""`python -m bench.overhead --long-prompt`: what the proxy adds to one long prompt, per policy.

Unloaded, one request at a time: the same 400,000-character prompt (completions, and chat with a
system and a user message) goes to the zero-latency backend directly and through `flotilla proxy`
in strict alternation, so a busy spell on the machine hits both legs of a pair. The added latency
of a pair is proxied minus direct; a policy's figure is the median over pairs, with the 25th-75th
percentile range of the pairs as its noise. One proxy process per policy, started in turn.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.overhead.report import replace_section

POLICIES = ("round-robin", "prefix-aware", "prefix-cost", "weighted", "prefix-capacity", "precise-prefix")
KINDS = ("completions", "chat")
START = "<!-- overhead-long-prompt:start -->"
END = "<!-- overhead-long-prompt:end -->"
_WORDS = ("the", "routing", "engine", "cache", "block", "token", "prefix", "of", "a", "request", "backend")


def long_text(chars: int, seed: int = 0) -> str:
    """Printable ASCII words, exactly `chars` characters, the same for a seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS) + " "
        parts.append(word)
        size += len(word)
    return "".join(parts)[:chars]


def bodies(chars: int) -> dict[str, tuple[str, bytes]]:
    """Per kind, the path and the JSON body sent (non-streaming)."""
    text = long_text(chars)
    return {
        "completions": ("/v1/completions", json.dumps({"model": "bench", "prompt": text, "max_tokens": 16}).encode()),
        "chat": ("/v1/chat/completions", json.dumps({
            "model": "bench", "max_tokens": 16,
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": text}]}).encode()),
    }


@dataclass
class Added:
    """Added milliseconds of one policy and kind, over pairs."""

    policy: str
    kind: str
    direct_p50_ms: float
    added_ms: list[float]

    def pct(self, p: float) -> float:
        xs = sorted(self.added_ms)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}")
    return 1000 * (time.perf_counter() - t0)


async def measure(direct: str, proxy: str, policy: str, kind: str, path: str, body: bytes,
                  pairs: int, warmup: int) -> Added:
    """`pairs` alternating direct / proxied requests, each leg on its own kept-alive connection."""
    conn = {"limit": 1}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(**conn)) as d, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(**conn)) as p:
        for _ in range(warmup):
            await _one(d, direct + path, body)
            await _one(p, proxy + path, body)
        direct_ms, added = [], []
        for i in range(pairs):
            if i % 2:  # alternate which leg goes first
                pm = await _one(p, proxy + path, body)
                dm = await _one(d, direct + path, body)
            else:
                dm = await _one(d, direct + path, body)
                pm = await _one(p, proxy + path, body)
            direct_ms.append(dm)
            added.append(pm - dm)
    return Added(policy, kind, statistics.median(direct_ms), added)


def table(results: list[Added], before: dict[tuple[str, str], float] | None = None) -> str:
    head = "| policy | request | direct p50 ms | added p50 ms | added p25 – p75 ms |"
    rows = [head, "|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| `{r.policy}` | {r.kind} | {r.direct_p50_ms:.2f} | {statistics.median(r.added_ms):+.2f} | "
                    f"{r.pct(25):+.2f} – {r.pct(75):+.2f} |")
    return "\n".join(rows)


def section(results: list[Added], args: argparse.Namespace, machine: str, command: str) -> str:
    return f"""{START}
## Long prompts: added latency per policy

`{command}` sends one {args.chars:,}-character prompt (printable ASCII words; completions, and chat
with a short system message before it; not streamed) to the zero-latency backend
(`bench/overhead/backend.py`) directly and through `flotilla proxy` (one process, uvloop, one
backend), one request at a time, alternating direct and proxied, {args.pairs} pairs per policy and
request after {args.warmup} warm-up pairs. *Added* is proxied minus direct for each pair; the table
gives its median and the 25th-75th percentile range over pairs (the noise).

Machine: {machine}.

{table(results)}
{END}"""


async def run(args: argparse.Namespace, spawn, free_port, wait_ready, bar) -> list[Added]:
    kinds = bodies(args.chars)
    backend_port = free_port()
    direct = f"http://127.0.0.1:{backend_port}"
    backend = spawn(["-m", "bench.overhead.backend", "--port", str(backend_port)])
    results: list[Added] = []
    try:
        await wait_ready(direct + "/health")
        for policy in args.policies:
            port = free_port()
            proxy = spawn(["-m", "flotilla", "proxy", "--port", str(port), "--backend", direct, "--policy", policy])
            try:
                await wait_ready(f"http://127.0.0.1:{port}/ready")
                for kind in KINDS:
                    path, body = kinds[kind]
                    bar.set_description(f"{policy}: {kind}")
                    results.append(await measure(direct, f"http://127.0.0.1:{port}", policy, kind, path, body,
                                                 args.pairs, args.warmup))
                    bar.update(1)
            finally:
                proxy.terminate()
                proxy.wait(timeout=10)
    finally:
        backend.terminate()
        backend.wait(timeout=10)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--long-prompt", action="store_true",
                        help="measure the added latency of one long prompt per policy instead (see long_prompt.py)")
    parser.add_argument("--chars", type=int, default=400_000, help="--long-prompt: prompt length (default 400000)")
    parser.add_argument("--pairs", type=int, default=200, help="--long-prompt: pairs per policy and request")
    parser.add_argument("--warmup", type=int, default=10, help="--long-prompt: warm-up pairs")
    parser.add_argument("--policies", type=lambda s: tuple(s.split(",")), default=POLICIES,
                        help=f"--long-prompt: comma-separated policies (default {','.join(POLICIES)})")


def write(path: Path, text: str) -> None:
    replace_section(path, START, END, text)


if __name__ == "__main__":
    sys.exit("run it as: python -m bench.overhead --long-prompt")
