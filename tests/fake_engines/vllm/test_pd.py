"""The look-alike vLLM in disaggregated prefill/decode roles (vLLM 0.32's NixlConnector, pull
mode), over sockets: the prefill answer's kv_transfer_params, the decode side's pull (the
modelled transfer in its TTFT, only the last prompt token recomputed), the same tokens and usage
as a colocated engine, and the prefill side's held blocks freed after the pull or the lease."""

from __future__ import annotations

import aiohttp
import pytest

from fake_engines.factory.catalogue import catalogue_of
from fake_engines.factory.vllm_config import kv_transfer_config_of
from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.kv_cache import kv_bytes_per_token_per_gpu
from fake_engines.perf.kv_transfer import blocks_to_pull, kv_transfer
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from tests.conftest import Serve
from tests.fake_engines.client import post_on, stream_text_and_usage
from tests.fake_engines.scrape import fetch_text_on, value
from tests.waiting import wait_until

PROMPT = "the cat sat on the mat " * 500  # 3000 tokens (4 characters a token): 188 blocks
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""What vLLM's toy_proxy_server.py sends a prefill engine."""
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def _config(**overrides) -> VllmServeConfig:
    base = {"model": "llama-3.1-8b", "served_model_name": "m", "port": 0, "time_scale": 0.05,
            "max_model_len": 8192, "seed": 7}
    return VllmServeConfig(**{**base, **overrides})


@pytest.fixture
def served(serve: Serve):
    """served(config) -> the base URL of a warm look-alike vLLM, closed when the test ends."""
    return lambda config: serve(start_vllm(config, cold_start=False))


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict | str]:
    """A completion's status and JSON answer, or its SSE text when streamed."""
    if not body.get("stream"):
        return await post_on(session, url + "/v1/completions", body)
    async with session.post(url + "/v1/completions", json=body) as resp:
        return resp.status, await resp.text()


def _modelled_transfer_s(blocks: int, link: str) -> float:
    """The capacity model's pull time of `blocks` blocks, llama-3.1-8b's 128 KiB of bf16 KV per token."""
    model = load_catalogue().model("llama-3.1-8b")
    per_token = kv_bytes_per_token_per_gpu(model, dtype_bytes=2)
    assert per_token == 32 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (K, V) x bytes
    return kv_transfer(blocks, per_token * 16, catalogue_of().link(link)).seconds


