"""The compose test's checks find a broken compose file and a broken fleet: fixtures are the
committed compose.yaml with one thing broken (a service name, a port, a scrape target), and
observations in the shapes the proxy, Prometheus and the Docker API answer with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.compose import checks
from tests.compose.run import REPO, compose_document

COMPOSE = REPO / "compose.yaml"


def fixture(tmp_path, change: Callable[[dict[str, Any]], None]) -> checks.Expected:
    """The committed compose file with `change` applied, as the compose test reads it."""
    raw = yaml.safe_load(COMPOSE.read_text())
    change(raw)
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return checks.expected(compose_document(path))


@pytest.fixture(scope="module")
def committed() -> checks.Expected:
    return checks.expected(compose_document(COMPOSE))


def _engine(raw: dict[str, Any], committed: checks.Expected) -> dict[str, Any]:
    return raw["services"][committed.engines[0].service]


def test_the_committed_file_is_wired_and_read_without_naming_a_service(committed: checks.Expected) -> None:
    assert checks.wiring_problems(committed) == []
    assert committed.proxy_url.startswith("http://127.0.0.1:")
    assert committed.prometheus_url and committed.prometheus_url.startswith("http://127.0.0.1:")
    assert committed.engines and committed.models
    assert set(committed.not_started) == {"grafana"}
    assert set(checks.flavor_counts(committed)) == {"vllm", "llamacpp"}


def test_a_renamed_engine_service_is_found(tmp_path, committed: checks.Expected) -> None:
    old = committed.engines[0].service

    def change(raw: dict[str, Any]) -> None:  # the service and what depends on it, not the URLs naming it
        raw["services"]["renamed"] = raw["services"].pop(old)
        for service in raw["services"].values():
            if old in (service.get("depends_on") or ()):
                service["depends_on"] = ["renamed" if d == old else d for d in service["depends_on"]]

    exp = fixture(tmp_path, change)
    problems = "\n".join(checks.wiring_problems(exp))
    assert f"proxy backend http://{old}:" in problems and f"no service or replica group named {old!r}" in problems
    assert "engine service renamed is not among the proxy's backends" in problems
    if committed.prometheus:
        assert f"scrape target {old}:" in problems


def test_an_engine_listening_on_another_port_is_found(tmp_path, committed: checks.Expected) -> None:
    engine = committed.engines[0]

    def change(raw: dict[str, Any]) -> None:
        cmd = _engine(raw, committed)["command"]
        cmd[cmd.index("--port") + 1] = str(engine.port + 1)

    problems = checks.wiring_problems(fixture(tmp_path, change))
    assert f"proxy backend http://{engine.service}:{engine.port}: {engine.service} listens on {engine.port + 1}, " \
           f"not {engine.port}" in problems


def test_a_wrong_scrape_target_is_found(tmp_path, committed: checks.Expected) -> None:
    engine = committed.engines[0]

    def change(raw: dict[str, Any]) -> None:
        for config in raw["configs"].values():
            config["content"] = config["content"].replace(f"'{engine.service}:{engine.port}'",
                                                          f"'{engine.service}:9999'")

    problems = checks.wiring_problems(fixture(tmp_path, change))
    assert problems == [f"scrape target {engine.service}:9999: {engine.service} listens on {engine.port}, not 9999"]


def test_an_unpublished_proxy_and_a_missing_docker_socket_are_found(tmp_path, committed: checks.Expected) -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["services"][committed.proxy].pop("ports")
        raw["services"][committed.proxy].pop("volumes", None)

    problems = "\n".join(checks.wiring_problems(fixture(tmp_path, change)))
    assert f"the proxy's port {committed.proxy_port} is not published to the host" in problems
    if committed.scaled:
        assert f"calls the Docker API at {committed.scaled.socket_path}, nothing is mounted there" in problems


def test_engine_command_lines_name_flavor_model_and_port() -> None:
    assert checks.engine_of(["fake-vllm", "serve", "m", "--served-model-name", "alias"]) == ("vllm", "alias", 8000)
    assert checks.engine_of(["python", "-m", "fake_engines.llamacpp.cli", "-m", "/models/q.gguf", "--port", "9"]) == (
        "llamacpp", "q", 9)
    assert checks.engine_of(["python", "-m", "flotilla", "proxy"]) is None
    assert checks.is_proxy(["python", "-m", "flotilla", "proxy", "--port", "8000"])


def _target(instance: str, health: str, error: str = "") -> dict[str, Any]:
    return {"labels": {"instance": instance, "job": "j"}, "health": health, "lastError": error}


def test_a_target_prometheus_cannot_scrape_is_named_with_its_error(committed: checks.Expected) -> None:
    engines = sum(checks.flavor_counts(committed).values())
    up = [_target(f"{committed.proxy}:{committed.proxy_port}", "up")] + [
        _target(f"10.0.0.{i}:8000", "up") for i in range(engines)]
    assert checks.target_problems(committed, {"activeTargets": up}, engines) == []
    down = [*up[:-1], _target("llama-0:9999", "down", "connection refused")]
    assert checks.target_problems(committed, {"activeTargets": down}, engines) == [
        "target llama-0:9999 (job j) is down: connection refused"]
    assert "targets expected" in checks.target_problems(committed, {"activeTargets": up[:-1]}, engines)[0]
    assert "no scrape target for the proxy" in "".join(checks.target_problems(committed, {"activeTargets": up[1:]},
                                                                              engines - 1))


def _proxy_metrics(states: dict[str, str]) -> str:
    """The proxy's /metrics for backends in these states ("": removed, only its counters left)."""
    state = [f'flotilla_backend_state{{backend="{url}",state="{s}"}} 1.0' for url, s in states.items() if s]
    in_flight = [f'flotilla_backend_in_flight{{backend="{url}"}} 0.0' for url in states]
    return "\n".join(["# TYPE flotilla_backend_state gauge", *state,
                      "# TYPE flotilla_backend_in_flight gauge", *in_flight]) + "\n"


