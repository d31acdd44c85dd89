"""`flotilla proxy --prefill URL --decode URL` over look-alike vLLM engines, over sockets: a P/D
request gives the tokens and usage a colocated engine gives (streamed or not), its decode
engine's TTFT holds the modelled KV transfer, and a prefill replica that is down costs a local
prefill on the decode replica, not the request."""

from __future__ import annotations

import json
import socket

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from fake_engines.driver.faults import FaultConfig, FaultInjector
from fake_engines.factory.vllm_config import kv_transfer_config_of
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from flotilla.proxy_cmd import autoscale_config as autoscale_configs
from flotilla.proxy_cmd import build_config
from policies.routing.base import BackendState
from proxy.app import PROXY_KEY, start_proxy
from proxy.config import BackendSpec, HealthConfig, ProxyConfig
from proxy.pd import PREFILL_PARAMS, prefill_body
from tests.conftest import Serve
from tests.fake_engines.client import stream_text_and_usage
from tests.fake_engines.scrape import fetch_text_on, value
from tests.waiting import wait_until

PROMPT = "the cat sat on the mat " * 250  # 1500 tokens
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def _engine(**overrides) -> VllmServeConfig:
    base = {"model": "llama-3.1-8b", "served_model_name": "m", "port": 0, "time_scale": 0.05,
            "max_model_len": 8192, "seed": 3}
    return VllmServeConfig(**{**base, **overrides})


@pytest.fixture
def engines(serve: Serve):
    """engines(config, faults) -> the base URL of a warm look-alike vLLM, closed when the test ends."""
    return lambda config, faults=None: serve(start_vllm(config, cold_start=False, faults=faults))


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
        return stream_text_and_usage(await resp.text())


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
        router = await fetch_text_on(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="pd") == 3
        assert value(router, "flotilla_pd_requests_total", outcome="fallback") == 0
        assert value(router, "flotilla_pd_prefill_seconds_count") == 3
        decoded = await fetch_text_on(session, decode)
        assert value(decoded, "vllm:nixl_xfer_time_seconds_count") == 3
        transfer_s = value(decoded, "vllm:nixl_xfer_time_seconds_sum")
        assert transfer_s > 0.01  # the first pulls: every block of the prompt over 100 GbE
        assert value(decoded, "vllm:time_to_first_token_seconds_sum") >= transfer_s
        assert value(decoded, "vllm:request_prefill_kv_computed_tokens_sum") == 3  # last prompt tokens only
        prefilled = await fetch_text_on(session, prefill)
        assert value(prefilled, "vllm:request_success_total") == 3
        assert value(prefilled, "vllm:generation_tokens_total") == 3  # max_tokens 1 each
        await wait_until(lambda: _freed(session, prefill), what="prefill blocks freed after the pulls")


async def _freed(session: aiohttp.ClientSession, url: str) -> bool:
    return value(await fetch_text_on(session, url), "vllm:kv_cache_usage_perc") == 0.0


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
        router = await fetch_text_on(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="fallback") == 1
        decoded = await fetch_text_on(session, decode)
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
        router = await fetch_text_on(session, proxy)
        assert value(router, "flotilla_pd_requests_total", outcome="pd") == 2
        assert value(router, "flotilla_pd_prefill_failures_total", backend=failing, reason="status_503") >= 1
        assert value(await fetch_text_on(session, decode), "vllm:nixl_xfer_time_seconds_count") == 2


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
    scaled = parse_fleet_file(text.replace("name: p,", "name: p, max: 3,") + "autoscaler: {engines: p, policy: pd-prefill}\n")
    assert proxy_fleet_file(scaled, started[1:])["autoscaler"]["role"] == "prefill"  # it scales the prefill pool


# --- the live proxy's P/D pools: one request id, reloads, an autoscaler per pool (stub engines) ----


