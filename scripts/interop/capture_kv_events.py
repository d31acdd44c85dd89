"""Capture a real vLLM's KV-cache event stream (`--kv-events-config`, ZMQ publisher) as the
reference for the look-alike's stream (issue 23 item 4; the look-alike side is issue 18).

Runs in the vLLM venv (pyzmq and msgspec come with vLLM). The engine must already serve the
interop model as tiny-llama with adapter lora-a, publishing on ENDPOINT (an ipc:// path: it binds, this connects; or tcp://127.0.0.1:PORT: it
connects, this binds) with topic kv-events:

    vllm serve MODELS/tiny --served-model-name tiny-llama --enable-lora \
        --lora-modules lora-a=MODELS/loras/lora-a \
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                             "endpoint": "ipc:///tmp/kv.sock", "topic": "kv-events"}'

usage: python capture_kv_events.py ENGINE_URL ENDPOINT OUT_DIR

Writes OUT_DIR/frames.jsonl: one line per ZMQ multipart message, each frame base64 as received
(topic, 8-byte big-endian sequence number, msgpack payload), with the request that caused it;
and OUT_DIR/decoded.jsonl: the same payloads decoded to plain JSON, for reading.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import zmq

PROMPT = "the quick brown fox jumps over the lazy dog " * 40  # ~ 3 blocks of 128 tokens
REQUESTS = [
    ("completion, new prompt", "/v1/completions", {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 4}),
    ("completion, same prompt again (prefix hit)", "/v1/completions",
     {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 4}),
    ("completion, same prompt through LoRA adapter lora-a", "/v1/completions",
     {"model": "lora-a", "prompt": PROMPT, "max_tokens": 4}),
    ("chat, long generation (blocks filled by decode)", "/v1/chat/completions",
     {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 300,
      "ignore_eos": True}),
]
QUIET_S = 2.0
"""A request's events are taken as complete after this long without a frame."""


def post(url: str, body: dict) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()
        return response.status


def drain(sub: zmq.Socket, label: str, frames: list[dict]) -> None:
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            frames.append({"request": label, "frames_b64": [base64.b64encode(f).decode() for f in (topic, seq, payload)]})
            deadline = time.monotonic() + QUIET_S


def main() -> None:
    engine, endpoint, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    sub = zmq.Context().socket(zmq.SUB)
    # vLLM's publisher binds wildcard and ipc:// endpoints and connects to the rest; do the other
    if "*" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        sub.connect(endpoint)
    else:
        sub.bind(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    time.sleep(1.0)  # ZMQ slow joiner: a subscription takes a moment to reach the publisher
    frames: list[dict] = []
    for label, path, body in REQUESTS:
        assert post(engine + path, body) == 200, label
        drain(sub, label, frames)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "frames.jsonl", "w") as f:
        for frame in frames:
            f.write(json.dumps(frame) + "\n")
    decoder = msgspec.msgpack.Decoder()
    with open(out / "decoded.jsonl", "w") as f:
        for frame in frames:
            topic, seq, payload = (base64.b64decode(x) for x in frame["frames_b64"])
            f.write(json.dumps({"request": frame["request"], "topic": topic.decode(),
                                "seq": int.from_bytes(seq, "big", signed=True),
                                "batch": decoder.decode(payload)}) + "\n")
    print(f"{len(frames)} messages from {endpoint} written to {out}")


if __name__ == "__main__":
    main()