def test_backends_must_all_be_ready_and_a_removed_replica_no_longer_counts(committed: checks.Expected) -> None:
    fixed = {url: "ready" for url, _ in committed.backends}
    scaled = {f"http://r{i}:8000": "ready" for i in range(committed.scaled.min if committed.scaled else 0)}
    assert checks.backend_problems(committed, _proxy_metrics({**fixed, **scaled, "http://gone:8000": ""})) == []
    url = next(iter(fixed))
    assert checks.backend_problems(committed, _proxy_metrics({**fixed, url: "ejected", **scaled})) == [
        f"backend {url} is ejected"]
    if committed.scaled:
        problems = checks.backend_problems(committed, _proxy_metrics({**fixed, **scaled}), committed.scaled.min + 1)
        assert problems and "autoscaled backends ready expected" in problems[0]


def test_a_request_loadgen_saw_fail_fails_the_run() -> None:
    ok = {"summary": {"num_requests": 2, "num_ok": 2, "num_failed": 0}, "requests": [{}, {}]}
    assert checks.loadgen_problems(ok) == []
    failed = {"summary": {"num_requests": 2, "num_ok": 1, "num_failed": 1}, "requests": [{}, {"error": "HTTP 502"}]}
    assert checks.loadgen_problems(failed) == ["loadgen: 1 of 2 requests answered; errors: ['HTTP 502']"]


def test_what_compose_down_left_is_named() -> None:
    left = [{"Names": ["vllm-1a2b"], "State": "exited"}]
    assert checks.leftover_problems(left, ["podman", "flotilla"], ["flotilla"]) == [
        "container vllm-1a2b is still there (exited)", "network flotilla is still there"]
    assert checks.leftover_problems([], ["podman"], ["flotilla"]) == []
