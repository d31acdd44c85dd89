"""Real vLLM's KV-cache event stream (ZMQ, msgpack) against the reference captured in tests/data,
and the router's prefix index against what a real vLLM reports as cached (issue 23 item 4).

The subscriber runs in the vLLM venv (pyzmq and msgspec come with vLLM; the project needs
neither): scripts/interop/capture_kv_events.py, the same script that made the reference."""

from __future__ import annotations

import asyncio
import random
import subprocess

import zmq
import zmq.asyncio

from flotilla.kv_events import BlockStored, decode_batch
from proxy.config import BackendSpec, KVEventsSource
from tests.conftest import REPO
from tests.fake_engines.vllm.kv_capture import REFERENCE, key_sets, read_jsonl
from tests.interop.conftest import kv_events_endpoint
from tests.interop.wire import completion_body, post, scrape, total
from tests.waiting import wait_until

CAPTURE = REPO / "scripts" / "interop" / "capture_kv_events.py"
EVENT_TYPES = {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def test_live_vllm_kv_events_match_the_reference_framing_and_shapes(interop_cache, vllm_pair, engine_logs,
                                                                    tmp_path):
    engine = vllm_pair[0]
    run = subprocess.run([str(interop_cache.vllm_venv / "bin" / "python"), str(CAPTURE), engine.url,
                          kv_events_endpoint(engine_logs), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    live, reference = read_jsonl(tmp_path / "decoded.jsonl"), read_jsonl(REFERENCE / "decoded.jsonl")
    assert live, "the engine published no event"
    seqs = [m["seq"] for m in live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers count up by one"
    assert {m["topic"] for m in live} == {"kv-events"}
    for m in live:
        ts, events, rank = m["batch"]
        assert isinstance(ts, float) and rank == 0 and {e["type"] for e in events} <= EVENT_TYPES
    for frame in read_jsonl(tmp_path / "frames.jsonl"):
        assert len(frame["frames_b64"]) == 3, "topic, sequence number, payload"
    assert key_sets(live) == key_sets(reference), "the same event shapes as the reference capture"
    stored = [e for m in live for e in m["batch"][1] if e["type"] == "BlockStored"]
    by_request = {}
    for m in live:
        by_request.setdefault(m["request"], []).extend(e for e in m["batch"][1] if e["type"] == "BlockStored")
    first = by_request["completion, new prompt"]
    assert all(e["block_size"] == 128 and len(e["token_ids"]) == 128 * len(e["block_hashes"]) for e in stored)
    assert first and first[0]["parent_block_hash"] is None, "a new prompt's first block has no parent"
    hashes = [h for e in first for h in e["block_hashes"]]
    assert len(hashes) >= 2, "the ~480-token prompt fills at least two blocks"
    for earlier, later in zip(first, first[1:], strict=False):
        assert later["parent_block_hash"] == earlier["block_hashes"][-1], "blocks chain to their parent"
    assert not by_request.get("completion, same prompt again (prefix hit)"), "a prefix hit stores no block"
    lora = by_request["completion, same prompt through LoRA adapter lora-a"]
    assert lora and all(e["lora_name"] == "lora-a" for e in lora)
    assert not set(hashes) & {h for e in lora for h in e["block_hashes"]}, "an adapter's blocks hash apart"


async def test_the_prefix_index_sends_a_repeat_where_real_vllm_has_it_cached(vllm_pair, proxy_in_front, client):
    """The router's prefix index (prefix-aware) against real vLLM: a long prompt's repeat goes to
    the engine that served it first, by the prefix-match rule, and that engine reports the hit."""
    running = await proxy_in_front(vllm_pair, policy="prefix-aware")
    prompt = "index check: " + "red green blue yellow cat house tree river " * 40
    first = await post(client, running.url, "/v1/completions", completion_body(prompt, max_tokens=2))
    again = await post(client, running.url, "/v1/completions", completion_body(prompt, max_tokens=2))
    assert first.status == again.status == 200
    assert again.backend == first.backend and again.headers["x-flotilla-rule"] == "prefix-match"
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 256, "real vLLM served whole 128-token blocks of the prompt from its cache"
    metrics = await scrape(client, running.url)
    predicted = total(metrics, "flotilla_prefix_cache_predicted_tokens_total", backend=again.backend)
    observed = total(metrics, "flotilla_prefix_cache_observed_tokens_total", backend=again.backend)
    assert observed >= cached and predicted > 0


class StoredHashes:
    """An independent subscriber to a real engine's events: every block hash it stored, in order."""

    def __init__(self, endpoint: str, topic: str = "kv-events") -> None:
        self.ctx = zmq.asyncio.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.hashes: list[int] = []
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            _topic, _seq, payload = await self.sub.recv_multipart()
            for event in decode_batch(payload).events:
                if isinstance(event, BlockStored):
                    self.hashes.extend(event.block_hashes)

    def close(self) -> None:
        self.task.cancel()
        self.sub.close(linger=0)
        self.ctx.term()


async def test_the_routers_kv_index_holds_what_real_vllm_published_and_routes_on_it(
        vllm_pair, proxy_in_front, client, engine_logs):
    """The router's KV index (precise-prefix) fed by a real vLLM's events: blocks the engine
    cached for a prompt sent to it directly (the router never saw it) are in the index under the
    engine's own hashes, and the prompt then goes through the router to that engine by the
    precise-match rule, where real vLLM reports the cache hit. Prompts are token ids: the router
    has no tokenizer of the real model (docs/routing-policies.md)."""
    holder, other = vllm_pair
    endpoint = kv_events_endpoint(engine_logs)
    backends = [BackendSpec(url=holder.url, flavor="vllm", kv_events=KVEventsSource(endpoint, topic="kv-events")),
                BackendSpec(url=other.url, flavor="vllm")]
    running = await proxy_in_front(vllm_pair, policy="precise-prefix", backends=backends)
    index = running.proxy.kv_index
    watcher = StoredHashes(endpoint)
    rng = random.Random(23)
    try:
        async def cache_directly(tokens: int) -> list[int]:
            ids = [rng.randrange(3, 500) for _ in range(tokens)]
            answer = await post(client, holder.url, "/v1/completions", completion_body(ids, max_tokens=1))
            assert answer.status == 200, answer.body[:300]
            return ids

        # ZMQ subscriptions take effect asynchronously: send fresh prompts until both subscribers see events
        async def both_listening() -> bool:
            await cache_directly(300)
            return index.size(holder.url) > 0 and bool(watcher.hashes)
        await wait_until(both_listening, 120, poll_s=0.5, what="the router and the watcher receive vLLM's events")

        before = len(watcher.hashes)
        prompt = await cache_directly(5 * 128 + 40)
        await wait_until(lambda: len(watcher.hashes) >= before + 5, 60, poll_s=0.05, what="vLLM stores 5 blocks")
        stored = set(watcher.hashes[before:])
        await wait_until(lambda: stored <= index.engine_hashes(holder.url), 60, poll_s=0.05,
                         what="the router's index holds every block vLLM stored")
        assert index.prefix_tokens(prompt) == {holder.url: 5 * 128}, "only the engine that cached it, whole blocks"

        again = await post(client, running.url, "/v1/completions", completion_body(prompt, max_tokens=1))
        assert again.status == 200 and again.backend == holder.url
        assert again.headers["x-flotilla-rule"] == "precise-match"
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 5 * 128
    finally:
        watcher.close()
