"""/infill as llama-server serves it (server-context.cpp's post_infill, server-common.cpp's
format_prompt_infill, build 0c1e570): the fill-in-the-middle prompt is assembled from input_extra,
input_prefix, prompt and input_suffix, then generated like a native /completion.

The look-alike's FIM vocabulary has the prefix, suffix and middle tokens and no repo or file
separator tokens, so extra chunks are joined with llama-server's plain-text snippet separator.
"""

from __future__ import annotations

from aiohttp import web

from fake_engines.core import encode
from fake_engines.llamacpp.app import SERVER_KEY
from fake_engines.llamacpp.errors import LlamaError, parse_json
from fake_engines.llamacpp.vocab import BOS_ID, tokenize_mixed

FIM_PRE, FIM_SUF, FIM_MID = 3, 4, 5
"""Ids of the FIM prefix, suffix and middle tokens in a vocabulary that has them (after <unk>, <s>, </s>)."""
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
"""What precedes each extra chunk when the vocabulary has no file separator token."""


def check_fim(has_fim: bool) -> None:
    """501 for a model without FIM tokens, naming each missing one as llama-server does."""
    if not has_fim:
        missing = "prefix token is missing. suffix token is missing. middle token is missing. "
        raise LlamaError(501, f"Infill is not supported by this model: {missing}")


def check_input_extra(body: dict) -> list[dict]:
    """input_extra as a list of {"text": str, "filename"?: str} chunks, else llama-server's 400."""
    extra = body.get("input_extra")
    if "input_extra" in body and not isinstance(extra, list):
        raise LlamaError(400, "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}")
    for chunk in extra or []:
        fields = chunk if isinstance(chunk, dict) else {}
        if not isinstance(fields.get("text"), str):
            raise LlamaError(400, "extra_context chunk must contain a \"text\" field with a string value")
        if "filename" in fields and not isinstance(fields["filename"], str):
            raise LlamaError(400, "extra_context chunk's \"filename\" field must be a string")
    return extra or []


def _part(body: dict, key: str) -> list[int]:
    """input_prefix / input_suffix: required (json::at fails otherwise: 500), a string or mixed ids."""
    if key not in body:
        raise LlamaError(500, f"[json.exception.out_of_range.403] key '{key}' not found")
    value = body[key]
    if not isinstance(value, str | list):
        raise LlamaError(500, "[json.exception.type_error.302] type must be string, but is number")
    return tokenize_mixed(value, add_special=False)


def infill_prompt(body: dict, extra: list[dict], n_batch: int, n_predict: int, n_ctx: int, spm: bool) -> list[int]:
    """format_prompt_infill: the extra chunks that fit, then prefix (3/4 of a batch, its end kept),
    prompt and suffix (what is left of a quarter batch) in PSM order, or SPM with --spm-infill."""
    prefix, suffix = _part(body, "input_prefix"), _part(body, "input_suffix")
    prompt = body.get("prompt")
    prompt_ids = encode(prompt) if isinstance(prompt, str) else []  # json_value: not a string -> ""
    extra_ids: list[int] = []
    for chunk in extra:
        extra_ids += encode(CHUNK_SEPARATOR) + encode(chunk["text"])
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [FIM_PRE, *prefix[len(prefix) - n_prefix:], *prompt_ids]
    tail = [FIM_SUF, *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    return [*extra_ids[len(extra_ids) - n_extra:], BOS_ID, *first, *second, FIM_MID]


async def infill(request: web.Request) -> web.StreamResponse:
    """POST /infill: a native completion of the assembled FIM prompt."""
    from fake_engines.llamacpp import routes

    server = request.app[SERVER_KEY]
    check_fim(server.model.spec.fim)
    body = parse_json(await request.read())
    extra = check_input_extra(body)
    config = server.config
    n_predict = getattr(config, "n_predict", -1)  # --n-predict where the config has it
    ids = infill_prompt(body, extra, config.n_batch, n_predict, server.slot_n_ctx, config.spm_infill)
    return await routes.serve(request, {**body, "prompt": ids}, "native")
