"""Chat templates as llama-server applies them (common/chat.cpp, build 0c1e570): the one place that turns
chat messages into prompt text for /v1/chat/completions, /apply-template and /v1/messages.

With Jinja (the default; --no-jinja turns it off) the template is the model's `tokenizer.chat_template`,
or --chat-template / --chat-template-file, rendered by the `jinja2` library with the globals and filters
llama.cpp's own Jinja engine gives templates (raise_exception, strftime_now, a tojson that keeps
non-ASCII and takes indent/separators, trim_blocks and lstrip_blocks on). The variables are llama.cpp's:
messages (normalised to what the template can read), tools, bos_token, eos_token, add_generation_prompt,
enable_thinking, date_string, datetime, the chat_template_kwargs. Without Jinja the template is one
of llama.cpp's built-in formats (fake_engines/llamacpp/builtin_templates.py).

Assistant prefill / continue_final_message render all but the last message, then the generation
prompt, then the last message's text, as llama.cpp's autoparser builds it.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from fake_engines.factory.llamacpp_chat_flags import REASONING_FORMATS
from fake_engines.llamacpp import builtin_templates as builtin
from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.errors import LlamaError

CHATML_TEMPLATE_SRC = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}")
"""common/chat.cpp's CHATML_TEMPLATE_SRC: what a model without a template (or `--chat-template chatml`) gets."""


class TemplateError(ServerConfigError):
    """A template llama-server would refuse at start; the message says why."""


@dataclass(frozen=True)
class ChatOptions:
    """How one request asks for its prompt (the parts of the body besides messages and tools)."""

    add_generation_prompt: bool = True
    """Open the assistant's turn after the messages."""
    continue_final: str = ""
    """"" (no), "content", "reasoning" or "auto": continue the last (assistant) message instead."""
    enable_thinking: bool | None = None
    """None: the server's default (--reasoning and the template's support)."""
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """chat_template_kwargs of the request, laid over --chat-template-kwargs."""


@dataclass(frozen=True)
class TemplateSettings:
    """The flags that choose and drive the template (LlamaServerConfig's fields of the same names)."""

    chat_template: str | None = None
    """--chat-template (a built-in name or Jinja source) or --chat-template-file's text."""
    jinja: bool = True
    """--jinja / --no-jinja."""
    reasoning: str = "auto"
    """-rea/--reasoning: on, off or auto."""
    template_kwargs: Mapping[str, str] = field(default_factory=dict)
    """--chat-template-kwargs, each value JSON text."""
    prefill_assistant: bool = True
    """A final assistant message is continued (--no-prefill-assistant: closed)."""


