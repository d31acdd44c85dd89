"""Media parts of OpenAI content arrays on a server without a multimodal projector (no --mmproj): llama-server's
oaicompat_content_load_media (server-common.cpp, build 0c1e570) refuses each image, audio and video part with a
runtime_error, which its handlers answer as 500 server_error, and any part type it does not know with 400."""

from __future__ import annotations

from fake_engines.llamacpp.errors import LlamaError

_HINT = "input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}
"""Content part type -> the modality it needs a projector for."""


def content_text(parts: list) -> str:
    """The text of a content array's parts, in order; the server's error for a media part (the look-alike
    loads no projector) or an unknown part type."""
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        kind = kind if isinstance(kind, str) else ""  # json_value: a missing or mistyped type reads as ""
        if kind in MEDIA_PARTS:
            raise LlamaError(500, f"{MEDIA_PARTS[kind]} {_HINT}")
        if kind != "text":
            raise LlamaError(400, "unsupported content[].type")
    return "".join(p["text"] for p in parts if isinstance(p.get("text"), str))


def check_message_media(message: object) -> None:
    """A chat message whose content array holds media: refused as llama-server refuses it without --mmproj (the
    other part checks are chat_checks.py's)."""
    content = message.get("content") if isinstance(message, dict) else None
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind in MEDIA_PARTS:
            raise LlamaError(500, f"{MEDIA_PARTS[kind]} {_HINT}")
