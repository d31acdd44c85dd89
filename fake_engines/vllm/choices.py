"""The choices of one OpenAI request: one engine request each, their outputs merged, stop strings applied.

vLLM detokenizes each output, cuts the text before the first stop string, finishes the request
with finish_reason "stop" and stop_reason set to that string, and frees it in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from fake_engines.core import decode
from fake_engines.driver.live import RequestHandle
from fake_engines.driver.stops import cut_at_stop
from fake_engines.vllm.app import EngineUnit


@dataclass
class Choice:
    """One engine request serving one choice of the response."""

    index: int
    """Choice index in the response."""
    unit: EngineUnit
    """The data-parallel engine running it."""
    handle: RequestHandle
    """Its outputs and milestones."""
    text: str = ""
    """Text sent so far."""


@dataclass(frozen=True)
class ChoiceDelta:
    """What one engine output means for the response."""

    index: int
    """The choice."""
    text: str
    """New text (stop strings cut)."""
    has_tokens: bool
    """False for a prefill chunk that produced no token (nothing to send)."""
    finish_reason: str | None
    """stop or length on the last delta of a choice."""
    stop_reason: str | None
    """The stop string that ended the choice."""
    cached_tokens: int
    """Prompt tokens served from the prefix cache (on the last delta)."""
    num_output_tokens: int = 0
    """Tokens the choice had generated when this output was produced (for usage so far)."""
    token_ids: tuple[int, ...] = ()
    """The tokens this output added (their log-probabilities, when asked for)."""


def abort(choices: list[Choice]) -> None:
    """Client gone: free every choice's KV blocks now."""
    for choice in choices:
        choice.unit.driver.abort(choice.handle.request.request_id)


async def _pump(choice: Choice, stops: list[str], queue: asyncio.Queue) -> None:
    async for out in choice.handle.outputs():
        new, stop = cut_at_stop(choice.text, decode(list(out.new_token_ids)), stops)
        choice.text += new
        if stop is not None:
            choice.unit.driver.stop_early(choice.handle.request.request_id)
            queue.put_nowait(ChoiceDelta(choice.index, new, True, "stop", stop, out.num_cached_tokens,
                                         out.num_output_tokens, tuple(out.new_token_ids)))
            return
        reason = (out.finish_reason.value if out.finish_reason else "stop") if out.finished else None
        queue.put_nowait(ChoiceDelta(choice.index, new, bool(out.new_token_ids), reason, None,
                                     out.num_cached_tokens, out.num_output_tokens, tuple(out.new_token_ids)))


async def deltas(choices: list[Choice], stops: list[str]) -> AsyncGenerator[ChoiceDelta, None]:
    """Every choice's deltas as they come; ends once each choice has finished."""
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(c, stops, queue)) for c in choices]
    try:
        remaining = len(choices)
        while remaining:
            delta = await queue.get()
            remaining -= delta.finish_reason is not None
            yield delta
    finally:
        for task in tasks:
            task.cancel()