class ChatTemplates:
    """The server's template, chosen at start as common_chat_templates_init does."""

    def __init__(self, settings: TemplateSettings, model_template: str | None, bos_token: str = "<s>",
                 eos_token: str = "</s>", tool_use_template: str | None = None) -> None:
        tool_use_template = None if settings.chat_template else tool_use_template  # an override replaces both
        source = settings.chat_template or model_template or tool_use_template or ""
        self.source = CHATML_TEMPLATE_SRC if source in ("", "chatml") else source
        """The template /props reports."""
        self.jinja = settings.jinja
        self.prefill_assistant = settings.prefill_assistant
        self.bos_token, self.eos_token = bos_token, eos_token
        self.kwargs: dict[str, Any] = _default_kwargs(settings)
        self.builtin = builtin.detect(self.source)
        if not self.jinja and (self.builtin is None or builtin.apply(self.builtin, [("user", "test")], True) is None):
            raise TemplateError(f"the supplied chat template is not supported: {source}\nnote: llama.cpp was "
                                f"started without --jinja, we only support commonly used templates")
        # llama.cpp parses the source as Jinja and analyses it even without --jinja (/props shows the caps)
        self._program = _compile(self.source)
        self.caps = _caps(self)
        self.supports_thinking = self.jinja and self._supports_thinking()
        self.enable_thinking = settings.reasoning != "off" and self.supports_thinking
        self.tool_use: ChatTemplates | None = None
        """The model's `tool_use` variant (tokenizer.chat_template.tool_use): it renders requests with tools."""
        if tool_use_template and self.jinja:
            self.tool_use = ChatTemplates(settings, tool_use_template, bos_token, eos_token)
            self.tool_use.enable_thinking = self.enable_thinking  # the server decides it on the default one

    def render(self, messages: list, tools: list | None = None, options: ChatOptions | None = None) -> str:
        """The prompt text of `messages` (OpenAI chat messages, already validated) with `tools`."""
        options = options or ChatOptions()
        if tools and self.tool_use is not None:
            return self.tool_use.render(messages, tools, options)
        if not self.jinja:
            return self._render_builtin(messages, options)
        msgs = [_message_json(m) for m in messages]
        last = msgs.pop() if options.continue_final and msgs else None
        add_generation = options.add_generation_prompt and last is None
        prompt = self._render_jinja(msgs, tools, options, add_generation)
        if last is None:
            return prompt
        generation = self._generation_prompt(msgs, tools, options)
        return prompt + generation + _continued_text(messages[-1])

    def _render_builtin(self, messages: list, options: ChatOptions) -> str:
        chat = [(str(m.get("role", "")), _flat_text(m.get("content"), "\n")) for m in messages]
        add_ass = options.add_generation_prompt and not options.continue_final
        return builtin.apply(self.builtin or "chatml", chat, add_ass) or ""

    def _generation_prompt(self, msgs: list[dict], tools: list | None, options: ChatOptions) -> str:
        """What add_generation_prompt adds after `msgs` (common_chat_template_generation_prompt)."""
        without = self._render_jinja(msgs, tools, options, False)
        with_prompt = self._render_jinja(msgs, tools, options, True)
        common = 0
        while common < min(len(without), len(with_prompt)) and without[common] == with_prompt[common]:
            common += 1
        return with_prompt[common:]

    def _render_jinja(self, msgs: list[dict], tools: list | None, options: ChatOptions, add_generation: bool,
                      thinking: bool | None = None) -> str:
        context = self._context(msgs, tools, options, add_generation, thinking)
        try:
            text = self._program.render(**context)
        except LlamaError:
            raise
        except Exception as exc:  # a template's raise_exception, or its own mistake: runtime_error there
            raise LlamaError(500, str(exc)) from None
        # the vocabulary adds BOS when the prompt is tokenized, so a template's own is dropped (add_bos)
        return text[len(self.bos_token):] if self.bos_token and text.startswith(self.bos_token) else text

    def _context(self, msgs: list[dict], tools: list | None, options: ChatOptions, add_generation: bool,
                 thinking: bool | None) -> dict[str, Any]:
        enable = thinking if thinking is not None else \
            self.enable_thinking if options.enable_thinking is None else options.enable_thinking
        context: dict[str, Any] = {"messages": _normalised(msgs, self.caps), "bos_token": self.bos_token,
                                   "eos_token": self.eos_token, "enable_thinking": enable}
        if tools:
            context["tools"] = [_tool_json(t) for t in tools]
        now = datetime.datetime.now()
        context.update({"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")})
        kwargs = {**self.kwargs, **options.template_kwargs}
        if thinking is not None:
            kwargs.pop("enable_thinking", None)
        context.update(kwargs)
        if add_generation:
            context["add_generation_prompt"] = True
        if isinstance(kwargs.get("preserve_reasoning"), bool):  # caps_apply_preserve_reasoning
            keep = kwargs["preserve_reasoning"]
            context.update({"preserve_thinking": keep, "clear_thinking": not keep,
                            "truncate_history_thinking": not keep, "drop_thinking": not keep})
        if isinstance(kwargs.get("reasoning_effort"), str) and kwargs["reasoning_effort"]:
            context["reasoning_strength"] = kwargs["reasoning_effort"]
        return context

    def _supports_thinking(self) -> bool:
        """Whether enable_thinking changes the generation prompt of one user message (the autoparser
        finds reasoning by rendering the template both ways)."""
        probe = [{"role": "user", "content": "test"}]
        try:
            on = self._render_jinja(probe, None, ChatOptions(), True, thinking=True)
            off = self._render_jinja(probe, None, ChatOptions(), True, thinking=False)
        except LlamaError:
            return False
        return on != off

    def props_caps(self) -> dict[str, bool]:
        """/props chat_template_caps."""
        return dict(sorted(self.caps.items()))

    def tool_use_props(self) -> dict[str, str]:
        """/props's chat_template_tool_use when the model has that variant (llama-server adds it last)."""
        return {} if self.tool_use is None else {"chat_template_tool_use": self.tool_use.source}


