"""llama-server's `return_progress` reports (server-context.cpp send_partial_response with
is_progress): with `stream` and `return_progress`, one when the slot starts the prompt (processed =
the cached tokens) and one after each batch of at most n_batch prompt tokens, the last one with
every token processed."""

from __future__ import annotations


def progress_reports(total: int, cache: int, n_batch: int, prompt_ms: float) -> list[dict]:
    """Each report's `prompt_progress` {total, cache, processed, time_ms}; time spreads evenly over
    the batches (the look-alike reports them together once the prompt is done)."""
    marks = [cache, *range(cache + n_batch, total, n_batch), total] if total > cache else [cache]
    span = max(total - cache, 1)
    return [{"total": total, "cache": cache, "processed": done, "time_ms": int(prompt_ms * (done - cache) / span)}
            for done in marks]
