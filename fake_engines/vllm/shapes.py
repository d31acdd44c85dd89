"""vLLM 0.32's JSON bodies and SSE chunks, key for key as captured."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from fake_engines.vllm.config import VLLM_VERSION


@dataclass(frozen=True)
class Usage:
    """Token accounting of one response."""

    prompt_tokens: int
    """Prompt length."""
    completion_tokens: int
    """Generated tokens."""
    cached_tokens: int | None = None
    """Prompt tokens from the prefix cache; reported only with --enable-prompt-tokens-details."""

    def body(self, with_details_key: bool) -> dict:
        """usage as vLLM writes it (the streaming usage chunk omits the details keys)."""
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + self.completion_tokens,
               "completion_tokens": self.completion_tokens}
        if self.cached_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        elif with_details_key:
            out["prompt_tokens_details"] = None
        if with_details_key:
            out["completion_tokens_details"] = None
        return out


def new_id(kind: str) -> str:
    """cmpl-<16 hex> or chatcmpl-<16 hex>."""
    return f"{kind}-{secrets.token_hex(8)}"


SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-{secrets.token_hex(4)}"
"""One fingerprint per server process, as vLLM derives it at start."""

_TAIL = {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def completion_body(rid: str, created: int, model: str, text: str, finish_reason: str, usage: Usage,
                    stop_reason: str | None = None) -> dict:
    """Non-streaming /v1/completions response."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason,
              "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage.body(True), **_TAIL}


def chat_body(rid: str, created: int, model: str, text: str, finish_reason: str, usage: Usage,
              stop_reason: str | None = None) -> dict:
    """Non-streaming /v1/chat/completions response."""
    message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
              "stop_reason": stop_reason, "token_ids": None, "routed_experts": None}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
            "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage.body(True),
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, **_TAIL}


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None,
                     stop_reason: str | None = None) -> dict:
    """One streamed /v1/completions event; finish_reason rides on the last text chunk."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason,
              "prompt_token_ids": None, "token_ids": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_role_chunk(rid: str, created: int, model: str) -> dict:
    """The first chat event: the assistant role with empty content."""
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice],
            "prompt_token_ids": None, "prompt_text": None}


def chat_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None,
               stop_reason: str | None = None) -> dict:
    """A chat content event; the last one carries finish_reason and stop_reason."""
    choice: dict = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, obj: str, created: int, model: str, usage: Usage) -> dict:
    """The include_usage event: no choices, usage, then the fingerprint."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage.body(False), "system_fingerprint": SYSTEM_FINGERPRINT}


def model_card(name: str, root: str, parent: str | None, max_model_len: int | None, created: int) -> dict:
    """One /v1/models entry (base model or LoRA adapter)."""
    permission = {"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}
    return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root,
            "parent": parent, "max_model_len": max_model_len, "permission": [permission]}