class StubEngine:
    """A vLLM stand-in on 127.0.0.1: /health, /v1/models, /metrics from `metrics`, and completions
    that record their headers and body; a prefill request is answered with kv_transfer_params."""

    def __init__(self, metrics: str = "") -> None:
        self.metrics = metrics
        self.tpot_count = 0
        self.seen: list[tuple[CIMultiDict, dict]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> StubEngine:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._complete)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "object": "model"}]})

    async def _metrics(self, _request: web.Request) -> web.Response:
        self.tpot_count += 1  # "tpot" in the text: every request since the last scrape took 0.3 s a token
        text = self.metrics.replace("TPOT_COUNT", str(self.tpot_count)).replace("TPOT_SUM", str(0.3 * self.tpot_count))
        return web.Response(text=text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((CIMultiDict(request.headers), body))
        params = body.get("kv_transfer_params") or {}
        answer: dict = {"id": "cmpl-1", "object": "text_completion", "model": "m",
                        "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        if params.get("do_remote_decode"):
            answer["kv_transfer_params"] = {"do_remote_prefill": True, "remote_engine_id": self.url,
                                            "remote_block_ids": [[1]], "remote_host": "127.0.0.1"}
        return web.json_response(answer)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def stubs():
    made: list[StubEngine] = []

    async def start(metrics: str = "") -> StubEngine:
        made.append(await StubEngine(metrics).start())
        return made[-1]

    yield start
    for stub in made:
        await stub.close()


def _fleet_file(path, prefill: list[str], decode: list[str], autoscaler: str = "") -> None:
    lines = ["backends:"] + [f"  - {{url: {u}, flavor: vllm, role: prefill}}" for u in prefill]
    lines += [f"  - {{url: {u}, flavor: vllm, role: decode}}" for u in decode]
    path.write_text("\n".join(lines) + "\n" + autoscaler)


def _proxy_args(path):
    import argparse

    from flotilla.proxy_cmd import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", str(path), "--port", "0", "--health-interval-s", "0.1",
                              "--scrape-interval-s", "0.1"])


async def test_both_phases_carry_one_request_id_and_reloads_update_the_prefill_pool(stubs, tmp_path):
    p1, p2, d1 = await stubs(), await stubs(), await stubs()
    fleet = tmp_path / "fleet.yaml"
    _fleet_file(fleet, [p1.url], [d1.url])
    config = build_config(_proxy_args(fleet))
    config.reload_interval_s = 0.05
    running = await start_proxy(config)
    try:
        async with aiohttp.ClientSession() as session:
            for sent in ("client-id-7", None):
                headers = {"X-Request-Id": sent} if sent else {}
                async with session.post(running.url + "/v1/completions", headers=headers,
                                        json={"model": "m", "prompt": "hi", "max_tokens": 4}) as resp:
                    assert resp.status == 200, await resp.text()
                    answered = resp.headers["X-Request-Id"]
                prefill_id, decode_id = p1.seen[-1][0]["X-Request-Id"], d1.seen[-1][0]["X-Request-Id"]
                assert prefill_id == decode_id == answered == (sent or answered)  # the client's, else the proxy's
                assert d1.seen[-1][1]["kv_transfer_params"]["remote_engine_id"] == p1.url  # it was a P/D request
            assert p1.seen[0][0]["X-Request-Id"] != p1.seen[1][0]["X-Request-Id"]  # a new id per request
            prefill_pool = running.app[PROXY_KEY].prefill.pool
            _fleet_file(fleet, [p2.url], [d1.url])  # the prefill replica is replaced
            await wait_until(lambda: prefill_pool.find(p2.url) is not None
                             and prefill_pool.find(p2.url).state is BackendState.READY, what="p2 in the prefill pool")
            gone = prefill_pool.find(p1.url)
            assert gone is None or gone.state is BackendState.DRAINING  # drained (and dropped once idle)
            assert running.app[PROXY_KEY].pool.find(p2.url) is None  # not a decode backend
            async with session.post(running.url + "/v1/completions",
                                    json={"model": "m", "prompt": "hi", "max_tokens": 4}) as resp:
                assert resp.status == 200
            assert len(p2.seen) == 1 and len(p1.seen) == 2
    finally:
        await running.close()


