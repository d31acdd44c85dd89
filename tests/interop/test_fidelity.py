"""Look-alike vs real on the same request stream (issue 23 item 5): status codes, SSE shapes,
usage arithmetic and metric counter deltas. Timing is not compared: CPU engines are not the
modelled GPUs. The table is written to bench/out/interop-fidelity.md (docs/fidelity.md carries it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import REPO
from tests.interop.conftest import _start_all
from tests.interop.engines import MODEL_NAME, Engine
from tests.interop.wire import event_shape, parse_samples, sse_events, total

OUT = REPO / "bench" / "out" / "interop-fidelity.md"
N = 8


def chat(**extra: object) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello world, tell a story"}],
            "max_tokens": N, "ignore_eos": True, "temperature": 0, **extra}


def completion(**extra: object) -> dict:
    return {"model": MODEL_NAME, "prompt": "Hello world, tell a story", "max_tokens": N, "ignore_eos": True,
            "temperature": 0, **extra}


USAGE = {"include_usage": True}
# name, path, body (a dict is sent as JSON; bytes as they are)
CASES: list[tuple[str, str, dict | bytes]] = [
    ("chat", "/v1/chat/completions", chat()),
    ("chat stream + usage", "/v1/chat/completions", chat(stream=True, stream_options=USAGE)),
    ("chat stream", "/v1/chat/completions", chat(stream=True)),
    ("completion", "/v1/completions", completion()),
    ("completion stream + usage", "/v1/completions", completion(stream=True, stream_options=USAGE)),
    ("completion stream", "/v1/completions", completion(stream=True)),
    ("unknown model", "/v1/chat/completions", chat(model="no-such-model")),
    ("missing messages", "/v1/chat/completions", {"model": MODEL_NAME}),
    ("max_tokens -5 (chat)", "/v1/chat/completions", chat(max_tokens=-5)),
    ("temperature 'hot'", "/v1/completions", completion(temperature="hot")),
    ("malformed JSON", "/v1/completions", b'{"model": "tiny-llama", "prompt": '),
]
COUNTERS = {
    "vllm": {"prompt": "vllm:prompt_tokens_total", "generated": "vllm:generation_tokens_total",
             "finished": "vllm:request_success_total"},
    "llamacpp": {"prompt": "llamacpp:prompt_tokens_total", "cached": "llamacpp:prompt_tokens_cached_total",
                 "generated": "llamacpp:tokens_predicted_total"},
}


@dataclass
class Seen:
    status: int
    shape: str
    """Top-level keys of the body, or of each kind of stream event (content / finish / usage)."""
    usage_ok: bool | None
    """total = prompt + completion and completion = max_tokens (None: no usage in the answer)."""
    usage: dict | None


def observe(status: int, content_type: str, raw: bytes) -> Seen:
    if content_type.startswith("text/event-stream"):
        events = sse_events(raw)
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        shapes = list(dict.fromkeys(event_shape(c) for c in chunks))
        usage = next((c["usage"] for c in chunks if c.get("usage")), None)
        shape = " / ".join(shapes) + (" / [DONE]" if events[-1] == "[DONE]" else " / (no [DONE])")
    else:
        try:
            body = json.loads(raw)
        except ValueError:
            return Seen(status, f"not JSON: {raw[:40]!r}", None, None)
        usage = body.get("usage") if isinstance(body, dict) else None
        shape = ",".join(sorted(k for k in body if body[k] is not None)) if isinstance(body, dict) else type(body)
        if isinstance(body, dict) and "error" in body:
            shape = "error:" + ",".join(sorted(body["error"]))
    ok = None if not usage else (usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
                                 and usage["completion_tokens"] == N)
    return Seen(status, shape, ok, usage)


async def run_cases(engine: Engine) -> tuple[dict[str, Seen], dict[str, float]]:
    # a connection per request: llama-server closes its side after some errors
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        async def counters() -> dict[str, float]:
            async with session.get(engine.url + "/metrics") as resp:
                samples = parse_samples(await resp.text())
            names = COUNTERS[engine.flavor]
            out = {k: total(samples, name) for k, name in names.items()}
            if engine.flavor == "vllm":
                out["finished"] = total(samples, names["finished"], finished_reason="length")
            return out

        before = await counters()
        seen = {}
        for name, path, body in CASES:
            kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
                else {"json": body}
            async with session.post(engine.url + path, **kwargs) as resp:
                seen[name] = observe(resp.status, resp.headers.get("Content-Type", ""), await resp.read())
        after = await counters()
    return seen, {k: after[k] - before[k] for k in after}


@pytest.fixture(scope="module")
def lookalikes(engine_logs: Path) -> Iterator[dict[str, Engine]]:
    py = sys.executable
    engines = {
        "vllm": Engine("fake-vllm", "vllm", [py, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b",
                                             "--served-model-name", MODEL_NAME, "--max-num-seqs", "2",
                                             "--enable-prompt-tokens-details", "--time-scale", "0.01"], engine_logs),
        "llamacpp": Engine("fake-llama-server", "llamacpp",
                           [py, "-m", "fake_engines.llamacpp.cli", "-m", "llama-3.1-8b-F16.gguf", "-a", MODEL_NAME,
                            "--metrics", "-np", "2", "-c", "8192", "--time-scale", "0.01"], engine_logs),
    }
    _start_all(list(engines.values()))
    yield engines
    for engine in engines.values():
        engine.stop()


def expected_deltas(seen: dict[str, Seen]) -> dict[str, float]:
    """What the counters must move by: every 200 generated exactly N tokens (ignore_eos) and
    finished by length; prompt tokens as the answers that carry usage report them."""
    answered = sum(1 for s in seen.values() if s.status == 200)
    return {"generated": N * answered, "finished": answered}


def table(flavor: str, real: dict[str, Seen], fake: dict[str, Seen]) -> list[str]:
    rows = [f"| {flavor} case | real status | look-alike status | real shape | look-alike shape | usage arithmetic "
            "(real / look-alike) |", "|---|---|---|---|---|---|"]
    for name, _, _ in CASES:
        r, f = real[name], fake[name]
        same = "" if r.shape == f.shape else " **differs**"
        rows.append(f"| {name} | {r.status} | {f.status}{'' if r.status == f.status else ' **differs**'} | "
                    f"`{r.shape}` | `{f.shape}`{same} | {r.usage_ok} / {f.usage_ok} |")
    return rows


KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {}
"""Shape differences found by this test and not fixed yet in the look-alike; a fixed one fails
the test until it is taken off this list."""


@pytest.mark.parametrize("flavor, pair", [("vllm", "vllm_pair"), ("llamacpp", "llama_pair")])
async def test_the_lookalike_answers_the_request_stream_as_the_real_engine_does(flavor, pair, request, lookalikes):
    real_engine = request.getfixturevalue(pair)[0]
    real, real_delta = await run_cases(real_engine)
    fake, fake_delta = await run_cases(lookalikes[flavor])
    rows = table(flavor, real, fake)
    real_expected, fake_expected = expected_deltas(real), expected_deltas(fake)
    deltas = [f"| {flavor} counter | real delta | look-alike delta | expected real / look-alike |", "|---|---|---|---|"]
    for key in real_delta:
        deltas.append(f"| `{COUNTERS[flavor][key]}` | {real_delta[key]:g} | {fake_delta[key]:g} | "
                      f"{real_expected.get(key, '-')} / {fake_expected.get(key, '-')} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "a") as f:
        f.write("\n".join(rows + [""] + deltas) + "\n\n")
    # what must hold on both: statuses, usage arithmetic, counters moved as the answers say
    assert {n: s.status for n, s in fake.items()} == {n: s.status for n, s in real.items()}
    assert all(s.usage_ok in (True, None) for s in [*real.values(), *fake.values()])
    for key, want in real_expected.items():
        if key in real_delta:
            assert real_delta[key] == want, (key, real_delta[key], want)
            assert fake_delta[key] == fake_expected[key], (key, fake_delta[key], fake_expected[key])
    mismatched = {(flavor, n) for n in real if real[n].shape != fake[n].shape}
    known = {k for k in KNOWN_DIFFERENCES if k[0] == flavor}
    assert mismatched == known, f"shapes differ: {sorted(mismatched - known)}, fixed: {sorted(known - mismatched)}"
