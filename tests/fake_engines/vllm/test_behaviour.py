"""What a router or autoscaler sees of the fake vLLM under load: queueing, prefix hits, preemption,
disconnects, LoRA batching, cold start and refusal to start."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.engine import ModelDoesNotFit
from fake_engines.vllm.server import start_vllm
from tests.conftest import Serve
from tests.fake_engines.scrape import fetch_text_on, samples, value
from tests.waiting import wait_until


def _config(**overrides) -> VllmServeConfig:
    base = {"model": "llama-3.1-8b", "served_model_name": "m", "port": 0, "time_scale": 1.0, "max_model_len": 4096}
    return VllmServeConfig(**{**base, **overrides})


async def _complete(session, base, prompt, max_tokens, model="m", stream=False) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    async with session.post(base + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.json() if not stream else {"text": await resp.text()}


@pytest.fixture
def served(serve: Serve):
    """served(config) -> the base URL of a warm look-alike vLLM, closed when the test ends."""
    return lambda config: serve(start_vllm(config, cold_start=False))


def _check_gauge_invariants(text: str, max_num_seqs: int) -> None:
    assert value(text, "vllm:num_requests_running") <= max_num_seqs
    assert 0.0 <= value(text, "vllm:kv_cache_usage_perc") <= 1.0
    assert value(text, "vllm:prefix_cache_hits_total") <= value(text, "vllm:prefix_cache_queries_total")


async def test_300_concurrent_requests_with_256_seqs_leave_44_waiting(served):
    base = await served(_config(max_num_seqs=256, time_scale=1.0))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(_complete(session, base, f"request {i:04d} " * 4, 256)) for i in range(300)]

        async def settled() -> tuple[float, float, float] | None:
            text = await fetch_text_on(session, base)
            _check_gauge_invariants(text, 256)
            running, waiting = value(text, "vllm:num_requests_running"), value(text, "vllm:num_requests_waiting")
            if running + waiting == 300 and running == 256:  # every request arrived and admission settled
                return running, waiting, value(text, "vllm:num_requests_waiting_by_reason", reason="capacity")
            return None

        seen = await wait_until(settled, poll_s=0.005, what="all 300 requests arrived and admission settled")
        await asyncio.gather(*tasks)
        text = await fetch_text_on(session, base)
    assert seen == (256, 44, 44)
    assert value(text, "vllm:request_success_total", finished_reason="length") == 300
    assert value(text, "vllm:num_requests_running") == 0


async def test_repeated_long_prompt_hits_its_full_blocks_and_gets_a_shorter_ttft(served):
    base = await served(_config(max_model_len=16384, enable_prompt_tokens_details=True))
    prompt = "".join(f"{i:07d} " for i in range(4001))  # 32008 characters = 8002 tokens of 4 characters
    async with aiohttp.ClientSession() as session:
        before = await fetch_text_on(session, base)
        first = await _complete(session, base, prompt, 1)
        middle = await fetch_text_on(session, base)
        second = await _complete(session, base, prompt, 1)
        after = await fetch_text_on(session, base)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 8000}
    hits = [value(t, "vllm:prefix_cache_hits_total") for t in (before, middle, after)]
    assert hits[1] - hits[0] == 0
    assert hits[2] - hits[1] == 8002 // 16 * 16
    ttft = [value(t, "vllm:time_to_first_token_seconds_sum") for t in (before, middle, after)]
    assert ttft[2] - ttft[1] < (ttft[1] - ttft[0]) / 2


async def test_small_kv_cache_preempts_and_still_finishes_every_request(served):
    base = await served(_config(num_gpu_blocks_override=64, max_model_len=1024, time_scale=0.05))
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*[_complete(session, base, f"{i:03d} " * 100, 400) for i in range(8)])
        text = await fetch_text_on(session, base)
    assert all(r["usage"]["completion_tokens"] == 400 for r in results)
    assert value(text, "vllm:num_preemptions_total") > 0
    assert value(text, "vllm:request_success_total", finished_reason="length") == 8


async def test_client_disconnect_aborts_counts_tokens_and_no_success(served):
    base = await served(_config(time_scale=1.0))
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "prompt": "hello " * 10, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        resp = await session.post(base + "/v1/completions", json=body)
        events = 0
        async for line in resp.content:
            events += line.startswith(b"data: ")
            if events == 20:
                break
        resp.close()  # drop the connection mid-stream

        async def idle() -> str | None:
            text = await fetch_text_on(session, base)
            return text if value(text, "vllm:num_requests_running") == 0 else None

        # the request would run 2,000 tokens; fewer generated (below) proves it was aborted early
        text = await wait_until(idle, what="the request aborted after the client left")
    generated = value(text, "vllm:generation_tokens_total")
    assert 20 <= generated < 2000
    assert value(text, "vllm:request_success_total") == 0
    assert value(text, "vllm:kv_cache_usage_perc") == 0.0


async def test_mixed_lora_traffic_shares_steps_up_to_max_loras(served, tmp_path):
    base = await served(_config(enable_lora=True, max_loras=2, time_scale=0.5,
                                lora_modules={"lora-a": str(tmp_path), "lora-b": str(tmp_path)}))
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_complete(session, base, "hi " * 8, 200, model=m))
                 for m in ("lora-a", "lora-b", "lora-a", "lora-b")]
        combos = set()
        while not all(t.done() for t in tasks):
            text = await fetch_text_on(session, base)
            combos |= {lab["running_lora_adapters"] for n, lab, _ in samples(text) if n == "vllm:lora_requests_info"}
            await asyncio.sleep(0.01)  # sampling interval while the requests run, not a wait
        results = [t.result() for t in tasks]
        text = await fetch_text_on(session, base)
    assert "lora-a,lora-b" in combos
    assert [r["model"] for r in results] == ["lora-a", "lora-b", "lora-a", "lora-b"]
    assert value(text, "vllm:request_success_total", model_name="m") == 4


async def test_lora_info_lists_a_running_adapter_as_waiting_too_with_series_in_the_captured_order(served, tmp_path):
    """vLLM 0.32 lists every adapter with a live request in both labels (capture lora/018 and 019:
    running_lora_adapters="lora-a",waiting_lora_adapters="lora-a" while lora-a runs), and keeps
    old series in the order they were first set."""
    base = await served(_config(enable_lora=True, max_loras=2, time_scale=0.5,
                                lora_modules={"lora-a": str(tmp_path), "lora-b": str(tmp_path)}))

    def lora_series(text: str) -> list[tuple[str, str]]:
        return [(lab["running_lora_adapters"], lab["waiting_lora_adapters"]) for n, lab, _ in samples(text)
                if n == "vllm:lora_requests_info"]

    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(_complete(session, base, "hi " * 8, 200, model="lora-a"))
        seen = False
        while not task.done():
            seen = seen or ("lora-a", "lora-a") in lora_series(await fetch_text_on(session, base))
            await asyncio.sleep(0.01)  # sampling interval while the request runs, not a wait
        await task
        await _complete(session, base, "hi " * 8, 20, model="lora-b")
        series = lora_series(await fetch_text_on(session, base))
    assert seen
    assert series == [("lora-a", "lora-a"), ("", ""), ("lora-b", "lora-b")]


async def test_runtime_lora_load_and_unload_answer_in_vllm_words(tmp_path, monkeypatch, served):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    base = await served(_config(enable_lora=True, time_scale=0.01))
    async with aiohttp.ClientSession() as session:
        load = {"lora_name": "lora-b", "lora_path": str(tmp_path)}
        async with session.post(base + "/v1/load_lora_adapter", json=load) as resp:
            assert (resp.status, await resp.text()) == (200, "Success: LoRA adapter 'lora-b' added successfully.")
        async with session.post(base + "/v1/load_lora_adapter", json=load) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["type"] == "InvalidUserInput"
        async with session.get(base + "/v1/models") as resp:
            cards = (await resp.json())["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards] == [("m", None, "llama-3.1-8b"),
                                                                      ("lora-b", "m", str(tmp_path))]
        async with session.post(base + "/v1/unload_lora_adapter", json={"lora_name": "lora-b"}) as resp:
            assert (resp.status, await resp.text()) == (200, "Success: LoRA adapter 'lora-b' removed successfully.")
        async with session.post(base + "/v1/unload_lora_adapter", json={"lora_name": "lora-b"}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["message"] == "The lora adapter 'lora-b' cannot be found."


async def test_cold_start_refuses_connections_then_health_is_200_with_empty_body():
    running = await start_vllm(_config(time_scale=0.02, startup_s=5.0, warmup_s=10.0))
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", running.port)
        assert not running.ready.is_set()
        await running.wait_ready()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{running.port}/health") as resp:
                assert resp.status == 200 and await resp.read() == b""
    finally:
        await running.close()
    # 16.06 GB of weights at 5 GB/s + 5 s start-up + 10 s warm-up
    assert running.server.spec.cold_start_s == pytest.approx(15.0 + 8.03e9 * 2 / 5e9)


async def test_70b_bf16_on_one_h100_refuses_to_start_in_vllm_words():
    with pytest.raises(ModelDoesNotFit, match="CUDA out of memory"):
        await start_vllm(_config(model="llama-3.1-70b", gpu="h100"))



async def test_api_key_guards_the_v1_routes_only(served):
    base = await served(_config(api_key="sekrit", time_scale=0.01))
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/v1/models") as resp:
            assert (resp.status, await resp.json()) == (401, {"error": "Unauthorized"})
        async with session.get(base + "/v1/models", headers={"Authorization": "Bearer sekrit"}) as resp:
            assert resp.status == 200
        async with session.get(base + "/health") as resp:
            assert resp.status == 200


async def test_data_parallel_engines_share_the_load_and_label_their_series(served):
    base = await served(_config(data_parallel_size=2, time_scale=0.5))
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_complete(session, base, f"{i} hello", 100)) for i in range(4)]
        busy = set()
        while not all(t.done() for t in tasks):
            text = await fetch_text_on(session, base)
            busy |= {e for e in ("0", "1") if value(text, "vllm:num_requests_running", engine=e) == 2}
            await asyncio.sleep(0.01)  # sampling interval while the requests run, not a wait
        await asyncio.gather(*tasks)
        text = await fetch_text_on(session, base)
    assert busy == {"0", "1"}
    assert [value(text, "vllm:request_success_total", engine=e) for e in ("0", "1")] == [2, 2]
    assert {lab["engine"] for n, lab, _ in samples(text) if n == "vllm:cache_config_info"} == {"0", "1"}


async def test_sigterm_drain_finishes_in_flight_requests_and_refuses_new_connections():
    running = await start_vllm(_config(time_scale=0.2), cold_start=False)
    await running.wait_ready()
    base = f"http://127.0.0.1:{running.port}"
    async with aiohttp.ClientSession() as session:
        in_flight = asyncio.create_task(_complete(session, base, "hello " * 4, 200))
        await wait_until(lambda: _running_one(session, base), what="the request in flight")
        draining = asyncio.create_task(running.drain_and_close())
        await wait_until(lambda: _refuses(running.port), what="the listener closed on drain")
        result = await in_flight
        await draining
    assert result["usage"]["completion_tokens"] == 200


async def _running_one(session: aiohttp.ClientSession, base: str) -> bool:
    return value(await fetch_text_on(session, base), "vllm:num_requests_running") == 1


async def _refuses(port: int) -> bool:
    """Whether a new connection to the port is refused."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:  # caught in the backlog of a listener being closed: not refused yet
        return False
    writer.close()
    return False
