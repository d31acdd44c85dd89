"""vLLM's error bodies, in its own words (status, type, message and param as captured).

vLLM validates requests in two layers: pydantic (type "Bad Request", message "1 validation
error: ...", param "body.<field>") and the serving code (type "BadRequestError" or
"NotFoundError", message ending in "(parameter=..., value=...)").
"""

from __future__ import annotations

import json

from aiohttp import web


class VllmError(Exception):
    """An error vLLM reports as {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict:
        """The JSON envelope vLLM sends."""
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}

    def response(self) -> web.Response:
        """The HTTP response carrying the envelope."""
        return web.json_response(self.body(), status=self.status)


def _describe_input(value: object) -> str:
    if isinstance(value, dict):
        return f"'<dict of {len(value)} items>'"
    if value is None:
        return "'None'"
    return repr(value)


def validation_error(err: str, loc: str, msg: str, value: object, ctx: str = "") -> VllmError:
    """A pydantic validation failure as vLLM's FastAPI layer formats it."""
    detail = f"{{'type': '{err}', 'loc': '{loc}', 'msg': '{msg}', 'input': {_describe_input(value)}{ctx}}}"
    return VllmError(400, f"1 validation error:\n  {detail}", "Bad Request", loc)


def bad_request(message: str, param: str, value: object = None) -> VllmError:
    """A serving-layer 400 with vLLM's '(parameter=..., value=...)' suffix."""
    suffix = f"(parameter={param})" if value is None else f"(parameter={param}, value={value})"
    return VllmError(400, f"{message} {suffix}", "BadRequestError", param)


def model_not_found(model: str, served_name: str) -> VllmError:
    """404 for a model name that is neither the served name nor a loaded adapter."""
    return VllmError(404, f"The model `{model}` does not exist. Valid aliases: {served_name}.", "NotFoundError",
                     "model")


def parse_json_body(raw: bytes) -> dict:
    """The request JSON, or the 400 pydantic reports for an empty or malformed body."""
    if not raw.strip():
        raise validation_error("missing", "body", "Field required", None)
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        ctx = f", 'ctx': {{'error': {exc.msg!r}}}"
        raise validation_error("json_invalid", f"body.{exc.pos}", "JSON decode error", {}, ctx) from None
    if not isinstance(body, dict):
        raise validation_error("model_attributes_type", "body", "Input should be a valid dictionary", body)
    return body


_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f"}


def lax_bool(body: dict, name: str, default: bool = False) -> bool:
    """Pydantic's lax boolean: "yes" and 1 are true, so stream:"yes" streams as on vLLM."""
    value = body.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise validation_error("bool_parsing", f"body.{name}", "Input should be a valid boolean, unable to "
                           "interpret input", value)


def optional_number(body: dict, name: str) -> float | None:
    """A float field; strings that do not parse give pydantic's float_parsing error."""
    value = body.get(name)
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise validation_error("float_parsing", f"body.{name}",
                           "Input should be a valid number, unable to parse string as a number", value)


def optional_int(body: dict, name: str) -> int | None:
    """An integer field (max_tokens, n, seed)."""
    value = body.get(name)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise validation_error("int_parsing", f"body.{name}",
                           "Input should be a valid integer, unable to parse string as an integer", value)


def check_max_tokens(max_tokens: int | None, max_model_len: int) -> None:
    """vLLM's bounds on max_tokens, before the prompt length is known."""
    if max_tokens is None:
        return
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if max_tokens > max_model_len:
        raise bad_request(f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                          "Please request fewer output tokens.", "max_tokens", max_tokens)


def check_temperature(temperature: float | None) -> None:
    """Negative temperatures are refused."""
    if temperature is not None and temperature < 0:
        raise bad_request(f"temperature must be non-negative, got {float(temperature)}.", "temperature",
                          float(temperature))


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """Prompt alone, then prompt plus max_tokens, against max_model_len."""
    if prompt_tokens >= max_model_len:
        # vLLM truncates tokenisation at max_model_len + 1, hence "at least".
        shown = min(prompt_tokens, max_model_len + 1)
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains at "
            f"least {shown} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.", "input_tokens", shown)
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}).", "max_tokens", max_tokens)