async def test_pd_request_gives_the_colocated_tokens_and_usage_with_the_transfer_in_its_ttft(served):
    colocated = await served(_config())
    engine_id = "prefill-engine-0"
    prefill = await served(_config(kv_transfer_config=kv_transfer_config_of({**NIXL, "engine_id": engine_id})))
    decode = await served(_config(kv_transfer_config=kv_transfer_config_of(NIXL), kv_link="eth100"))
    request = {"model": "m", "prompt": PROMPT, "max_tokens": 24}
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            body = {**request, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
            status, expected = await _post(session, colocated, body)
            assert status == 200
            status, answer = await _post(session, prefill, {**request, "max_tokens": 1, "stream": False,
                                                            "kv_transfer_params": PREFILL_PARAMS})
            assert status == 200 and isinstance(answer, dict)
            params = answer["kv_transfer_params"]
            prompt_tokens = answer["usage"]["prompt_tokens"]
            assert set(params) == {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                                   "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size",
                                   "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode"}
            assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
            assert params["remote_engine_id"] == engine_id and params["transfer_mode"] == "pull"
            assert params["remote_port"] == int(prefill.rsplit(":", 1)[1]) and params["tp_size"] == 1
            assert len(params["remote_block_ids"]) == 1  # one KV cache group
            assert len(params["remote_block_ids"][0]) == -(-prompt_tokens // 16)
            assert params["remote_num_tokens"] == prompt_tokens
            held = value(await fetch_text_on(session, prefill), "vllm:kv_cache_usage_perc")
            assert held > 0  # the finished prefill's blocks wait for the pull

            status, got = await _post(session, decode, {**body, "kv_transfer_params": params})
            assert status == 200
            if stream:
                assert stream_text_and_usage(got) == stream_text_and_usage(expected)  # type: ignore[arg-type]
            else:
                assert isinstance(got, dict) and isinstance(expected, dict)
                assert got["choices"][0]["text"] == expected["choices"][0]["text"]
                assert got["usage"] == expected["usage"]
                assert got["kv_transfer_params"] is None  # a decode engine answers none, as vLLM's
            await wait_until(lambda: _freed(session, prefill), what="prefill blocks freed after the pull")

        text = await fetch_text_on(session, decode)
        # the first pull reads every block; the second only what the decode engine's prefix
        # cache lacks after the first (the last, partial block)
        first, second = blocks_to_pull(prompt_tokens, 0, 16), blocks_to_pull(prompt_tokens, prompt_tokens - 1, 16)
        assert (first, second) == (-(-prompt_tokens // 16), 1)
        transfer_s = _modelled_transfer_s(first, "eth100")
        assert transfer_s > 0.03  # about 188 blocks of 2 MiB over 12.5 GB/s
        assert value(text, "vllm:nixl_xfer_time_seconds_count") == 2
        assert value(text, "vllm:nixl_xfer_time_seconds_sum") == pytest.approx(
            transfer_s + _modelled_transfer_s(second, "eth100"))
        assert value(text, "vllm:nixl_bytes_transferred_sum") == pytest.approx((first + second) * 16 * 131072)
        assert value(text, "vllm:time_to_first_token_seconds_count") == 2
        assert value(text, "vllm:time_to_first_token_seconds_sum") >= transfer_s
        # the prompt was not computed again: only its last token, to sample the next
        assert value(text, "vllm:request_prefill_kv_computed_tokens_sum") == 2
        assert value(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 2
        loaded = value(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        local = value(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
        # the second found the first's full blocks locally and loaded the rest but for the last token
        assert local == (prompt_tokens - 1) // 16 * 16
        assert loaded == (prompt_tokens - 1) + (prompt_tokens - 1 - local)
        assert value(text, "vllm:external_prefix_cache_hits_total") == loaded
        assert value(text, "vllm:external_prefix_cache_queries_total") == 2 * prompt_tokens
        assert value(text, "vllm:prompt_tokens_cached_total") == 2 * (prompt_tokens - 1)
        colocated_text = await fetch_text_on(session, colocated)
        assert value(colocated_text, "vllm:request_prefill_kv_computed_tokens_sum") > 2 * 1000


async def _freed(session: aiohttp.ClientSession, url: str) -> bool:
    return value(await fetch_text_on(session, url), "vllm:kv_cache_usage_perc") == 0.0


async def test_prefill_frees_unpulled_blocks_at_the_lease_and_a_late_decode_recomputes(served):
    lease = {**NIXL, "kv_connector_extra_config": {"kv_lease_duration": 2}}  # 2 s x 0.05: 0.1 s here
    colocated = await served(_config())
    prefill = await served(_config(kv_transfer_config=kv_transfer_config_of(lease)))
    decode = await served(_config(kv_transfer_config=kv_transfer_config_of({**NIXL,
                                                                             "kv_load_failure_policy": "recompute"})))
    request = {"model": "m", "prompt": PROMPT, "max_tokens": 8}
    async with aiohttp.ClientSession() as session:
        _, expected = await _post(session, colocated, request)
        _, answer = await _post(session, prefill, {**request, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS})
        assert isinstance(answer, dict) and answer["kv_transfer_params"]["do_remote_prefill"] is True
        await wait_until(lambda: _freed(session, prefill), what="blocks freed when the lease ran out")
        assert value(await fetch_text_on(session, prefill), "vllm:nixl_num_kv_expired_reqs_total") == 1
        status, got = await _post(session, decode, {**request, "kv_transfer_params": answer["kv_transfer_params"]})
        assert status == 200 and isinstance(got, dict) and isinstance(expected, dict)
        assert got["choices"][0]["text"] == expected["choices"][0]["text"] and got["usage"] == expected["usage"]
        text = await fetch_text_on(session, decode)
        assert value(text, "vllm:nixl_num_failed_transfers_total") == 1
        assert value(text, "vllm:request_prefill_kv_computed_tokens_sum") == answer["usage"]["prompt_tokens"]


async def test_kv_transfer_params_are_ignored_without_a_connector_and_a_failed_read_fails_by_default(served):
    plain = await served(_config())
    decode = await served(_config(kv_transfer_config=kv_transfer_config_of(NIXL)))  # kv_load_failure_policy fail
    gone = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
            "remote_engine_id": "gone", "remote_request_id": "req-1", "remote_host": "127.0.0.1",
            "remote_port": int(plain.rsplit(":", 1)[1]), "tp_size": 1}  # an engine without a side channel
    async with aiohttp.ClientSession() as session:
        status, answer = await _post(session, decode, {"model": "m", "prompt": "hello there", "max_tokens": 4,
                                                       "kv_transfer_params": gone})
        assert status == 500 and isinstance(answer, dict) and "KV transfer" in answer["error"]["message"]
        text = await fetch_text_on(session, decode)
        assert value(text, "vllm:nixl_num_failed_transfers_total") == 1
        assert value(text, "vllm:num_requests_waiting") == 0 and value(text, "vllm:num_requests_running") == 0
        status, answer = await _post(session, plain, {"model": "m", "prompt": "hello there", "max_tokens": 1,
                                                      "kv_transfer_params": PREFILL_PARAMS})
        assert status == 200 and isinstance(answer, dict) and answer["kv_transfer_params"] is None
        status, answer = await _post(session, plain, {"model": "m", "prompt": "hi", "kv_transfer_params": [1]})
        assert status == 400 or status == 422
