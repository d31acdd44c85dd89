"""How llama-server draws a request's text: its seed and prompt, `grammar`, `json_schema`,
`response_format` and `logit_bias`, read and refused as llama-server reads them
(tools/server/server-common.cpp oaicompat_chat_params_parse, server-schema.cpp), turned into the
engine core's `Sampling` (the text itself comes from the core's pure generators)."""

from __future__ import annotations

import hashlib
import math
import random
import struct
from dataclasses import dataclass

from fake_engines.core import VOCAB_SIZE, OutputLengthSampler, Sampling, decode, encode
from fake_engines.core._generator import biased_words
from fake_engines.core._grammar import Grammar, GrammarError, generate, parse_grammar
from fake_engines.core._json_schema import SchemaError, schema_text, schema_value
from fake_engines.llamacpp.errors import LlamaError

EOS_TOKEN_ID = 2
"""The end-of-generation token of the catalogue's llama models (`</s>`): ignore_eos biases it to -inf."""

GRAMMAR_ERROR = "Failed to initialize samplers: failed to parse grammar"
"""llama-server's 400 when the grammar does not parse (the parser's own message goes to its log)."""


@dataclass(frozen=True)
class Constraints:
    """What shapes one request's text besides the prompt."""

    grammar: Grammar | None = None
    """The parsed grammar (from `grammar`)."""
    grammar_text: str = ""
    """The grammar as sent (generation_settings.grammar)."""
    schema: object = None
    """The JSON schema (from `json_schema` or `response_format`), already checked; None: none."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs as llama-server keeps them (-inf for `false`)."""
    bias_texts: tuple[tuple[str, float], ...] = ()
    """The same biases by text (a token's text or the string given), for the generator's words."""


def _bias_value(value: object) -> float | None:
    if isinstance(value, bool):
        return -math.inf if value is False else None
    return float(value) if isinstance(value, int | float) else None


def _bias_entries(key: object, bias: float, by_key_string: bool) -> list[tuple[int, str]]:
    """Token ids (and the text each stands for) a logit_bias key names: an id in the vocabulary,
    or a string, tokenized (a dict key that is all digits is an id)."""
    if isinstance(key, str) and by_key_string and key.lstrip("-").isdigit():
        key = int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return [(key, decode([key]))] if 0 <= key < VOCAB_SIZE else []
    if isinstance(key, str):
        return [(t, decode([t])) for t in encode(key)] + [(-1, key)]  # -1: the string itself, for the words
    return []


def parse_logit_bias(body: dict) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[str, float], ...]]:
    """`logit_bias` as a list of [token or string, bias] or an object {token or string: bias}."""
    raw = body.get("logit_bias")
    pairs: list[tuple[object, object, bool]] = []
    if isinstance(raw, list):
        pairs = [(el[0], el[1], False) for el in raw if isinstance(el, list) and len(el) == 2]
    elif isinstance(raw, dict):
        pairs = [(k, v, True) for k, v in raw.items()]
    ids: list[tuple[int, float]] = []
    texts: list[tuple[str, float]] = []
    for key, value, from_object in pairs:
        bias = _bias_value(value)
        if bias is None:
            continue
        for token, text in _bias_entries(key, bias, from_object):
            if token >= 0:
                ids.append((token, bias))
            texts.append((text, bias))
    return tuple(ids), tuple(texts)


def _chat_schema(body: dict) -> object:
    """The schema a chat request asks for: `json_schema`, or `response_format`'s (llama-server's rules)."""
    schema = body.get("json_schema")
    if schema is not None and body.get("grammar"):
        raise LlamaError(500, "Cannot use both json_schema and grammar")
    if "response_format" in body:
        response_format = body["response_format"] if isinstance(body["response_format"], dict) else {}
        kind = response_format.get("type") if isinstance(response_format.get("type"), str) else ""
        if kind == "json_object":
            if "schema" in response_format or not schema:
                schema = response_format.get("schema", {})
        elif kind == "json_schema":
            wrapper = response_format.get("json_schema")
            schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        elif kind and kind != "text":
            raise LlamaError(400, "response_format type must be one of \"text\" or \"json_object\", but got: " + kind)
    tools = body.get("tools")
    if isinstance(tools, list) and tools and body.get("tool_choice", "auto") != "none" and "grammar" in body:
        raise LlamaError(400, "Cannot use custom grammar constraints with tools.")
    return schema


def parse_constraints(body: dict, kind: str) -> Constraints:
    """The request's grammar, schema and logit bias; LlamaError where llama-server refuses them."""
    ids, texts = parse_logit_bias(body)
    schema = _chat_schema(body) if kind == "chat" else (body.get("json_schema") if not body.get("grammar") else None)
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}  # an empty schema means any object
    if schema is not None:
        try:
            schema_value(schema, random.Random(0))  # refuse now what the converter refuses
        except SchemaError as exc:
            message = f"JSON schema conversion failed:\n{exc}"
            raise LlamaError(400, message if kind == "chat" else f"\"json_schema\": {message}") from None
        return Constraints(schema=schema, logit_bias=ids, bias_texts=texts)
    grammar_text = body.get("grammar")
    if isinstance(grammar_text, str) and grammar_text:
        try:
            return Constraints(grammar=parse_grammar(grammar_text), grammar_text=grammar_text, logit_bias=ids,
                               bias_texts=texts)
        except GrammarError:
            raise LlamaError(400, GRAMMAR_ERROR) from None
    return Constraints(logit_bias=ids, bias_texts=texts)


RANDOM_SEEDS = (-1, 0xFFFFFFFF)
"""LLAMA_DEFAULT_SEED as a request or -s gives it: a fresh random seed for each request."""


def sampling_key(seed: int, sampled: bool, prompt_ids: list[int], sample: int = 0, request_id: str = "") -> str:
    """What a request's draws are seeded from: the seed and the prompt, as llama-server's sampler
    (a greedy request, temperature 0, depends on the prompt only; seed -1 draws anew per request,
    from its id); `sample` tells apart the choices of one `n` > 1 request."""
    if sampled and seed in RANDOM_SEEDS:
        return f"random/{request_id}"
    digest = hashlib.blake2b(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids), digest_size=16).hexdigest()
    return f"{seed if sampled else 'greedy'}/{sample}/{digest}"


def plan(constraints: Constraints, key: str, budget: int, ignore_eos: bool,
         mean_output_tokens: float) -> tuple[Sampling, int]:
    """The core's Sampling for a request and its output length before EOS: a constrained text
    ends after its last token, free text after a seeded geometric draw (ignore_eos: the budget)."""
    rng = random.Random(key + "/constrained")
    text = None
    if constraints.schema is not None:
        text = schema_text(constraints.schema, rng)
    elif constraints.grammar is not None:
        text = generate(constraints.grammar, rng)
    words = biased_words(list(constraints.bias_texts)) if constraints.bias_texts else None
    if text:
        planned = tuple(encode(text))
        return Sampling(key, planned, words), budget if ignore_eos else len(planned)
    length_seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    length = OutputLengthSampler(seed=length_seed, mean_output_tokens=mean_output_tokens).sample(budget, ignore_eos)
    return Sampling(key, (), words), length


def settings_logit_bias(constraints: Constraints, ignore_eos: bool) -> list[dict]:
    """generation_settings.logit_bias: {"bias", "token"} per entry, -inf written as null; ignore_eos
    adds the end-of-generation token at -inf."""
    entries = list(constraints.logit_bias) + ([(EOS_TOKEN_ID, -math.inf)] if ignore_eos else [])
    return [{"bias": None if math.isinf(bias) else bias, "token": token} for token, bias in entries]