PREFILL_METRICS = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 6.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.0
"""
DECODE_METRICS = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.1
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} TPOT_COUNT
vllm:request_time_per_output_token_seconds_count{model_name="m"} TPOT_COUNT
vllm:request_time_per_output_token_seconds_sum{model_name="m"} TPOT_SUM
"""
AUTOSCALERS = """autoscaler:
  - {role: prefill, policy: "pd-prefill:interval_s=0.2", min: 0, max: 2, sample_interval_s: 0.1, engine_cmd: stub}
  - {role: decode, policy: "pd-decode:interval_s=0.2", min: 0, max: 2, sample_interval_s: 0.1, engine_cmd: stub}
"""


async def test_a_fleet_file_autoscales_the_prefill_and_the_decode_pool_each_on_its_own_signals(
        stubs, tmp_path, monkeypatch):
    """The prefill pool's replicas queue prompts (its signal) while their KV is empty; the decode
    pool's have KV to spare and nothing waiting, but 0.3 s a token over a 0.1 s TPOT target (its
    signal). Each autoscaler grows its own pool to its max; read crosswise, neither would."""
    from proxy.autoscale import actuator, setup

    class StubActuator(actuator.Actuator):
        flavor = "vllm"

        def __init__(self, metrics: str) -> None:
            self.metrics, self.started = metrics, 0

        async def start_replica(self) -> actuator.ReplicaHandle:
            self.started += 1
            stub = await stubs(self.metrics)
            return actuator.ReplicaHandle(stub.url, stub.url)

        async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
            pass

        async def shutdown(self) -> None:
            pass

    made: dict[str, StubActuator] = {}

    def build(config):
        made[config.role] = StubActuator(PREFILL_METRICS if config.role == "prefill" else DECODE_METRICS)
        return made[config.role]

    monkeypatch.setattr(setup, "build_actuator", build)
    p1, d1 = await stubs(PREFILL_METRICS), await stubs(DECODE_METRICS)
    fleet = tmp_path / "fleet.yaml"
    _fleet_file(fleet, [p1.url], [d1.url], AUTOSCALERS)
    args = _proxy_args(fleet)
    configs = autoscale_configs(args)
    assert [(c.role, c.pool_label) for c in configs] == [("decode", "decode"), ("prefill", "prefill")]
    running = await start_proxy(build_config(args), extend=lambda app: [setup.attach(app, c) for c in configs])
    try:
        proxy = running.app[PROXY_KEY]
        await wait_until(lambda: len(proxy.prefill.pool) == 3 and len(proxy.pool) == 3, timeout_s=20,
                         what="both pools at 1 + max 2")
        assert {b.url for b in proxy.prefill.pool} >= {p1.url} and p1.url not in {b.url for b in proxy.pool}
        assert made["prefill"].started == made["decode"].started == 2
        prefill_rt, decode_rt = running.app[setup.PREFILL_AUTOSCALER_KEY], running.app[setup.AUTOSCALER_KEY]
        assert prefill_rt.policy.name == "pd-prefill" and decode_rt.policy.name == "pd-decode"
        assert any("tpot_p90_s" in d.detail for d in decode_rt.autoscaler.decisions)
        async with aiohttp.ClientSession() as session, session.get(running.url + "/metrics") as resp:
            text = await resp.text()
        assert 'flotilla_autoscaler_desired_replicas{pool="prefill"} 2.0' in text
        assert 'flotilla_autoscaler_desired_replicas{pool="decode"} 2.0' in text
        assert 'flotilla_autoscaler_decisions_total{policy="pd-prefill",reason="scale-up"}' in text
    finally:
        await running.close()
