"""The real vLLM KV-cache event stream captured in tests/data (issue 23 item 4) is the reference
for the look-alike's stream: ZMQ multipart messages (topic, 8-byte big-endian sequence number,
msgpack payload) whose payload is `[ts, [event, ...], data_parallel_rank]` with tagged events.
The look-alike (issue 18) serves the reference's scenario and the same capture script records it."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from flotilla.kv_events import decode_batch, encode_batch
from tests.conftest import REPO
from tests.fake_engines.vllm.kv_capture import REFERENCE, key_sets, read_jsonl
from tests.fake_engines.vllm.kv_subscriber import DECODER, ExampleKVEventBatch

CAPTURE = REPO / "scripts" / "interop" / "capture_kv_events.py"


def lines(name: str) -> list[dict]:
    return read_jsonl(REFERENCE / name)


def test_the_reference_capture_is_framed_as_vllm_publishes_it():
    frames, decoded = lines("frames.jsonl"), lines("decoded.jsonl")
    assert frames and len(frames) == len(decoded)
    seqs = []
    for frame, message in zip(frames, decoded, strict=True):
        topic, seq, payload = (base64.b64decode(f) for f in frame["frames_b64"])
        assert topic == b"kv-events" == message["topic"].encode()
        assert len(seq) == 8 and int.from_bytes(seq, "big", signed=True) == message["seq"]
        assert payload[0] == 0x93, "msgpack fixarray of 3: [ts, events, data_parallel_rank]"
        seqs.append(message["seq"])
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_the_reference_events_have_vllms_shapes():
    stored = [e for m in lines("decoded.jsonl") for e in m["batch"][1] if e["type"] == "BlockStored"]
    assert stored
    for event in stored:
        assert {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_name", "medium"} <= set(event)
        assert len(event["token_ids"]) == event["block_size"] * len(event["block_hashes"])
    assert {e["lora_name"] for e in stored} >= {None, "lora-a"}


def test_vllms_example_structs_cannot_read_032s_map_encoded_events():
    """Why the test subscriber drops the example's array_like=True: real 0.32 sends events as maps."""
    payload = base64.b64decode(lines("frames.jsonl")[0]["frames_b64"][2])
    with pytest.raises(msgspec.ValidationError, match="Expected `array`, got `object`"):
        msgspec.msgpack.Decoder(ExampleKVEventBatch).decode(payload)
    assert DECODER.decode(payload).events


@pytest.fixture(scope="module")
def lookalike_capture(tmp_path_factory) -> Path:
    """The look-alike serving the reference's scenario (tiny-llama, adapter lora-a, 128-token
    blocks, topic kv-events), captured by the same script that captured the real engine."""
    out = tmp_path_factory.mktemp("kv-capture")
    endpoint = f"ipc://{out}/kv.sock"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv-events"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--served-model-name", "tiny-llama",
         "--enable-lora", "--lora-modules", "lora-a=/models/lora-a", "--block-size", "128", "--max-model-len", "2048",
         "--port", "0", "--time-scale", "0.01", "--startup-seconds", "0", "--warmup-seconds", "0",
         "--kv-events-config", json.dumps(config)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in proc.stdout:
            match = re.search(r"Uvicorn running on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, f"fake-vllm exited (rc={proc.wait()})"
        run = subprocess.run([sys.executable, str(CAPTURE), url, endpoint, str(out)], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    return out


def test_the_lookalike_publishes_the_same_framing_encoding_and_event_shapes(lookalike_capture: Path):
    frames = [json.loads(x) for x in (lookalike_capture / "frames.jsonl").read_text().splitlines()]
    live = [json.loads(x) for x in (lookalike_capture / "decoded.jsonl").read_text().splitlines()]
    assert live, "the look-alike published no event"
    assert [m["seq"] for m in live] == list(range(len(live))), "sequence numbers from 0, by one"
    for frame, message in zip(frames, live, strict=True):
        topic, seq, payload = (base64.b64decode(f) for f in frame["frames_b64"])
        assert topic == b"kv-events" and len(seq) == 8 and payload[0] == 0x93
        assert encode_batch(decode_batch(payload)) == payload, "the encoding vLLM's structs give, byte for byte"
        assert isinstance(message["batch"][0], float) and message["batch"][2] == 0
    assert key_sets(live) == key_sets(lines("decoded.jsonl")), "the same event kinds with the same fields"


def test_the_lookalike_stores_and_skips_blocks_for_the_same_requests_as_real_vllm(lookalike_capture: Path):
    live = [json.loads(x) for x in (lookalike_capture / "decoded.jsonl").read_text().splitlines()]
    for stream in (live, lines("decoded.jsonl")):
        by_request: dict[str, list[dict]] = {}
        for m in stream:
            by_request.setdefault(m["request"], []).extend(e for e in m["batch"][1] if e["type"] == "BlockStored")
        first = by_request["completion, new prompt"]
        assert first[0]["parent_block_hash"] is None and first[0]["extra_keys"] == [None] * len(first[0]["block_hashes"])
        assert not by_request.get("completion, same prompt again (prefix hit)"), "a prefix hit stores nothing"
        lora = by_request["completion, same prompt through LoRA adapter lora-a"]
        assert lora and all(e["lora_name"] == "lora-a" and e["lora_id"] == 1 for e in lora)
        assert all(keys == ["lora-a"] for e in lora for keys in e["extra_keys"])
        decode = by_request["chat, long generation (blocks filled by decode)"]
        assert len(decode) >= 2 and all(len(e["block_hashes"]) == 1 for e in decode[1:]), "decode fills a block a step"
        for earlier, later in zip(decode, decode[1:], strict=False):
            assert later["parent_block_hash"] == earlier["block_hashes"][-1]
        assert all(e["group_idx"] == 0 and e["kv_cache_spec_kind"] == "full_attention" and e["medium"] == "GPU"
                   for e in first + lora + decode)
