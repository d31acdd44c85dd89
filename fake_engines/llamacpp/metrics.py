"""llama-server's /metrics: 15 unlabelled llamacpp:* families, computed at scrape time.

llama-server does not use a Prometheus client library: it prints each family with `# HELP` and
`# TYPE`, whole numbers without a decimal point, other values with C++ stream precision (6
significant digits), and no `_created` series. prometheus_client cannot print that shape, so
the exposition is written here from a counters snapshot (the text is parsed back with
prometheus_client.parser in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"


@dataclass
class LlamaCounters:
    """llama-server's server_metrics: lifetime totals plus the since-last-scrape throughput bucket."""

    prompt_tokens: int = 0
    """Prompt tokens evaluated (cached ones excluded), counted when a prompt finishes."""
    prompt_tokens_cached: int = 0
    """Prompt tokens reused from a slot's cache."""
    prompt_s: float = 0.0
    """Time spent evaluating prompts."""
    tokens_predicted: int = 0
    """Generated tokens, counted when a request ends (finished or cancelled)."""
    tokens_predicted_s: float = 0.0
    """Time spent generating."""
    n_decode: int = 0
    """llama_decode() calls (engine steps)."""
    n_busy_slots_total: int = 0
    """Busy slots summed over decode calls (for the per-decode average)."""
    n_tokens_max: int = 0
    """Largest prompt + generation length seen in one slot."""
    bucket_prompt_tokens: int = 0
    """Prompt tokens since the previous scrape."""
    bucket_prompt_s: float = 0.0
    """Prompt time since the previous scrape."""
    bucket_predicted_tokens: int = 0
    """Decode steps spent generating since the previous scrape: each task's tokens but its first,
    which came with the prompt (llama-server's predict_bucket rate counts steps)."""
    bucket_predicted_s: float = 0.0
    """Generation time since the previous scrape."""

    def on_prompt_done(self, evaluated: int, cached: int, elapsed_s: float) -> None:
        """A slot finished its prompt: evaluated tokens took elapsed_s."""
        self.prompt_tokens += evaluated
        self.prompt_tokens_cached += cached
        self.prompt_s += elapsed_s
        self.bucket_prompt_tokens += evaluated
        self.bucket_prompt_s += elapsed_s

    def on_request_done(self, predicted: int, elapsed_s: float, n_tokens: int) -> None:
        """A slot released its task (finished or cancelled) after predicting `predicted` tokens."""
        self.tokens_predicted += predicted
        self.tokens_predicted_s += elapsed_s
        self.bucket_predicted_tokens += max(predicted - 1, 0)
        self.bucket_predicted_s += elapsed_s
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)

    def on_decode(self, busy_slots: int) -> None:
        """One llama_decode() call with this many busy slots."""
        self.n_decode += 1
        self.n_busy_slots_total += busy_slots


def format_value(value: float) -> str:
    """C++ ostream formatting: whole numbers bare, else 6 significant digits."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def render_metrics(c: LlamaCounters, requests_processing: int, requests_deferred: int) -> str:
    """The exposition text; resets the throughput bucket, as each llama-server scrape does."""
    families = [
        ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens",
         c.prompt_tokens),
        ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache",
         c.prompt_tokens_cached),
        ("prompt_seconds_total", "counter", "Total time spent processing prompts", c.prompt_s),
        ("tokens_predicted_total", "counter", "Number of generation tokens processed", c.tokens_predicted),
        ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens", c.tokens_predicted_s),
        ("n_decode_total", "counter",
         "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding", c.n_decode),
        ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)", c.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated", 0),
        ("spec_decode_num_accepted_tokens_total", "counter",
         "Speculative: Total draft tokens accepted by the target model", 0),
        ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps", 0),
        ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s",
         _rate(c.bucket_prompt_tokens, c.bucket_prompt_s)),
        ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s",
         _rate(c.bucket_predicted_tokens, c.bucket_predicted_s)),
        ("requests_processing", "gauge", "Number of requests processing", requests_processing),
        ("requests_deferred", "gauge", "Number of requests deferred", requests_deferred),
        ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         c.n_busy_slots_total / max(c.n_decode, 1)),
    ]
    c.bucket_prompt_tokens, c.bucket_prompt_s = 0, 0.0
    c.bucket_predicted_tokens, c.bucket_predicted_s = 0, 0.0
    lines = []
    for name, kind, doc, value in families:
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {format_value(value)}"]
    return "\n".join(lines) + "\n"
