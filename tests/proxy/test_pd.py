"""`flotilla proxy --prefill URL --decode URL` over look-alike vLLM engines, over sockets: a P/D
request gives the tokens and usage a colocated engine gives (streamed or not), its decode
engine's TTFT holds the modelled KV transfer, and a prefill replica that is down costs a local
prefill on the decode replica, not the request."""

from __future__ import annotations

import json
import socket

import aiohttp
import pytest

from fake_engines.driver.faults import FaultConfig, FaultInjector
from fake_engines.factory.vllm_config import kv_transfer_config_of
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from flotilla.proxy_cmd import build_config
from proxy.app import start_proxy
from proxy.config import BackendSpec, HealthConfig, ProxyConfig
from proxy.pd import PREFILL_PARAMS, prefill_body
from tests.fake_engines.scrape import value
from tests.waiting import wait_until

PROMPT = "the cat sat on the mat " * 250  # 1500 tokens
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def _engine(**overrides) -> VllmServeConfig:
    base = {"model": "llama-3.1-8b", "served_model_name": "m", "port": 0, "time_scale": 0.05,
            "max_model_len": 8192, "seed": 3}
    return VllmServeConfig(**{**base, **overrides})


@pytest.fixture
async def engines():
    started = []

    async def start(config: VllmServeConfig, faults: FaultInjector | None = None) -> str:
        running = await start_vllm(config, cold_start=False, faults=faults)
        await running.wait_ready()
        started.append(running)
        return f"http://127.0.0.1:{running.port}"

    yield start
    for running in started:
        await running.close()


@pytest.fixture
async def pd_proxy():
    started = []

    async def start(prefill: list[str], decode: list[str], prefill_policy: str = "prefix-aware") -> str:
        config = ProxyConfig(port=0, backends=[BackendSpec(url, flavor="vllm") for url in decode],
                             prefill_backends=[BackendSpec(url, flavor="vllm") for url in prefill],
                             policy="least-load", prefill_policy=prefill_policy,
                             health=HealthConfig(interval_s=0.2, timeout_s=0.5))
        running = await start_proxy(config)
        started.append(running)
        return running.url

    yield start
    for running in started:
        await running.close()


async def _ask(session: aiohttp.ClientSession, url: str, stream: bool, chat: bool = False) -> tuple[str, dict]:
    """The text and usage of one completion or chat completion (a stream's text joined, its usage event)."""
    body: dict = {"model": "m", "max_tokens": 16, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with session.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            answer = await resp.json()
            choice = answer["choices"][0]
            return choice["message"]["content"] if chat else choice["text"], answer["usage"]
        text, usage = "", {}
        for line in (await resp.text()).splitlines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                text += "".join((c.get("delta") or {}).get("content") or c.get("text", "") for c in event["choices"])
        return text, usage


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def test_pd_request_through_the_proxy_matches_colocated_tokens_and_usage(engines, pd_proxy):
    colocated = await engines(_engine())
    prefill = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL)))
    decode = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL), kv_link="eth100"))
    proxy = await pd_proxy([prefill], [decode])
    async with aiohttp.ClientSession() as session:
        for chat, stream in ((False, False), (False, True), (True, True)):
            expected = await _ask(session, colocated, stream, chat)
            got = await _ask(session, proxy, stream, chat)
            assert got == expected
            assert got[1]["prompt_tokens"] == expected[1]["prompt_tokens"] > 1000  # the prompt counted once
        router = await _metrics(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="pd") == 3
        assert value(router, "flotilla_pd_requests_total", outcome="fallback") == 0
        assert value(router, "flotilla_pd_prefill_seconds_count") == 3
        decoded = await _metrics(session, decode)
        assert value(decoded, "vllm:nixl_xfer_time_seconds_count") == 3
        transfer_s = value(decoded, "vllm:nixl_xfer_time_seconds_sum")
        assert transfer_s > 0.01  # the first pulls: every block of the prompt over 100 GbE
        assert value(decoded, "vllm:time_to_first_token_seconds_sum") >= transfer_s
        assert value(decoded, "vllm:request_prefill_kv_computed_tokens_sum") == 3  # last prompt tokens only
        prefilled = await _metrics(session, prefill)
        assert value(prefilled, "vllm:request_success_total") == 3
        assert value(prefilled, "vllm:generation_tokens_total") == 3  # max_tokens 1 each
        await wait_until(lambda: _freed(session, prefill), what="prefill blocks freed after the pulls")


