"""The openai client's calls against a look-alike, compared with the same call's capture.

Each call sends a capture's request through the openai SDK (`client.models.list()`,
`client.completions.create(**request)`, `client.chat.completions.create(**request)`) and takes the
shape (bench.fidelity.replay.shape) of what the SDK gives back: each object's `model_dump()`, for a
stream each chunk's, runs of one shape counted once. The real engine's side is the captured body
built into the same SDK type as the SDK builds a response (its lenient, recursive `construct`), so a field the SDK adds, drops or fails to parse counts on both sides
alike and only what the client sees is compared.
"""

from __future__ import annotations

import json
from typing import Any

import openai
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bench.fidelity.items import Item
from bench.fidelity.replay import CAPTURES, capture_body, shape

CALLS: dict[str, list[tuple[str, str]]] = {
    "vllm": [("models.list", "004_v1_models"), ("completions.create", "014_completions_nonstream"),
             ("completions.create", "015_completions_stream_include_usage"),
             ("chat.completions.create", "017_chat_nonstream"),
             ("chat.completions.create", "018_chat_stream_include_usage"),
             ("chat.completions.create", "019_chat_stream_no_stream_options")],
    "llama.cpp": [("models.list", "004_v1_models"), ("completions.create", "017_completions_nonstream"),
                  ("completions.create", "018_completions_stream_include_usage"),
                  ("chat.completions.create", "020_chat_nonstream"),
                  ("chat.completions.create", "021_chat_stream_include_usage"),
                  ("chat.completions.create", "022_chat_stream_no_stream_options")],
}
"""engine -> (SDK call, capture whose request it sends and whose body it is compared with)."""

SDK_TYPE = {"models.list": Model, "completions.create": Completion, "chat.completions.create": ChatCompletion}
CHUNK_TYPE = {"completions.create": Completion, "chat.completions.create": ChatCompletionChunk}


def sdk_shape(objects: list[Any]) -> tuple:
    """The shapes of the SDK objects in order, a run of one shape counted once."""
    shapes = [shape(o.model_dump()) for o in objects]
    return tuple(s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1])


def captured_objects(engine: str, capture: str, call: str) -> list[Any]:
    """The capture's body as the SDK parses it."""
    body = capture_body(engine, capture)
    if call == "models.list":
        return [Model.construct(**m) for m in json.loads(body)["data"]]
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ") and line[6:].strip() != "[DONE]"]
    if events:
        return [CHUNK_TYPE[call].construct(**json.loads(e)) for e in events]
    return [SDK_TYPE[call].construct(**json.loads(body))]


async def sdk_objects(client: openai.AsyncOpenAI, call: str, request: dict) -> list[Any]:
    """What the SDK call gives back, a stream's chunks in order."""
    if call == "models.list":
        return [m async for m in client.models.list()]
    create = client.completions.create if call == "completions.create" else client.chat.completions.create
    answer = await create(**request)
    return [chunk async for chunk in answer] if request.get("stream") else [answer]


async def sdk_items(engine: str, base: str) -> list[Item]:
    """Every SDK call of the engine against the look-alike at base."""
    items = []
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
        for call, capture in CALLS[engine]:
            request_path = CAPTURES / engine / f"{capture}.req.json"
            request = json.loads(request_path.read_text()) if request_path.exists() else {}
            name = f"{call} as {capture}"
            try:
                got = sdk_shape(await sdk_objects(client, call, request))
            except openai.OpenAIError as exc:
                items.append(Item(engine, name, "differs", f"{type(exc).__name__}: {exc}"[:200], kind="sdk"))
                continue
            expected = sdk_shape(captured_objects(engine, capture, call))
            verdict = "matched" if got == expected else "differs"
            items.append(Item(engine, name, verdict, "" if got == expected else "SDK object shape", kind="sdk"))
    return items