def templates_for(config: LlamaServerConfig, model_template: str | None,
                  tool_use_template: str | None = None) -> ChatTemplates:
    """The server's templates from its flags and the model's own templates."""
    return ChatTemplates(TemplateSettings(chat_template=config.chat_template, jinja=config.jinja,
                                          reasoning=config.reasoning, template_kwargs=dict(config.chat_template_kwargs),
                                          prefill_assistant=config.prefill_assistant), model_template,
                         tool_use_template=tool_use_template)


def body_prompt(templates: ChatTemplates, body: dict) -> str:
    """The prompt of an OpenAI chat body whose messages passed chat_checks.check_chat_body, as
    oaicompat_chat_params_parse reads it: tools, add_generation_prompt, continue_final_message (or
    the prefill of a final assistant message), chat_template_kwargs, reasoning_effort."""
    tools = body.get("tools")
    if not templates.jinja:
        if isinstance(tools, list) and tools:
            raise LlamaError(500, "tools param requires --jinja flag")
        if body.get("tool_choice", "auto") != "auto":
            raise LlamaError(500, "tool_choice param requires --jinja flag")
    return templates.render(body["messages"], tools if isinstance(tools, list) else None,
                            chat_options(body, templates.prefill_assistant))


def chat_options(body: dict, prefill_assistant: bool = True) -> ChatOptions:
    """The ChatOptions of a chat body (its contradictions were refused by check_chat_body)."""
    messages = body.get("messages") or []
    value = body.get("continue_final_message")
    continue_final = "auto" if value is True else {"content": "content", "reasoning_content": "reasoning"}.get(
        value if isinstance(value, str) else "", "")
    add_generation = body.get("add_generation_prompt", True) is not False
    last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    if not continue_final and prefill_assistant and last_role == "assistant":
        continue_final, add_generation = "auto", False
    if "reasoning_format" in body and body["reasoning_format"] not in REASONING_FORMATS:
        raise LlamaError(500, f"Unknown reasoning format: {body['reasoning_format']}")
    kwargs = body.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    thinking = kwargs.get("enable_thinking")
    if isinstance(thinking, str):
        raise LlamaError(400, 'invalid type for "enable_thinking" (expected boolean, got string)')
    enable = thinking if isinstance(thinking, bool) else None
    effort = body.get("reasoning_effort")
    if effort == "none":
        enable = False
        kwargs.pop("reasoning_effort", None)
    elif isinstance(effort, str) and effort:
        kwargs["reasoning_effort"] = effort
    return ChatOptions(add_generation_prompt=add_generation, continue_final=continue_final, enable_thinking=enable,
                       template_kwargs=kwargs)


DEFAULT_CAPS = {"supports_object_arguments": False, "supports_parallel_tool_calls": True,
                "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
                "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": True,
                "supports_tools": True, "supports_typed_content": False}
"""common/jinja/caps.h's defaults, before a template is analysed."""


def _default_kwargs(settings: TemplateSettings) -> dict[str, Any]:
    """--chat-template-kwargs and what --reasoning adds (enable_thinking), with preserve_reasoning
    on unless given (common/arg.cpp)."""
    kwargs = {k: json.loads(v) for k, v in settings.template_kwargs.items()}
    if settings.reasoning in ("on", "off"):
        kwargs["enable_thinking"] = settings.reasoning == "on"
    kwargs.setdefault("preserve_reasoning", True)
    return kwargs


