"""Peer command lines and configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from bench import compiled
from bench.peers.launch import RouterSpec, launch, litellm_config, nginx_config

BACKENDS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_nginx_proxies_to_every_backend_unbuffered_with_keepalive(tmp_path: Path) -> None:
    conf = nginx_config(BACKENDS, 8080, tmp_path)
    assert "server 127.0.0.1:9001;" in conf and "server 127.0.0.1:9002;" in conf
    assert "listen 127.0.0.1:8080;" in conf
    assert "proxy_buffering off;" in conf and "keepalive 256;" in conf and "access_log off;" in conf


def test_litellm_has_one_deployment_per_backend_under_one_name() -> None:
    cfg = litellm_config(BACKENDS, "llama-3.1-8b", "least-busy")
    assert [d["litellm_params"]["api_base"] for d in cfg["model_list"]] == [b + "/v1" for b in BACKENDS]
    assert {d["model_name"] for d in cfg["model_list"]} == {"llama-3.1-8b"}
    assert cfg["router_settings"]["routing_strategy"] == "least-busy"


def test_litellm_launch_writes_its_config_and_keeps_the_cost_map_local(tmp_path: Path) -> None:
    how = launch(RouterSpec("l", "litellm", "least-busy"), BACKENDS, 4000, tmp_path, "m")
    cfg = yaml.safe_load(Path(how.argv[how.argv.index("--config") + 1]).read_text())
    assert len(cfg["model_list"]) == 2
    assert how.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert how.url == "http://127.0.0.1:4000"


@pytest.mark.parametrize(("kind", "policy", "flag"), [("sglang", "cache_aware", "--worker-urls"),
                                                      ("vllm-router", "round_robin", "--worker-urls"),
                                                      ("flotilla", "prefix-aware", "--backend")])
def test_routers_get_policy_port_and_every_backend(tmp_path: Path, kind: str, policy: str, flag: str) -> None:
    argv = launch(RouterSpec("x", kind, policy), BACKENDS, 4100, tmp_path, "m").argv
    assert argv[argv.index("--policy") + 1] == policy
    assert argv[argv.index("--port") + 1] == "4100"
    assert all(any(b in a for a in argv) for b in BACKENDS)
    assert flag in argv


def test_rust_routers_get_distinct_metrics_ports(tmp_path: Path) -> None:
    a = launch(RouterSpec("a", "sglang", "round_robin"), BACKENDS, 1, tmp_path, "m").argv
    b = launch(RouterSpec("b", "vllm-router", "round_robin"), BACKENDS, 2, tmp_path, "m").argv
    assert a[a.index("--prometheus-port") + 1] != b[b.index("--prometheus-port") + 1]


def test_unknown_kind_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kind='envoy'"):
        launch(RouterSpec("e", "envoy"), BACKENDS, 1, tmp_path, "m")


def test_flotillas_compiled_build_runs_from_its_own_folder_ahead_of_the_working_tree(tmp_path: Path) -> None:
    plain = launch(RouterSpec("p", "flotilla", "round-robin"), BACKENDS, 1, tmp_path, "m")
    built = launch(RouterSpec("c", "flotilla", "round-robin", compiled=True), BACKENDS, 1, tmp_path, "m")
    assert built.argv == plain.argv and plain.cwd is None
    # `python -m` puts the working directory first on sys.path; the workers it forks inherit both
    assert built.cwd == compiled.DEST
    assert built.env["PYTHONPATH"].split(os.pathsep)[0] == str(compiled.DEST)
