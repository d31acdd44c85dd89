"""Client side of the interop suite: requests through the proxy, SSE framing checks, metric reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.interop.engines import MODEL_NAME

DEBUG = {"x-flotilla-debug": "1"}


def completion_body(prompt: str = "Hello world, tell a story", max_tokens: int = 4, **extra: object) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def chat_body(content: str = "Hello world, tell a story", max_tokens: int = 4, **extra: object) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    events: list[str] = field(default_factory=list)
    """The data payloads of an event stream, in order ('[DONE]' included)."""

    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def backend(self) -> str:
        return self.headers.get("x-flotilla-backend", "")

    def chunks(self) -> list[dict]:
        """The JSON events of a stream (everything but [DONE])."""
        return [json.loads(e) for e in self.events if e != "[DONE]"]


def event_shape(chunk: dict) -> str:
    """`kind:keys` of a stream event: kind is usage (no choice), finish or content; keys are its
    top-level keys with a value."""
    kind = "usage" if not chunk.get("choices") else (
        "finish" if chunk["choices"][0].get("finish_reason") else "content")
    return f"{kind}:{','.join(sorted(k for k in chunk if chunk[k] is not None))}"


def sse_events(raw: bytes) -> list[str]:
    """The data payloads of an event stream, asserting its framing: events separated by a blank
    line, each made of `data: ` lines (comment lines, starting with ':', allowed), LF line ends."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    events = []
    for block in text[:-2].split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        assert all(line.startswith("data: ") for line in lines), f"not a data event: {block[:200]!r}"
        events.append("\n".join(line[len("data: "):] for line in lines))
    return events


async def post(client: aiohttp.ClientSession, url: str, path: str, body: dict,
               headers: dict[str, str] | None = None) -> Reply:
    async with client.post(url + path, json=body, headers={**DEBUG, **(headers or {})}) as resp:
        raw = await resp.read()
        reply = Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw)
    if reply.status == 200 and reply.headers.get("content-type", "").startswith("text/event-stream"):
        reply.events = sse_events(raw)
    return reply


async def get_json(client: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with client.get(url) as resp:
        return resp.status, await resp.json(content_type=None)


async def scrape(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """GET /metrics as {'name{label="v",...}': value} over every sample (label keys sorted)."""
    async with client.get(url + "/metrics") as resp:
        assert resp.status == 200, resp.status
        text = await resp.text()
    return parse_samples(text)


def parse_samples(text: str) -> dict[str, float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for key, v in samples.items()
               if key.split("{", 1)[0] == name and all(w in key for w in want))
