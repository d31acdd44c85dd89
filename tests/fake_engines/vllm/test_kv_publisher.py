"""The look-alike vLLM's KV-cache events over real ZMQ sockets from a running `fake-vllm serve`
(a subprocess), read by a subscriber written from vLLM's example (kv_subscriber.py): stored blocks
carry the prompt's tokens in block order with chained parent hashes, evictions and clears are
published, replay returns missed batches, and the events add up to what the cache holds."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fake_engines.vllm.kv_subscriber import AllBlocksCleared, BlockRemoved, BlockStored, Subscriber

BLOCK = 16


@dataclass
class Fake:
    proc: subprocess.Popen
    url: str
    endpoint: str
    replay_endpoint: str


def _serve(args: list[str], kv_config: dict, dev_mode: bool = True) -> subprocess.Popen:
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1" if dev_mode else "0")
    return subprocess.Popen(
        [sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--served-model-name", "tiny",
         "--port", "0", "--time-scale", "0.01", "--startup-seconds", "0", "--warmup-seconds", "0",
         "--kv-events-config", json.dumps(kv_config), *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_url(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"Uvicorn running on (http://\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError(f"fake-vllm exited (rc={proc.wait()}) before serving")


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Iterator[Fake]:
    sockets = tmp_path_factory.mktemp("kv")
    endpoint, replay = f"ipc://{sockets}/pub.sock", f"ipc://{sockets}/replay.sock"
    # 12 blocks of 16 tokens (11 usable): a few prompts evict each other's blocks
    proc = _serve(["--block-size", str(BLOCK), "--num-gpu-blocks-override", "12", "--max-model-len", "160"],
                  {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
                   "replay_endpoint": replay, "topic": "kv-events", "buffer_steps": 1000})
    try:
        yield Fake(proc, _wait_url(proc), endpoint, replay)
    finally:
        assert _stop(proc) == 0


@pytest.fixture
def subscriber(fake: Fake) -> Iterator[Subscriber]:
    """A subscriber that already receives: ZMQ's slow joiner misses what is published before its
    subscription reaches the publisher, so requests that store a block go out until one arrives."""
    sub = Subscriber(fake.endpoint, fake.replay_endpoint)
    try:
        for attempt in range(30):
            _complete(fake, f"joining {id(sub)} {attempt}: " + "j k l " * 8, max_tokens=1)
            if sub.poll(quiet_s=0.5):
                break
        else:
            raise AssertionError("the subscriber never received a batch")
        yield sub
    finally:
        sub.close()


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _complete(fake: Fake, prompt: str, max_tokens: int = 2) -> dict:
    return _post(fake.url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                               "ignore_eos": True})


def _tokens(fake: Fake, prompt: str) -> list[int]:
    return _post(fake.url, "/tokenize", {"model": "tiny", "prompt": prompt})["tokens"]


def _cached(fake: Fake) -> set[int]:
    with urllib.request.urlopen(fake.url + "/debug/kv_cache", timeout=30) as response:
        return set(json.loads(response.read())["block_hashes"])


def _all_events(sub: Subscriber, fake: Fake) -> list:
    """Every batch the engine published so far, from the replay buffer (nothing missed)."""
    return [event for _, _, batch in sub.replay(0) for event in batch.events]


def _held(events: list) -> set[int]:
    """Apply events as a router's index must: a hash stays while any block holding it stays."""
    count: Counter[int] = Counter()
    for event in events:
        if isinstance(event, AllBlocksCleared):
            count.clear()
        elif isinstance(event, BlockStored):
            count.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            count.subtract(event.block_hashes)
    return {h for h, n in count.items() if n > 0}


