"""llama-server's JSON bodies and SSE chunks (build b1-0c1e570), key order as captured."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

from fake_engines.llamacpp.config import BUILD_INFO

_ALNUM = string.ascii_letters + string.digits


def new_id() -> str:
    """chatcmpl-<32 alphanumerics>, used for chat and text completions alike."""
    return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))


@dataclass(frozen=True)
class Timings:
    """A finished request's prompt and generation timing (llama-server's `timings`)."""

    cache_n: int
    """Prompt tokens reused from the slot."""
    prompt_n: int
    """Prompt tokens evaluated."""
    prompt_ms: float
    """Time evaluating them."""
    predicted_n: int
    """Tokens generated."""
    predicted_ms: float
    """Time generating them."""

    def body(self) -> dict:
        """The timings object (server_slot_stats::to_json): the generation rates are over decode
        steps, one fewer than the tokens (the first comes from the last prompt batch's logits);
        a rate or per-token time whose divisor is not known yet is 0."""
        steps = max(self.predicted_n - 1, 0)
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms,
                "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n > 0 else 0.0,
                "prompt_per_second": 1e3 / self.prompt_ms * self.prompt_n if self.prompt_ms > 0 else 0.0,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_token_ms": self.predicted_ms / steps if steps > 0 else 0.0,
                "predicted_per_second": 1e3 / self.predicted_ms * steps if self.predicted_ms > 0 else 0.0}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """usage with prompt_tokens_details (always present in this build)."""
    return {"completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _envelope(obj: str, choices: list, created: int, model: str, rid: str, chat: bool) -> dict:
    if chat:
        return {"choices": choices, "created": created, "id": rid, "model": model,
                "system_fingerprint": BUILD_INFO, "object": obj}
    return {"choices": choices, "created": created, "model": model, "system_fingerprint": BUILD_INFO,
            "object": obj, "id": rid}


def chat_body(rid: str, created: int, model: str, text: str, reason: str, use: dict, timings: Timings) -> dict:
    """Non-streaming chat completion."""
    choice = {"finish_reason": reason, "index": 0, "message": {"role": "assistant", "content": text}}
    return {"choices": [choice], "created": created, "model": model, "system_fingerprint": BUILD_INFO,
            "object": "chat.completion", "usage": use, "id": rid, "timings": timings.body()}


def completion_body(rid: str, created: int, model: str, text: str, reason: str, use: dict,
                    timings: Timings) -> dict:
    """Non-streaming /v1/completions."""
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}
    return {"choices": [choice], "created": created, "model": model, "system_fingerprint": BUILD_INFO,
            "object": "text_completion", "usage": use, "id": rid, "timings": timings.body()}


def openai_logprobs(entries: list) -> dict:
    """The OpenAI-route logprobs object (chat and completions alike): per token its id, text,
    bytes and logprob, and the most likely tokens in the same form (entries from
    fake_engines.driver.logprobs)."""
    def item(c) -> dict:
        return {"id": c.token_id, "token": c.text, "bytes": c.utf8, "logprob": c.logprob}

    return {"content": [{**item(e.chosen), "top_logprobs": [item(c) for c in e.top]} for e in entries]}


def chat_chunk(rid: str, created: int, model: str, delta: dict, reason: str | None) -> dict:
    """One chat event: role first (content null), then content deltas, then an empty finishing delta."""
    return _envelope("chat.completion.chunk", [{"finish_reason": reason, "index": 0, "delta": delta}],
                     created, model, rid, chat=True)


def completion_chunk(rid: str, created: int, model: str, text: str, reason: str | None) -> dict:
    """One /v1/completions event."""
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}
    return _envelope("text_completion", [choice], created, model, rid, chat=False)


def completion_final_chunk(rid: str, created: int, model: str, reason: str, use: dict, timings: Timings) -> dict:
    """The last /v1/completions event: empty text, usage and timings (with or without include_usage)."""
    choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": reason}
    return {"choices": [choice], "created": created, "model": model, "system_fingerprint": BUILD_INFO,
            "object": "text_completion", "usage": use, "id": rid, "timings": timings.body()}


SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
"""llama-server's default sampler chain."""


def sampler_params(n_predict: int, stream: bool, lora: list, seed: int = 4294967295,
                   temperature: float = 0.800000011920929, reasoning_format: str = "none") -> dict:
    """The sampling parameters /props and /slots list (`params`), with the build's defaults, key
    for key as captured (`llama.cpp/007_props`, `042_slots_after_prefix_reuse`)."""
    return {"seed": seed, "temperature": temperature, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": 40,
            "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "top_n_sigma": -1.0, "xtc_probability": 0.0,
            "xtc_threshold": 0.10000000149011612, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75,
            "dry_allowed_length": 2, "dry_penalty_last_n": 64, "mirostat": 0, "mirostat_tau": 5.0,
            "mirostat_eta": 0.10000000149011612, "adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421,
            "max_tokens": n_predict, "n_predict": n_predict, "n_keep": 0, "n_discard": 0, "ignore_eos": False,
            "stream": stream, "n_probs": 0, "min_keep": 0, "chat_format": "Content-only",
            "reasoning_format": reasoning_format, "reasoning_in_content": False, "generation_prompt": "",
            "samplers": list(SAMPLERS), "speculative.types": "none", "timings_per_token": False,
            "post_sampling_probs": False, "backend_sampling": False, "lora": lora}


_NATIVE_EXTRA: dict[str, dict[str, object]] = {"dry_penalty_last_n": {"dry_sequence_breakers": ["\n", ":", "\"", "*"]},
                 "adaptive_decay": {"stop": []}, "stream": {"logit_bias": []},
                 "min_keep": {"grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []}}
"""Keys a task's own settings add after the ones named (native /completion `generation_settings`)."""


def generation_settings(n_predict: int, stream: bool, lora: list, seed: int = 4294967295,
                        temperature: float = 0.800000011920929, stop: list[str] | None = None) -> dict:
    """A task's sampling settings as native /completion echoes them (`llama.cpp/030`): the
    sampler params plus the stop strings, grammar and logit-bias keys, in the captured order."""
    out: dict = {}
    for key, value in sampler_params(n_predict, stream, lora, seed, temperature, "deepseek").items():
        out[key] = value
        out.update(_NATIVE_EXTRA.get(key, {}))
    out["stop"] = list(stop or [])
    return out


def native_final(model: str, prompt: str, slot: int, predicted: int, evaluated: int, cached: int,
                 stop_type: str, settings: dict, timings: Timings, content: str, stopping_word: str = "") -> dict:
    """/completion's last object (or whole body): stop true, counts, settings, timings."""
    return {"index": 0, "content": content, "tokens": [], "id_slot": slot, "stop": True, "model": model,
            "tokens_predicted": predicted, "tokens_evaluated": evaluated, "generation_settings": settings,
            "prompt": prompt, "has_new_line": False, "truncated": False, "stop_type": stop_type,
            "stopping_word": stopping_word, "tokens_cached": evaluated + predicted - 1 if predicted else evaluated,
            "timings": timings.body()}


def native_chunk(content: str, token_ids: list[int], predicted: int, evaluated: int) -> dict:
    """/completion streaming event."""
    return {"index": 0, "content": content, "tokens": token_ids, "stop": False, "id_slot": -1,
            "tokens_predicted": predicted, "tokens_evaluated": evaluated}
