"""Replay every captured request of the real engines against the look-alikes and compare.

The captures (`tests/data/real-engines/{vllm,llama.cpp}/`, listed in each folder's INDEX.md with
method, path and status) were taken from a real vLLM 0.32.0 and a real llama-server b1-0c1e570
serving a tiny model. Each one is sent, in the captured order, to a look-alike started as the real
engine was (vLLM: `--max-model-len 2048 --max-num-seqs 2`, served as tiny-llama; llama-server:
`-np 2 -c 2048 --metrics`) and compared on:

- status code;
- body shape: for JSON, every key at every depth with its value's type (values left out); for a
  stream, the shape of each event kind in order; for /metrics, the set of metric family names;
- nothing else (headers, timing and values are other tests' business).

Each item is `matched`, `differs` (with what differs) or `accepted` (a difference listed in
ACCEPTED with its reason); the summary counts them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from bench.fidelity.items import Item

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "data" / "real-engines"
LONG_PROMPT = "abcd" * 3001
"""The captures elide their over-long prompts as <<long_prompt...>>; this one is as long in tokens."""

ACCEPTED: dict[tuple[str, str], str] = {}
"""(engine, capture) -> why the look-alike differs on purpose (docs/fidelity.md lists them); none now."""


def index_rows(engine: str) -> list[tuple[str, str, str]]:
    """(name, method, path) of every request row of the run's INDEX.md with its file here (the main
    runs' rows name the capture, the LoRA run's its file and carry the request body, kept here as
    the capture's `.req.json`)."""
    rows = []
    for line in (CAPTURES / engine / "INDEX.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].removesuffix(".http")
        if len(cells) < 4 or not re.match(r"^\d{3}_", name) or cells[1] == "-":
            continue
        if (CAPTURES / engine / f"{name}.http").exists():
            rows.append((name, cells[1], cells[2].strip("`")))
    return rows


def shape(value: Any, under: str = "") -> Any:
    """Keys and value types at every depth; a list's shape is its fullest item's; top_logprobs maps
    of token -> logprob count by their value types only."""
    if isinstance(value, dict) and under == "top_logprobs" and not {"token", "logprob"} <= set(value):
        return ("map", frozenset(shape(v) for v in value.values()))
    if isinstance(value, dict):
        return tuple(sorted((k, shape(v, k)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", max((shape(v, under) for v in value), key=lambda s: len(repr(s)), default=None))
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def body_shape(content_type: str, body: str) -> Any:
    """The comparable shape of a response body."""
    if "event-stream" in content_type:
        events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
        kinds = [("done",) if e.strip() == "[DONE]" else shape(json.loads(e)) for e in events]
        return ("stream", tuple(k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]))
    if "text/plain" in content_type and "# TYPE" in body:
        return ("metrics", frozenset(re.findall(r"^# TYPE (\S+)", body, re.MULTILINE)))
    try:
        return shape(json.loads(body)) if body.strip() else ("empty",)
    except json.JSONDecodeError:
        return ("text",)


def capture_body(engine: str, name: str) -> str:
    """The response body of one capture (what follows its headers)."""
    raw = (CAPTURES / engine / f"{name}.http").read_text(errors="replace")
    parts = re.split(r"\r?\n\r?\n", raw, maxsplit=1)
    return parts[1] if len(parts) == 2 else ""


def captured(engine: str, name: str) -> tuple[int, Any, bytes | None, str]:
    """(status, body shape, request body, request content type) of one capture."""
    raw = (CAPTURES / engine / f"{name}.http").read_bytes().decode("utf-8", errors="replace")
    head, _, body = re.split(r"(\r?\n\r?\n)", raw, maxsplit=1) if re.search(r"\r?\n\r?\n", raw) else (raw, "", "")
    status = int(head.split()[1])
    ctype = next((line.split(":", 1)[1].strip() for line in head.splitlines()[1:]
                  if line.lower().startswith("content-type:")), "")
    request_path = CAPTURES / engine / f"{name}.req.json"
    request = request_path.read_bytes() if request_path.exists() else None
    if request is not None and b"<<long_prompt" in request:  # in `prompt` or a message's `content`
        request = re.sub(rb"<<long_prompt[^>]*>>", LONG_PROMPT.encode(), request)
    return status, body_shape(ctype, body), request, "text/plain" if "text_plain" in name else "application/json"


async def replay_engine(engine: str, base: str, paths: dict[str, str] | None = None,
                        names: set[str] | None = None) -> list[Item]:
    """Every request row of the engine's INDEX.md (those of `names` if given) sent in order to the
    look-alike at base; `paths` maps a captured machine's directory to one here (the LoRA run's
    adapters)."""
    items = []
    async with aiohttp.ClientSession() as session:
        for name, method, path in index_rows(engine):
            if names is not None and name not in names:
                continue
            status, expected, request, ctype = captured(engine, name)
            for theirs, ours in (paths or {}).items():
                request = request.replace(theirs.encode(), ours.encode()) if request is not None else None
            headers = {"Content-Type": ctype} if request is not None else {}
            async with session.request(method, base + path, data=request, headers=headers) as resp:
                text = (await resp.read()).decode("utf-8", errors="replace")
                got = body_shape(resp.headers.get("Content-Type", ""), text)
                items.append(_verdict(engine, name, status, expected, resp.status, got))
    return items


def _verdict(engine: str, name: str, status: int, expected: Any, got_status: int, got: Any) -> Item:
    if status == got_status and expected == got:
        return Item(engine, name, "matched")
    if (engine, name) in ACCEPTED:
        return Item(engine, name, "accepted", ACCEPTED[(engine, name)])
    if status != got_status:
        return Item(engine, name, "differs", f"status {got_status}, real {status}")
    if isinstance(expected, tuple) and expected and expected[0] == "metrics":
        missing, extra = sorted(expected[1] - got[1]), sorted(got[1] - expected[1])
        return Item(engine, name, "differs", f"metric families missing {missing[:5]} extra {extra[:5]}")
    return Item(engine, name, "differs", "body shape")
