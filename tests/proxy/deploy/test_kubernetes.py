"""`flotilla k8s`: the manifests of a fleet, and the proxy they run, against recorded API responses.

The proxy of the generated manifests (`flotilla proxy --config` over the ConfigMap's fleet file)
runs as a real subprocess, pointed at the fake API server (tests/proxy/kube_api.py) by a
kubeconfig: it finds the llama pods through their Service's EndpointSlices, follows watch events
adding and removing one, and adopts the vLLM pods through the Kubernetes actuator.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from proxy.config import ConfigError
from proxy.deploy.fleet import load
from proxy.deploy.kubernetes import manifests, proxy_fleet, render_manifests
from tests.processes import kill_if_running, terminate
from tests.proxy.kube_api import FakeApiServer, endpoint, endpoint_slice, serve
from tests.waiting import wait_until

ADMIN = "test-admin-token"


def proxy_config_of(files: dict[str, str]) -> str:
    docs = yaml.safe_load_all(files["proxy.yaml"])
    return next(d for d in docs if d["kind"] == "ConfigMap")["data"]["fleet.yaml"]


@pytest.fixture
async def api(tmp_path):
    fake = FakeApiServer()
    fake.slices["llama"] = [endpoint_slice(endpoint("llama-5c-a", "10.0.1.21"), name="llama-x1", service="llama",
                                           port=8080)]
    runner, kubeconfig = await serve(fake, tmp_path)
    yield fake, kubeconfig
    await runner.cleanup()


async def _backends(session: aiohttp.ClientSession, url: str) -> dict[str, tuple[str, str, float]]:
    async with session.get(url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 200
        body = await resp.json()
    return {b["url"]: (b["source"], b["flavor"], b["weight"]) for b in body["backends"]}


async def test_the_generated_proxy_finds_engines_through_endpoint_slices(api, tmp_path: Path) -> None:
    fake, kubeconfig = api
    config = tmp_path / "fleet.yaml"
    config.write_text(proxy_config_of(manifests(load())))
    weights = {g.name: g.weight for g in load().groups}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--config", str(config),
        "--kubeconfig", str(kubeconfig), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "FLOTILLA_ADMIN_TOKEN": ADMIN})
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "listening on" in line, line + (await proc.stderr.read()).decode()
        url = line.split()[4]
        async with aiohttp.ClientSession() as session:
            llama = ("k8s:llama", "llamacpp", weights["llama"])
            vllm = ("autoscaler", "vllm", weights["vllm"])
            want = {"http://10.0.1.21:8080": llama, "http://10.0.0.11:8000": vllm, "http://10.0.0.12:8000": vllm}
            await wait_until(lambda: _backends(session, url), what="the admin API answers")
            await wait_until(lambda: _same(session, url, want), what="pods of both Services in the pool")
            # a second llama pod comes up, then the first terminates
            b = endpoint("llama-5c-b", "10.0.1.22", ready=False)
            await fake.events["llama"].put({"type": "MODIFIED", "object": endpoint_slice(
                fake.slices["llama"][0]["endpoints"][0], b, name="llama-x1", service="llama", port=8080)})
            want["http://10.0.1.22:8080"] = llama
            await wait_until(lambda: _same(session, url, want), what="the new llama pod in the pool")
            gone = endpoint("llama-5c-a", "10.0.1.21", ready=False, terminating=True)
            await fake.events["llama"].put({"type": "MODIFIED", "object": endpoint_slice(
                gone, b, name="llama-x1", service="llama", port=8080)})
            del want["http://10.0.1.21:8080"]
            await wait_until(lambda: _same(session, url, want), what="the terminated llama pod out of the pool")
        watched = {c[2]["labelSelector"] for c in fake.calls if c[2].get("watch") == "true"}
        assert watched == {"kubernetes.io/service-name=llama", "kubernetes.io/service-name=vllm"}
        assert await terminate(proc, 60) == 0
    finally:
        await kill_if_running(proc)
    assert fake.replicas == 2  # the two vLLM pods found running were the autoscaler's floor: nothing scaled


async def _same(session: aiohttp.ClientSession, url: str, want: dict) -> bool:
    return await _backends(session, url) == want


def test_the_proxy_fleet_file_discovers_fixed_groups_and_scales_the_autoscaled_one() -> None:
    data = proxy_fleet(load())
    assert data["proxy"]["discover"][0]["source"] == "k8s:llama"
    assert "backends" not in data["proxy"]
    assert data["autoscaler"]["kubernetes"] == {"workload": "deployment/vllm", "service": "vllm", "port_name": "http"}
    assert "engine_cmd" not in data["autoscaler"]


def test_a_fleet_without_an_autoscaler_runs_every_group_at_its_replicas(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {name: small, flavor: vllm, model: llama-3.1-8b, replicas: 3}\n"
                     "proxy: {policy: round-robin, port: 9000}\n")
    docs = list(yaml.safe_load_all(render_manifests(load(fleet))))
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "small")
    assert deployment["spec"]["replicas"] == 3
    proxy = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["fleet.yaml"])
    assert proxy == {"proxy": {"policy": "round-robin", "discover": [
        {"source": "k8s:small", "flavor": "vllm", "weight": load(fleet).groups[0].weight, "port_name": "http"}]}}
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "flotilla-proxy")
    assert service["spec"]["ports"][0]["port"] == 9000


@pytest.mark.parametrize("name", ["Big_GPU", "grafana", "9lives"])
def test_a_group_name_that_cannot_name_a_service_is_an_error_naming_it(tmp_path: Path, name: str) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"engines:\n  - {{name: '{name}', flavor: vllm, model: llama-3.1-8b}}\n")
    with pytest.raises(ConfigError) as caught:
        load(fleet)
    assert str(caught.value).startswith(f"{fleet}: engines[0].name='{name}': must be a DNS label")