def test_stored_blocks_carry_the_prompts_tokens_in_block_order_with_chained_parents(fake, subscriber):
    prompt = "stored blocks: " + "alpha beta gamma delta " * 12
    tokens = _tokens(fake, prompt)
    _complete(fake, prompt)
    batches = subscriber.wait_for(lambda got: any(isinstance(e, BlockStored) and e.token_ids[:BLOCK] == tokens[:BLOCK]
                                                  for _, b in got for e in b.events))
    stored = [e for _, b in batches for e in b.events if isinstance(e, BlockStored)]
    first = next(i for i, e in enumerate(stored) if e.token_ids[:BLOCK] == tokens[:BLOCK])
    mine = stored[first:]
    assert mine[0].parent_block_hash is None, "a new prompt's first block has no parent"
    hashes, full = [h for e in mine for h in e.block_hashes], len(tokens) // BLOCK * BLOCK
    assert len(hashes) * BLOCK >= full, "every full block of the prompt is stored"
    assert [t for e in mine for t in e.token_ids][:full] == tokens[:full], "the prompt's tokens in block order"
    for event in mine:
        assert len(event.token_ids) == BLOCK * len(event.block_hashes) and event.block_size == BLOCK
        assert event.medium == "GPU" and event.lora_id is None
    for earlier, later in zip(mine, mine[1:], strict=False):
        assert later.parent_block_hash == earlier.block_hashes[-1], "each event chains to the block before it"
    assert set(hashes[:len(tokens) // BLOCK]) <= _cached(fake), "the published hashes are the cache's own"


def test_a_prefix_hit_stores_nothing_new_for_the_cached_blocks(fake, subscriber):
    prompt = "prefix hit: " + "one two three four " * 10
    _complete(fake, prompt, max_tokens=1)
    subscriber.poll(quiet_s=0.5)
    before = {h for _, b in subscriber.received for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes}
    _complete(fake, prompt, max_tokens=1)
    after = subscriber.poll(quiet_s=0.5)
    again = [h for _, b in after for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert not set(again) & before


def test_evictions_are_published_and_the_events_add_up_to_the_cache(fake, subscriber):
    first = "eviction victim: " + "red green blue " * 12
    _complete(fake, first)
    victim = set(_cached(fake))
    for i in range(4):  # each fills most of the 11 usable blocks, so older blocks go
        _complete(fake, f"evictor {i}: " + f"word{i} other{i} " * 20)
    events = _all_events(subscriber, fake)
    removed = {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
    assert victim & removed, "evicting a cached block publishes BlockRemoved with its hash"
    assert all(e.medium == "GPU" for e in events if isinstance(e, BlockRemoved))
    assert _held(events) == _cached(fake), "stores minus removals equal the prefix cache's contents"


def test_reset_prefix_cache_publishes_all_blocks_cleared_with_the_next_step(fake, subscriber):
    _complete(fake, "before the reset: " + "x y z " * 20)
    assert _cached(fake)
    assert _post(fake.url, "/reset_prefix_cache", {}) == {"success": True}
    assert not _cached(fake)
    _complete(fake, "after the reset: " + "p q r " * 20)
    batches = subscriber.wait_for(lambda got: any(isinstance(e, AllBlocksCleared) for _, b in got for e in b.events))
    clear_batch = next(b for _, b in batches if any(isinstance(e, AllBlocksCleared) for e in b.events))
    assert isinstance(clear_batch.events[0], AllBlocksCleared), "the clear comes before the next step's stores"
    assert _held(_all_events(subscriber, fake)) == _cached(fake)


def test_replay_returns_the_missed_batches_in_order(fake):
    _complete(fake, "published before anyone listened: " + "m n o " * 20)
    late = Subscriber(fake.endpoint, fake.replay_endpoint)
    try:
        replayed = late.replay(0)
        seqs = [seq for _, seq, _ in replayed]
        assert seqs == list(range(len(seqs))) and seqs, "every kept batch from 0, in order"
        assert {topic for topic, _, _ in replayed} == {b"kv-events"}
        tail = late.replay(seqs[-1])
        assert [seq for _, seq, _ in tail] == [seqs[-1]], "a replay starts at the asked sequence number"
        assert late.replay(seqs[-1] + 1000) == [], "nothing kept from there: only the end marker"
    finally:
        late.close()


def test_a_connecting_publisher_reaches_a_subscriber_that_binds(tmp_path):
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    proc = _serve(["--block-size", str(BLOCK), "--max-model-len", "256"],
                  {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}, dev_mode=False)
    try:
        fake = Fake(proc, _wait_url(proc), "", "")
        got: list[list[bytes]] = []
        for attempt in range(20):  # the connection may still be coming up: send until one arrives
            _complete(fake, f"connect mode {attempt}: " + "a b c d " * 12)
            if sub.poll(2000):
                got.append(sub.recv_multipart())
                break
        assert got, "no batch reached the bound subscriber"
        topic, seq, payload = got[0]
        assert topic == b"" and len(seq) == 8 and payload[0] == 0x93
    finally:
        assert _stop(proc) == 0
        sub.close(linger=0)
        ctx.term()


def test_a_taken_replay_port_is_a_one_line_error_with_exit_status_2():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        proc = _serve([], {"enable_kv_cache_events": True, "endpoint": "inproc://kv",
                           "replay_endpoint": f"tcp://127.0.0.1:{port}"})
        out, _ = proc.communicate(timeout=120)
    finally:
        taken.close()
    assert proc.returncode == 2
    assert "Traceback" not in out
    assert re.search(rf"ERROR: --kv-events-config: cannot bind tcp://127.0.0.1:{port}: Address already in use", out)


@pytest.mark.parametrize(("config", "message"), [
    ('{"enable_kv_cache_events": true, "bogus": 1}', "unknown field 'bogus'"),
    ('{"publisher": "kafka"}', "publisher must be one of null, zmq"),
    ('{"buffer_steps": "x"}', "buffer_steps must be int"),
    ("{not json", "not JSON"),
])
def test_an_unusable_kv_events_config_is_a_one_line_error_with_exit_status_2(config: str, message: str):
    run = subprocess.run([sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b",
                          "--kv-events-config", config], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 2


def test_dev_routes_exist_only_in_dev_mode(tmp_path: Path):
    proc = _serve(["--max-model-len", "256"], {"enable_kv_cache_events": True, "publisher": "null"}, dev_mode=False)
    try:
        url = _wait_url(proc)
        for method, path in (("POST", "/reset_prefix_cache"), ("GET", "/debug/kv_cache")):
            request = urllib.request.Request(url + path, data=b"{}" if method == "POST" else None, method=method)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=30)
            assert err.value.code == 404
    finally:
        assert _stop(proc) == 0
