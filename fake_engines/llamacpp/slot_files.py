"""POST /slots/ID?action=save|restore|erase: a slot's cached prompt to a file under --slot-save-path
and back, or dropped (llama-server's post_slots and its SLOT_SAVE / SLOT_RESTORE / SLOT_ERASE
tasks, tools/server/server-context.cpp).

The file is laid out as llama_state_seq_save_file writes it: magic `ggsq`, version, the number of
32-bit words that follow, then server_tokens' packed state (LLAMA_TOKEN_NULL, state version 1, the
token count, the tokens, no media). The real file then holds the sequence's KV tensors; the
look-alike has none to write, so its files end there (n_written is their size). A restore reads
that packed state or a plain token list (files of older servers), puts the tokens in the slot's
cache, and a later prompt sharing them reuses them as after the original request.

An action on a busy slot waits until the slot is idle, as llama-server defers the task.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from typing import TYPE_CHECKING

from aiohttp import web

from fake_engines.core import VOCAB_SIZE, LlamaCppScheduler
from fake_engines.driver.serving import json_body
from fake_engines.llamacpp.errors import LlamaError, parse_json

STATE_MAGIC = 0x67677371  # 'ggsq': LLAMA_STATE_SEQ_MAGIC
STATE_VERSION = 2  # LLAMA_STATE_SEQ_VERSION
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: marks server_tokens' packed state
TOKENS_STATE_VERSION = 1  # SERVER_TOKENS_STATE_VERSION
if TYPE_CHECKING:
    from fake_engines.core._slot import Slot

BUSY_POLL_S = 0.005
"""How often an action on a busy slot looks again."""


class SlotFileError(ValueError):
    """A slot file that cannot be restored; the message is llama-server's."""


def pack_slot_file(tokens: list[int]) -> bytes:
    """What a save writes for a slot holding `tokens`."""
    payload = [TOKEN_NULL, TOKENS_STATE_VERSION, len(tokens), *tokens, 0]  # 0: no media chunks
    return struct.pack(f"<III{len(payload)}i", STATE_MAGIC, STATE_VERSION, len(payload), *payload)


def unpack_slot_file(data: bytes, has_mmproj: bool = False) -> list[int]:
    """The tokens of a slot file (packed state or a plain token list); SlotFileError as llama-server
    words it."""
    if len(data) < 12:
        raise SlotFileError("No available space in KV cache or invalid slot save file")
    magic, version, n_words = struct.unpack_from("<III", data)
    if magic != STATE_MAGIC or version != STATE_VERSION or len(data) < 12 + 4 * n_words:
        raise SlotFileError("No available space in KV cache or invalid slot save file")
    words = list(struct.unpack_from(f"<{n_words}i", data, 12))
    if not words or words[0] != TOKEN_NULL:
        return words  # a plain token list, as written by older versions
    if len(words) < 3 or words[1] != TOKENS_STATE_VERSION:
        raise SlotFileError("Unsupported server tokens state version")
    n_tokens = words[2]
    tokens, rest = words[3:3 + n_tokens], words[3 + n_tokens:]
    if len(tokens) < n_tokens or not rest:
        raise SlotFileError("Server tokens state is truncated")
    if rest[0] != 0 and not has_mmproj:
        raise SlotFileError("Cannot restore media tokens without an mmproj")
    if rest[0] != 0:
        raise SlotFileError("Cannot load media chunk from server tokens state")
    if len(rest) > 1:
        raise SlotFileError("Trailing data in server tokens state")
    return tokens


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename without subfolders: no separators, no `..`, no control or
    Windows-reserved characters, no leading/trailing space or trailing dot, at most 255 bytes."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF) \
                or 0xD800 <= c <= 0xDFFF or ch in ':*?"<>|/\\':
            return False
    return not (name[0] == " " or name[-1] in " .") and ".." not in name and name != "."


def _filename(raw: bytes) -> str:
    """`filename` of the body; nlohmann's errors (500) when it is missing or not a string."""
    body = parse_json(raw)
    if "filename" not in body:
        raise LlamaError(500, "[json.exception.out_of_range.403] key 'filename' not found")
    name = body["filename"]
    if not isinstance(name, str):
        kind = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}.get(type(name), "null")
        raise LlamaError(500, f"[json.exception.type_error.302] type must be string, but is {kind}")
    if not valid_filename(name):
        raise LlamaError(400, "Invalid filename")
    return name


async def _idle_slot(core: LlamaCppScheduler, id_slot: int) -> Slot:
    slot = core.slot_by_id(id_slot)
    if slot is None:
        raise LlamaError(400, "Invalid slot ID")
    while slot.is_processing:
        await asyncio.sleep(BUSY_POLL_S)
    return slot


def _save(core: LlamaCppScheduler, slot: Slot, id_slot: int, path: str, name: str) -> dict:
    start = time.perf_counter()
    data = pack_slot_file(slot.cache_tokens)
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError:
        raise LlamaError(500, "Unable to save slot") from None
    return {"id_slot": id_slot, "filename": name, "n_saved": len(slot.cache_tokens), "n_written": len(data),
            "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}


def _restore(core: LlamaCppScheduler, slot: Slot, id_slot: int, path: str, name: str) -> dict:
    start = time.perf_counter()
    try:
        with open(path, "rb") as f:
            data = f.read()
        tokens = unpack_slot_file(data)
        if len(tokens) > slot.n_ctx:
            raise SlotFileError("Restored prompt does not fit in the slot context")
        if any(not 0 <= t < VOCAB_SIZE for t in tokens):
            raise SlotFileError("Invalid tokens in slot save file")
        if not core.load_slot(slot, tokens):
            raise SlotFileError("No available space in KV cache or invalid slot save file")
    except (OSError, SlotFileError) as exc:
        core.erase_slot(slot)  # a failed restore leaves the slot empty and usable
        reason = str(exc) if isinstance(exc, SlotFileError) else "No available space in KV cache or invalid slot save file"
        raise LlamaError(400, f"Unable to restore slot: {reason}") from None
    return {"id_slot": id_slot, "filename": name, "n_restored": len(tokens), "n_read": len(data),
            "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}


async def slot_action(request: web.Request) -> web.Response:
    """POST /slots/{id_slot}?action=save|restore|erase."""
    from fake_engines.llamacpp.app import SERVER_KEY

    server = request.app[SERVER_KEY]
    folder = server.config.slot_save_path
    if folder is None:
        raise LlamaError(501, "This server does not support slots action. Start it with `--slot-save-path`")
    try:
        id_slot = _stoi(request.match_info["id_slot"])
    except ValueError:
        raise LlamaError(400, "Invalid slot ID") from None
    action = request.query.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise LlamaError(400, "Invalid action")
    core = server.driver.core
    assert isinstance(core, LlamaCppScheduler)  # a llama-server runs slots
    if action == "erase":
        slot = await _idle_slot(core, id_slot)
        return json_body({"id_slot": id_slot, "n_erased": core.erase_slot(slot)})
    name = _filename(await request.read())
    slot = await _idle_slot(core, id_slot)
    path = os.path.join(folder, name)
    return json_body((_save if action == "save" else _restore)(core, slot, id_slot, path, name))


def _stoi(text: str) -> int:
    """std::stoi: leading whitespace and sign, then digits; what follows them is ignored."""
    digits = text.lstrip()
    sign = digits[:1] if digits[:1] in "+-" else ""
    body = digits[len(sign):]
    n = len(body) - len(body.lstrip("0123456789"))
    if n == 0:
        raise ValueError(text)
    return int(sign + body[:n])
