"""`flotilla compose`: the Compose file of a fleet, and the proxy it runs.

The proxy of the generated file (`flotilla proxy --config` over the embedded fleet file) runs as
a real subprocess against a fake Docker Engine on a unix socket (tests/proxy/autoscale/
test_docker.py): its autoscaler starts the vLLM replicas as containers running `flotilla up`'s
engine command line on the fleet's network, and removes them when it stops.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from proxy.deploy.compose import compose_document, escape, render_compose
from proxy.deploy.fleet import load
from tests.processes import kill_if_running, terminate
from tests.proxy.autoscale.test_docker import FakeDocker
from tests.waiting import wait_until

ADMIN = "test-admin-token"


@pytest.fixture
async def docker(tmp_path):
    fake = FakeDocker()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    path = str(tmp_path / "docker.sock")
    await web.UnixSite(runner, path).start()
    yield fake, path
    await runner.cleanup()


def embedded(document: dict, name: str) -> dict:
    return yaml.safe_load(document["configs"][name]["content"].replace("$$", "$"))


async def test_the_generated_proxy_starts_the_autoscaled_engines_as_containers(docker, tmp_path: Path) -> None:
    fake, socket_path = docker
    fleet = load()
    vllm = next(g for g in fleet.groups if g.scaled)
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump(embedded(compose_document(fleet), "proxy-fleet")))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--config", str(config),
        "--docker-socket", socket_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "FLOTILLA_ADMIN_TOKEN": ADMIN})
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "listening on" in line, line + (await proc.stderr.read()).decode()
        await wait_until(lambda: sum(c[1].endswith("/start") for c in fake.calls) == vllm.min_replicas,
                         what="the autoscaler's floor started")
        creates = [c for c in fake.calls if c[1].endswith("/containers/create")]
        assert len(creates) == 2
        for _, _, query, body in creates:
            assert query["name"].startswith("vllm-")
            assert body["Image"] == "flotilla:latest"
            assert body["Cmd"] == vllm.command()  # flotilla up's command line, listening on 0.0.0.0:8000
            assert body["HostConfig"] == {"NetworkMode": "flotilla"}
            assert body["NetworkingConfig"] == {"EndpointsConfig": {"flotilla": {"Aliases": ["vllm"]}}}
        async with aiohttp.ClientSession() as session:
            async with session.get(line.split()[4] + "/admin/backends",
                                   headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
                backends = {b["url"]: (b["source"], b["flavor"]) for b in (await resp.json())["backends"]}
        names = sorted(c[2]["name"] for c in creates)
        assert backends == {"http://llama-0:8080": ("file", "llamacpp"),
                            **{f"http://{n}:8000": ("autoscaler", "vllm") for n in names}}
        assert await terminate(proc, 60) == 0
    finally:
        await kill_if_running(proc)
    assert fake.state == {}  # the proxy stopped and removed every container it started


def test_a_fleet_without_an_autoscaler_needs_no_docker_socket(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {name: small, flavor: vllm, model: llama-3.1-8b, replicas: 2}\n"
                     "  - {name: tiny, flavor: llamacpp, model: llama-3.1-8b, parallel: 2}\n"
                     "proxy: {policy: round-robin, port: 9000}\n")
    document = yaml.safe_load(render_compose(load(fleet)))
    services = document["services"]
    assert sorted(services) == ["grafana", "prometheus", "proxy", "small-0", "small-1", "tiny-0"]
    assert "volumes" not in services["proxy"] and "user" not in services["proxy"]
    assert services["proxy"]["ports"] == ["127.0.0.1:9000:8000"]
    assert services["tiny-0"]["command"][-4:] == ["--host", "0.0.0.0", "--port", "8080"]
    proxy = embedded(document, "proxy-fleet")
    assert "autoscaler" not in proxy
    assert [b["url"] for b in proxy["proxy"]["backends"]] == ["http://small-0:8000", "http://small-1:8000",
                                                              "http://tiny-0:8080"]
    jobs = {j["job_name"]: j["static_configs"][0]["targets"]
            for j in embedded(document, "prometheus")["scrape_configs"]}
    assert jobs == {"flotilla": ["proxy:8000"], "small": ["small-0:8000", "small-1:8000"], "tiny": ["tiny-0:8080"]}


def test_a_dollar_in_an_embedded_config_is_not_expanded_by_compose(tmp_path: Path) -> None:
    """Compose expands ${VAR} inside a config's content; the generator writes $$ for a literal $,
    which the real Compose binary leaves alone (its `config` output keeps the $$ escape)."""
    from proxy.deploy import render
    from tests.deploy.test_manifests import _compose_binary

    text = "query: rate(x[5m]) > $threshold and ${HOME}\n"

    def resolved(content: str) -> str:
        document = {"services": {"a": {"image": "x", "configs": [{"source": "c", "target": "/c"}]}},
                    "configs": {"c": {"content": content}}}
        path = tmp_path / "compose.yaml"
        path.write_text(render.dump(document))
        out = subprocess.run([str(_compose_binary()), "-f", str(path), "config", "--format", "json"],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/h"})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["configs"]["c"]["content"]

    assert "and /h" in resolved(text)  # unescaped, Compose would change the file
    assert resolved(escape(text)) == escape(text)