async def _freed(session: aiohttp.ClientSession, url: str) -> bool:
    return value(await _metrics(session, url), "vllm:kv_cache_usage_perc") == 0.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_prefill_replica_down_falls_back_to_local_prefill_on_the_decode_replica(engines, pd_proxy):
    colocated = await engines(_engine())
    decode = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL)))
    proxy = await pd_proxy([f"http://127.0.0.1:{_closed_port()}"], [decode])
    async with aiohttp.ClientSession() as session:
        assert await _ask(session, proxy, False) == await _ask(session, colocated, False)
        router = await _metrics(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="fallback") == 1
        decoded = await _metrics(session, decode)
        assert value(decoded, "vllm:nixl_xfer_time_seconds_count") == 0
        assert value(decoded, "vllm:request_prefill_kv_computed_tokens_sum") > 1000  # computed here


async def test_a_failing_prefill_replica_is_retried_on_another(engines, pd_proxy):
    failing = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL)),
                            FaultInjector(FaultConfig(error_status=503, error_rate=1.0)))
    prefill = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL)))
    decode = await engines(_engine(kv_transfer_config=kv_transfer_config_of(NIXL)))
    proxy = await pd_proxy([failing, prefill], [decode], prefill_policy="round-robin")
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # round-robin: one of the two tries the failing replica first
            await _ask(session, proxy, False)
        router = await _metrics(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="pd") == 2
        assert value(router, "flotilla_pd_prefill_failures_total", backend=failing, reason="status_503") >= 1
        assert value(await _metrics(session, decode), "vllm:nixl_xfer_time_seconds_count") == 2


def test_prefill_body_is_the_toy_proxys_and_the_flags_build_two_pools():
    body = prefill_body({"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True},
                         "max_tokens": 50, "max_completion_tokens": 50})
    assert body == {"model": "m", "messages": [], "stream": False, "max_tokens": 1, "max_completion_tokens": 1,
                    "kv_transfer_params": PREFILL_PARAMS}
    import argparse

    from flotilla.proxy_cmd import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--prefill", "http://p1:8000", "--prefill", "http://p2:8000",
                              "--decode", "http://d1:8000", "--prefill-policy", "round-robin"])
    config = build_config(args)
    assert [(b.url, b.flavor) for b in config.prefill_backends] == [("http://p1:8000", "vllm"),
                                                                     ("http://p2:8000", "vllm")]
    assert [(b.url, b.flavor) for b in config.backends] == [("http://d1:8000", "vllm")]
    assert (config.prefill_policy, config.policy) == ("round-robin", "least-load")


def test_fleet_file_roles_start_nixl_engines_and_split_the_proxy_into_prefill_and_decode_pools():
    import yaml

    from flotilla.errors import ConfigError
    from flotilla.fleet.load import parse_fleet_file
    from proxy.config import parse_fleet
    from proxy.supervisor import proxy_fleet_file

    text = """
engines:
  - {flavor: vllm, model: llama-3.1-8b, name: p, role: prefill}
  - {flavor: vllm, model: llama-3.1-8b, name: d, role: decode, replicas: 2, max: 2}
"""
    fleet = parse_fleet_file(text)
    prefill_cmd = fleet.engines[0].command(port=8101)
    config_json = json.loads(prefill_cmd[prefill_cmd.index("--kv-transfer-config") + 1])
    assert config_json == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert "kv_consumer" in " ".join(fleet.engines[1].command(port=8102))
    started = [("vllm", "http://127.0.0.1:8101", "p"), ("vllm", "http://127.0.0.1:8102", "d"),
               ("vllm", "http://127.0.0.1:8103", "d")]
    proxy_file = parse_fleet(yaml.safe_dump(proxy_fleet_file(fleet, started)))
    config = ProxyConfig(backends=list(proxy_file.backends))
    assert [b.url for b in config.prefill_backends] == ["http://127.0.0.1:8101"]
    assert [b.url for b in config.backends] == ["http://127.0.0.1:8102", "http://127.0.0.1:8103"]
    with pytest.raises(ConfigError, match="role"):
        parse_fleet_file("engines:\n  - {flavor: llamacpp, model: llama-3.1-8b, role: prefill}\n")
    with pytest.raises(ConfigError, match="role"):
        parse_fleet_file("engines:\n  - {flavor: vllm, model: llama-3.1-8b, role: prefil}\n")
    with pytest.raises(ConfigError, match="prefill group"):  # the autoscaler grows the decode pool
        parse_fleet_file(text + "autoscaler: {engines: p}\n")
