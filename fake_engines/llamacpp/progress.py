"""llama-server's `return_progress` reports (server-context.cpp send_partial_response with
is_progress): with `stream` and `return_progress`, one when the slot starts the prompt (processed =
the cached tokens) and one after each batch of at most n_batch prompt tokens, the last one with
every token processed. With `timings_per_token` each also carries the slot's stats at that moment."""

from __future__ import annotations

from fake_engines.llamacpp.shapes import Timings


def progress_reports(total: int, cache: int, n_batch: int, prompt_ms: float) -> list[dict]:
    """Each report's `prompt_progress` {total, cache, processed, time_ms}; time spreads evenly over
    the batches (the look-alike reports them together once the prompt is done)."""
    marks = [cache, *range(cache + n_batch, total, n_batch), total] if total > cache else [cache]
    return [{"total": total, "cache": cache, "processed": done, "time_ms": int(_elapsed_ms(total, cache, done, prompt_ms))}
            for done in marks]


def progress_timings(report: dict, prompt_ms: float) -> dict:
    """The `timings` a report carries with timings_per_token (server_slot_stats::to_json then): the
    prompt tokens processed so far and their share of `prompt_ms`, nothing generated yet; the first
    report, before any prompt token, is all zeros."""
    total, cache, done = report["total"], report["cache"], report["processed"]
    return Timings(cache_n=cache, prompt_n=done - cache, prompt_ms=_elapsed_ms(total, cache, done, prompt_ms),
                   predicted_n=0, predicted_ms=0.0).body()


def _elapsed_ms(total: int, cache: int, done: int, prompt_ms: float) -> float:
    """Time spent on the prompt once `done` tokens are processed: evenly spread over the uncached ones."""
    return prompt_ms * (done - cache) / max(total - cache, 1)
