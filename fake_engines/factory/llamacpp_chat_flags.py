"""llama-server's chat-template flags: which template renders chat messages (--chat-template,
--chat-template-file, --jinja/--no-jinja), what it is told (--reasoning, --chat-template-kwargs),
--prefill-assistant, and --verbose (responses carry `__verbose`).

They shape prompts, never the engine, so they live apart from the engine's flags; the config fields
keep the values and fake_engines/llamacpp/templates.py renders with them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

REASONING = ("on", "off", "auto")
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def add_chat_flags(p: argparse.ArgumentParser) -> None:
    """The flags, each spelled as llama-server spells it."""
    g = p.add_argument_group("chat template")
    g.add_argument("--chat-template", default=None, metavar="JINJA_TEMPLATE",
                   help="Jinja template source, or a built-in name (chatml, llama3, command-r, ...) "
                        "(default: the model's tokenizer.chat_template)")
    g.add_argument("--chat-template-file", default=None, metavar="JINJA_TEMPLATE_FILE",
                   help="read the template from this file")
    g.add_argument("--jinja", dest="jinja", action="store_true", default=True,
                   help="render templates with Jinja (default: enabled)")
    g.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="use llama.cpp's built-in formats, recognised by name or by the template's markers")
    g.add_argument("-rea", "--reasoning", default="auto", metavar="[on|off|auto]",
                   help="thinking: on, off, or auto (the template decides)")
    g.add_argument("--reasoning-format", default="auto", metavar="FORMAT",
                   help=f"how thoughts are returned: {', '.join(REASONING_FORMATS)}")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="token budget for thinking: -1 unrestricted, 0 immediate end")
    g.add_argument("--chat-template-kwargs", default=None, metavar="STRING",
                   help="extra template variables, a JSON object")
    g.add_argument("--prefill-assistant", dest="prefill_assistant", action="store_true", default=True,
                   help="a final assistant message is continued, not closed (default)")
    g.add_argument("--no-prefill-assistant", dest="prefill_assistant", action="store_false",
                   help="a final assistant message is a whole message")
    g.add_argument("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true",
                   help="responses carry `__verbose` (the rendered prompt among it)")


def chat_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LlamaServerConfig fields of these flags; --chat-template-file is read here, as llama.cpp
    reads it while parsing arguments."""
    template = args.chat_template
    if args.chat_template_file is not None:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except OSError as exc:
            raise _error(f"--chat-template-file: cannot read {args.chat_template_file}: {exc.strerror}") from None
    return {"chat_template": template, "jinja": args.jinja, "reasoning": _reasoning(args.reasoning),
            "reasoning_format": _reasoning_format(args.reasoning_format), "reasoning_budget": _budget(args.reasoning_budget),
            "chat_template_kwargs": _kwargs(args.chat_template_kwargs), "prefill_assistant": args.prefill_assistant,
            "verbose": args.verbose}


def _reasoning(value: str) -> str:
    """common/arg.cpp's is_truthy / is_falsey / is_autoy."""
    if value in ("on", "enabled", "true", "1"):
        return "on"
    if value in ("off", "disabled", "false", "0"):
        return "off"
    if value in ("auto", "-1"):
        return "auto"
    raise _error(f"--reasoning: unknown value '{value}' (on, off or auto)")


def _reasoning_format(value: str) -> str:
    """common_reasoning_format_from_name: the value is checked when the flag is read, not by the parser."""
    if value not in REASONING_FORMATS:
        raise _error(f"--reasoning-format: Unknown reasoning format: {value}")
    return value


def _budget(value: int) -> int:
    if value < -1:
        raise _error("--reasoning-budget: invalid value")
    return value


def _kwargs(text: str | None) -> tuple[tuple[str, str], ...]:
    """The object's items, each value as JSON text (how llama.cpp keeps them)."""
    if text is None:
        return ()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(f"--chat-template-kwargs: not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise _error("--chat-template-kwargs must be a JSON object")
    return tuple((k, json.dumps(v)) for k, v in parsed.items())


def _error(message: str) -> Exception:
    from fake_engines.factory.llamacpp_config import ServerConfigError  # it imports this module

    return ServerConfigError(message)
