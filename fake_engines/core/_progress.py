"""Applying a finished step to one request: computed tokens advance, a token is sampled, it may finish."""

from __future__ import annotations

from fake_engines.core._generator import TokenSource, next_token_id
from fake_engines.core._request import EngineRequest, FinishReason, RequestOutput, RequestStatus


def _finish_reason(request: EngineRequest, context_limit: int | None) -> FinishReason | None:
    num_output = len(request.output_token_ids)
    if num_output >= request.max_tokens:
        return FinishReason.LENGTH
    if num_output >= request.output_len:
        return FinishReason.STOP
    if context_limit is not None and request.num_tokens >= context_limit:
        return FinishReason.LENGTH
    return None


def advance_request(
    request: EngineRequest,
    num_new_tokens: int,
    stream: TokenSource,
    context_limit: int | None = None,
) -> RequestOutput | None:
    """Credit num_new_tokens computed tokens; once caught up, sample the next token.

    Returns None for a prefill chunk that leaves part of the prompt (or recompute) to do.
    A request that reaches max_tokens, its output_len, or context_limit tokens is marked finished."""
    request.num_computed_tokens += num_new_tokens
    if request.num_computed_tokens < request.num_tokens:
        return None
    if request.is_prompt_only:
        return _prompt_done(request)
    token_id = next_token_id(stream)
    request.output_token_ids.append(token_id)
    reason = _finish_reason(request, context_limit)
    if reason is FinishReason.LENGTH:
        request.status = RequestStatus.FINISHED_LENGTH
    elif reason is FinishReason.STOP:
        request.status = RequestStatus.FINISHED_STOPPED
    return RequestOutput(
        request_id=request.request_id,
        new_token_ids=(token_id,),
        finished=reason is not None,
        finish_reason=reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=len(request.output_token_ids),
        num_cached_tokens=request.num_cached_tokens or 0,
        is_first_token=len(request.output_token_ids) == 1,
    )


def _prompt_done(request: EngineRequest) -> RequestOutput:
    """A prompt-only request (embeddings, rerank) ends once its prompt is computed: no token drawn."""
    request.status = RequestStatus.FINISHED_STOPPED
    return RequestOutput(
        request_id=request.request_id,
        new_token_ids=(),
        finished=True,
        finish_reason=FinishReason.STOP,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=0,
        num_cached_tokens=request.num_cached_tokens or 0,
        is_first_token=True,  # its prompt is done: where the engines count prompt tokens
    )
