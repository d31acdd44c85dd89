"""POST /slots/ID?action=save|restore|erase and `id_slot` of the fake llama-server over real sockets."""

from __future__ import annotations

import asyncio
import struct

import aiohttp
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.llamacpp.slot_files import SlotFileError, pack_slot_file, unpack_slot_file, valid_filename
from tests.fake_engines.client import post_on

PROMPT = "the quick brown fox jumps over the lazy dog " * 6


async def _served(**overrides):
    config = LlamaServerConfig(**{"model": "llama-3.1-8b-Q4_K_M.gguf", "port": 0, "time_scale": 0.01,
                                  "n_parallel": 2, "n_ctx": 1024, **overrides})
    running = await start_llama(config, cold_start=False)
    running.server.ready = True
    return running, f"http://127.0.0.1:{running.port}"


async def _complete(session, base, prompt, id_slot) -> dict:
    status, body = await post_on(session, base + "/completion", {"prompt": prompt, "n_predict": 4,
                                                                 "id_slot": id_slot, "cache_prompt": True})
    assert status == 200
    return body


async def test_save_restore_erase_move_a_slots_cached_prompt(tmp_path):
    running, base = await _served(slot_save_path=str(tmp_path), cache_ram_mib=0)  # no host copy of prompts
    try:
        async with aiohttp.ClientSession() as s:
            first = await _complete(s, base, PROMPT, 1)
            saved = await post_on(s, base + "/slots/1?action=save", {"filename": "one.bin"})
            await _complete(s, base, "something else entirely", 1)  # slot 1 forgets the prompt
            restored = await post_on(s, base + "/slots/0?action=restore", {"filename": "one.bin"})
            again = await _complete(s, base, PROMPT, 0)
            erased = await post_on(s, base + "/slots/0?action=erase")
            after_erase = await _complete(s, base, PROMPT, 0)
    finally:
        await running.close()
    n_prompt = first["timings"]["prompt_n"]
    assert first["id_slot"] == 1 and first["timings"]["cache_n"] == 0
    status, body = saved
    assert status == 200 and body["id_slot"] == 1 and body["filename"] == "one.bin"
    assert body["n_saved"] >= n_prompt and body["n_written"] == (tmp_path / "one.bin").stat().st_size
    assert set(body["timings"]) == {"save_ms"}
    assert restored[0] == 200 and restored[1]["n_restored"] == body["n_saved"]
    assert restored[1]["n_read"] == body["n_written"] and set(restored[1]["timings"]) == {"restore_ms"}
    # the restored tokens are the slot's cache: the same prompt on slot 0 computes only its last token
    assert again["id_slot"] == 0 and again["timings"]["cache_n"] == n_prompt - 1
    assert again["timings"]["prompt_n"] == 1
    # a slot holds its prompt and what it generated but the last token (never fed back)
    assert erased == (200, {"id_slot": 0, "n_erased": n_prompt + again["timings"]["predicted_n"] - 1})
    assert after_erase["timings"]["cache_n"] == 0


async def test_slot_actions_refuse_as_llama_server_does(tmp_path):
    off, base_off = await _served()
    on, base = await _served(slot_save_path=str(tmp_path))
    (tmp_path / "junk.bin").write_bytes(b"not a slot file")
    climbing = "../escape"  # an input, not a path read
    try:
        async with aiohttp.ClientSession() as s:
            answers = [await post_on(s, base_off + "/slots/0?action=save", {"filename": "a"}),
                       await post_on(s, base + "/slots/x?action=save", {"filename": "a"}),
                       await post_on(s, base + "/slots/0?action=load", {"filename": "a"}),
                       await post_on(s, base + "/slots/0?action=save", {"filename": climbing}),
                       await post_on(s, base + "/slots/-1?action=save", {"filename": "a"}),
                       await post_on(s, base + "/slots/0?action=save", {}),
                       await post_on(s, base + "/slots/0?action=restore", {"filename": "missing.bin"}),
                       await post_on(s, base + "/slots/0?action=restore", {"filename": "junk.bin"})]
            wrapped = await post_on(s, base + "/slots/3?action=erase")  # past the last slot wraps around
    finally:
        await off.close()
        await on.close()
    statuses = [status for status, _ in answers]
    messages = [body["error"]["message"] for _, body in answers]
    assert statuses == [501, 400, 400, 400, 400, 500, 400, 400]
    assert messages[:5] == ["This server does not support slots action. Start it with `--slot-save-path`",
                            "Invalid slot ID", "Invalid action", "Invalid filename", "Invalid slot ID"]
    assert messages[5] == "[json.exception.out_of_range.403] key 'filename' not found"
    assert messages[6] == messages[7] == \
        "Unable to restore slot: No available space in KV cache or invalid slot save file"
    assert not (tmp_path.parent / "escape").exists()
    assert wrapped == (200, {"id_slot": 3, "n_erased": 0})


def test_slot_file_layout_and_the_plain_token_list_of_older_servers():
    data = pack_slot_file([5, 6, 7])
    magic, version, n_words = struct.unpack_from("<III", data)
    assert (magic, version, n_words) == (0x67677371, 2, 7)
    assert list(struct.unpack_from("<7i", data, 12)) == [-1, 1, 3, 5, 6, 7, 0]
    assert unpack_slot_file(data) == [5, 6, 7]
    legacy = struct.pack("<III3i", 0x67677371, 2, 3, 5, 6, 7)
    assert unpack_slot_file(legacy) == [5, 6, 7]
    with_media = struct.pack("<III6i", 0x67677371, 2, 6, -1, 1, 1, -1, 1, 0)
    with pytest.raises(SlotFileError, match="Cannot restore media tokens without an mmproj"):
        unpack_slot_file(with_media)
    with pytest.raises(SlotFileError, match="Unsupported server tokens state version"):
        unpack_slot_file(struct.pack("<III3i", 0x67677371, 2, 3, -1, 9, 0))


@pytest.mark.parametrize(("name", "ok"), [("slot1.bin", True), ("a b", True), ("", False), (".", False),
                                          ("a/b", False), ("a\\b", False), ("..x", False), ("x.", False),
                                          (" x", False), ("a:b", False), ("a\x01", False), ("x" * 256, False)])
def test_filenames_are_checked_as_fs_validate_filename_does(name, ok):
    assert valid_filename(name) is ok


async def test_a_request_pinned_to_a_busy_slot_waits_without_blocking_others():
    running, base = await _served(time_scale=0.2)
    try:
        async with aiohttp.ClientSession() as s:
            long = asyncio.create_task(post_on(s, base + "/completion", {"prompt": "a", "n_predict": 40,
                                                                          "ignore_eos": True, "id_slot": 0}))
            while not any(slot["is_processing"] for slot in await (await s.get(base + "/slots")).json()):
                await asyncio.sleep(0.01)
            pinned = asyncio.create_task(_complete(s, base, "b", 0))
            free = await _complete(s, base, "c", -1)
            long_done = long.done()
            first = (await long)[1]
            after = await pinned
    finally:
        await running.close()
    assert free["id_slot"] == 1 and not long_done  # served while slot 0 was busy and the pinned one waited
    assert (first["id_slot"], after["id_slot"]) == (0, 0)  # the slot that served each, though 0 moved on
