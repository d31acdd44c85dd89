"""The chat template both look-alikes apply: ChatML, as the captured engines' model used."""

from __future__ import annotations

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")
"""The Jinja source, as /props reports it."""


def _content(message: object) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def chat_prompt(messages: list, add_generation_prompt: bool = True) -> str:
    """Render messages the way CHATML_TEMPLATE does."""
    parts = []
    for message in messages:
        role = message.get("role", "user") if isinstance(message, dict) else "user"
        parts.append(f"<|im_start|>{role}\n{_content(message)}<|im_end|>\n")
    return "".join(parts) + ("<|im_start|>assistant\n" if add_generation_prompt else "")
