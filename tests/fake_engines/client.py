"""HTTP calls on a look-alike engine, error answers included: blocking ones (for an engine run in an
EngineThread) and ones on an aiohttp session (for an engine on the test's own loop)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import aiohttp


def post(base_url: str, path: str, body: object, content_type: str = "application/json") -> tuple[int, str, str]:
    """Status, Content-Type and body text of a POST; `body` is sent as JSON unless it is already bytes
    (for malformed bodies). An HTTP error status is an answer like any other, not an exception."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def post_json(base_url: str, path: str, body: object, content_type: str = "application/json") -> tuple[int, Any]:
    """Status and parsed JSON answer of a POST (see `post`)."""
    status, _, text = post(base_url, path, body, content_type)
    return status, json.loads(text)


async def post_on(session: aiohttp.ClientSession, url: str, body: object = None) -> tuple[int, Any]:
    """Status and parsed JSON answer of a POST on an aiohttp session."""
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


def stream_text_and_usage(sse: str) -> tuple[str, dict[str, Any]]:
    """A completion or chat completion stream's text joined, and its usage event ({} without one)."""
    text = ""
    usage: dict[str, Any] = {}
    for line in sse.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            text += "".join((c.get("delta") or {}).get("content") or c.get("text", "") for c in event["choices"])
    return text, usage