def _message_json(message: dict) -> dict:
    """common_chat_msg::to_json_oaicompat: role, content ("" when absent or null), then the optional fields."""
    out: dict[str, Any] = {"role": message.get("role")}
    content = message.get("content")
    if isinstance(content, list) and content:
        out["content"] = [{"type": p.get("type"), "text": p.get("text")} for p in content]
    else:
        out["content"] = content if isinstance(content, str) else ""
    for key in ("reasoning_content", "name", "tool_call_id"):
        if message.get(key):
            out[key] = message[key]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call_json(c) for c in calls]
    return out


def _tool_call_json(call: dict) -> dict:
    function = call.get("function") or {}
    args = function.get("arguments")
    out: dict[str, Any] = {"type": "function", "function": {
        "name": function.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args)}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def _tool_json(tool: dict) -> dict:
    """common_chat_tools_to_json_oaicompat: name, description ("" if absent), parameters."""
    function = tool.get("function") or {}
    return {"type": "function", "function": {"name": function.get("name"),
                                             "description": function.get("description", ""),
                                             "parameters": function.get("parameters", {})}}


def _normalised(msgs: list[dict], caps: Mapping[str, bool]) -> list[dict]:
    """messages_inp_normalizer plus the workarounds common_chat_templates_apply_jinja applies: typed
    content flattened for templates that read strings only (or wrapped for typed-only ones), developer
    read as system, a system message merged into the next for templates without a system role."""
    only_string = caps["supports_string_content"] and not caps["supports_typed_content"]
    only_typed = caps["supports_typed_content"] and not caps["supports_string_content"]
    out = []
    for msg in msgs:
        msg = dict(msg)
        if only_string and isinstance(msg["content"], list):
            msg["content"] = _flat_text(msg["content"], "\n")
        elif only_typed and isinstance(msg["content"], str):
            msg["content"] = [{"type": "text", "text": msg["content"]}]
        if msg["role"] == "developer":
            msg["role"] = "system"
        if caps["supports_object_arguments"] and "tool_calls" in msg:  # workaround::func_args_not_string
            msg["tool_calls"] = [_object_arguments(c) for c in msg["tool_calls"]]
        out.append(msg)
    if not caps["supports_system_role"] and out and out[0]["role"] == "system":
        first = out.pop(0)
        if out:
            out[0] = {**out[0], "content": f"{first['content']}\n{out[0]['content']}"}
    return out


def _object_arguments(call: dict) -> dict:
    """A tool call whose string arguments are parsed into the object a template reads."""
    args = call["function"]["arguments"]
    if not isinstance(args, str):
        return call
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError as exc:
        raise LlamaError(500, f"Failed to parse tool call arguments as JSON: {exc}") from None
    return {**call, "function": {**call["function"], "arguments": parsed}}


def _flat_text(content: object, delimiter: str) -> str:
    """Typed content's text parts joined (common_chat_msg's flattening); a string as it is."""
    if isinstance(content, list):
        return delimiter.join(str(p.get("text", "")) for p in content
                              if isinstance(p, dict) and p.get("type") in ("text", "media_marker"))
    return content if isinstance(content, str) else ""


def _continued_text(message: dict) -> str:
    """The continued message's text: common_chat_msg::render_content joins text parts with a blank line."""
    return _flat_text(message.get("content"), "\n\n")


