"""The one request record every trace reader and synthetic generator yields.

`TraceRequest` is also the schema of Flotilla JSONL, the canonical trace format
(docs/trace-format.md): one `to_json_dict()` object per line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids cover 512-token blocks


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload, as it arrives."""

    timestamp_s: float
    """Arrival time in seconds from the start of the trace."""
    output_length: int
    """Tokens to generate (sent as max_tokens)."""
    input_length: int | None = None
    """Prompt length in tokens; None when `prompt` carries literal text."""
    prompt: str | None = None
    """Literal prompt text; when None the text is built from hash_ids or input_length."""
    session_id: str | None = None
    """Conversation or agent session this request belongs to; None when unknown. An integer
    given here is kept as its decimal string."""
    hash_ids: tuple[int, ...] = ()
    """Prefix-block ids: equal leading ids mean an equal prompt prefix of that many blocks."""
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    """Tokens per hash_ids block."""
    lora: str | None = None
    """LoRA adapter name (sent as the model name); None for the base model."""
    model: str | None = None
    """Model name recorded in the trace; None lets the runner pick."""
    priority: int | None = None
    """Scheduling priority (vLLM: lower runs first); None when not set."""
    service_time_s: float | None = None
    """Service time the trace recorded, for reference only; the runner never waits on it."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Source columns with no field here (e.g. BurstGPT's Log Type), kept for conversion."""

    def __post_init__(self) -> None:
        if self.prompt is None and self.input_length is None:
            raise ValueError("TraceRequest needs prompt or input_length")
        if self.output_length < 0:
            raise ValueError(f"output_length must be >= 0, got {self.output_length}")
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {self.block_tokens}")
        if isinstance(self.session_id, int):  # traces may number sessions: 0 and "0" are one session
            object.__setattr__(self, "session_id", str(self.session_id))

    def to_json_dict(self) -> dict[str, Any]:
        """The Flotilla JSONL object: unset optional fields are left out."""
        out: dict[str, Any] = {"timestamp_s": self.timestamp_s}
        for name in ("session_id", "prompt", "input_length"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["output_length"] = self.output_length
        if self.hash_ids:
            out["hash_ids"] = list(self.hash_ids)
            out["block_tokens"] = self.block_tokens
        for name in ("lora", "model", "priority", "service_time_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.extra:
            out["extra"] = self.extra
        return out