def _caps(templates: ChatTemplates) -> dict[str, bool]:
    """What the template reads, found by rendering probes and looking for them in the output (llama.cpp
    tracks which inputs a render touched; seeing them in the text is the observable part of that)."""
    caps = dict(DEFAULT_CAPS)
    probe = "STRING_MARKER"

    def rendered(msgs: list[dict], tools: list | None = None) -> str | None:
        context = {"messages": msgs, "bos_token": "", "eos_token": "", "add_generation_prompt": True,
                   "tools": tools or []}
        try:
            return templates._program.render(**context)
        except Exception:
            return None

    def shows(msgs: list[dict], tools: list | None = None, text: str = probe) -> bool:
        out = rendered(msgs, tools)
        return out is not None and text in out

    string = rendered([{"role": "user", "content": probe}])
    typed_out = rendered([{"role": "user", "content": [{"type": "text", "text": probe}]}]) or ""
    # a template that prints the list itself (its repr) shows the probe without reading the parts
    typed = probe in typed_out and "'type'" not in typed_out and '"type"' not in typed_out
    caps["supports_typed_content"] = typed
    caps["supports_string_content"] = string is not None and (probe in string or not typed)
    caps["supports_system_role"] = bool(shows([{"role": "system", "content": probe},
                                               {"role": "user", "content": "User message"}]))
    tool = {"type": "function", "function": {"name": "tool1", "description": "Tool description", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
        "required": ["arg"]}}}
    def call_with(arguments: object) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "tool_call_name", "arguments": arguments}}]}

    call = call_with("{}")
    caps["supports_tools"] = bool(shows([{"role": "user", "content": "User message"}], [tool], "tool1"))
    caps["supports_tool_calls"] = bool(shows([{"role": "user", "content": "User message"}, call,
                                              {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"}],
                                             [tool], "tool_call_name"))
    object_call = call_with({"arg": "ARG_MARKER"})
    with_object = rendered([{"role": "user", "content": "User message"}, object_call,
                            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"}], [tool]) or ""
    # printing the argument (tojson of the object included) reads it; a Python repr of the dict does not
    caps["supports_object_arguments"] = "ARG_MARKER" in with_object and "{'arg'" not in with_object
    caps["supports_tool_calls"] = caps["supports_tool_calls"] or "tool_call_name" in with_object
    caps["supports_parallel_tool_calls"] = caps["supports_tool_calls"]
    caps["supports_preserve_reasoning"] = any(v in templates.source for v in (
        "preserve_thinking", "clear_thinking", "truncate_history_thinking", "drop_thinking"))
    caps["supports_reasoning_effort"] = "reasoning_effort" in templates.source
    return caps


@cache
def _environment():
    """The Jinja environment llama.cpp's engine amounts to (see the module docstring)."""
    from jinja2 import ext
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols],
                               undefined=_lenient_undefined())
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    return env


@cache
def _compile(source: str):
    from jinja2 import TemplateError as JinjaTemplateError

    try:
        return _environment().from_string(source)
    except JinjaTemplateError as exc:
        raise TemplateError(f"the supplied chat template is not supported: {exc}") from None


@cache
def _lenient_undefined() -> type:
    """llama.cpp's undefined: attributes of it are undefined too and it adds as nothing (a template
    that appends an unset `functions` to a string still renders)."""
    from jinja2 import ChainableUndefined

    class LenientUndefined(ChainableUndefined):
        def __add__(self, other: object) -> object:  # type: ignore[override]
            return other

        def __radd__(self, other: object) -> object:  # type: ignore[override]
            return other

    return LenientUndefined


def _raise_exception(message: str) -> None:
    raise LlamaError(500, f"Jinja Exception: {message}")


def _strftime_now(fmt: str) -> str:
    """The local time as strftime formats it (llama.cpp uses std::localtime)."""
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: list[str] | tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """llama.cpp's tojson: JSON without HTML escaping, non-ASCII kept unless ensure_ascii, `, ` and `: `
    separators (`,` between items when indented)."""
    if sort_keys:
        raise LlamaError(500, "tojson sort_keys=true not implemented")
    item_sep = separators[0] if separators else ("," if indent is not None else ", ")
    key_sep = separators[1] if separators and len(separators) > 1 else ": "
    return json.dumps(_plain(value), ensure_ascii=ensure_ascii, indent=indent, separators=(item_sep, key_sep))


def _plain(value: object) -> object:
    """Jinja's Undefined and other template values as JSON can hold them."""
    from jinja2 import Undefined

    if isinstance(value, Undefined):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
