"""The kubernetes actuator against a recorded API contract: lightkube, the client it uses, talks to
a fake API server on 127.0.0.1 (tests/proxy/kube_api.py) that checks the bearer token, each
request's method, path, query, content type and JSON body, and answers Scale, EndpointSliceList
and watch events in the shapes a real API server sends."""

from __future__ import annotations

import json
import sys

import pytest

from policies.routing.base import BackendState
from policies.scaling import create_policy
from proxy.autoscale.actuator import ActuatorError
from proxy.autoscale.kubernetes import KubernetesActuator, KubernetesSettings
from proxy.autoscale.loop import Autoscaler
from proxy.autoscale.signals import ArrivalCounter, PoolSignals
from proxy.pool import BackendPool
from tests.proxy.kube_api import SCALE, SLICES, TOKEN, FakeApiServer, endpoint, endpoint_slice, serve
from tests.waiting import wait_until

WATCH_QUERY = {"labelSelector": "kubernetes.io/service-name=vllm", "watch": "true", "resourceVersion": "5000"}


@pytest.fixture
async def api(tmp_path):
    fake = FakeApiServer()
    runner, kubeconfig = await serve(fake, tmp_path)
    yield fake, kubeconfig
    await runner.cleanup()


def vllm_slice(*endpoints: dict) -> dict:
    return endpoint_slice(*endpoints, name="vllm-abcde", service="vllm")


async def test_replicas_follow_the_endpoint_slices_and_scaling_patches_the_scale_subresource(api):
    fake, kubeconfig = api
    # a fleet file gives the kubeconfig path as text
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=str(kubeconfig)))
    try:
        found = await actuator.replicas()
        assert [(h.replica_id, h.url) for h in found] == [("vllm-7d9f-a", "http://10.0.0.11:8000"),
                                                           ("vllm-7d9f-b", "http://10.0.0.12:8000")]
        assert fake.calls[0][:3] == ("GET", SCALE, {})
        assert fake.calls[1][:3] == ("GET", SLICES, {"labelSelector": "kubernetes.io/service-name=vllm"})
        await wait_until(lambda: fake.watchers == 1)
        assert fake.calls[2][:3] == ("GET", SLICES, WATCH_QUERY)

        placeholder = await actuator.start_replica()
        assert placeholder.url is None
        assert fake.calls[-1] == ("PATCH", SCALE, {}, {"spec": {"replicas": 3}})
        assert [h.replica_id for h in await actuator.replicas()][-1] == placeholder.replica_id

        a, b = fake.slices["vllm"][0]["endpoints"]
        c = endpoint("vllm-7d9f-c", "10.0.0.13", ready=False)
        await fake.events["vllm"].put({"type": "MODIFIED", "object": vllm_slice(a, b, c)})
        await wait_until(lambda: len(actuator.endpoints()) == 3)
        assert [h.replica_id for h in await actuator.replicas()] == ["vllm-7d9f-a", "vllm-7d9f-b", "vllm-7d9f-c"]

        await actuator.stop_replica("vllm-7d9f-b")
        assert fake.calls[-2] == ("PATCH", "/api/v1/namespaces/ml/pods/vllm-7d9f-b", {}, {
            "metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}})
        assert fake.calls[-1] == ("PATCH", SCALE, {}, {"spec": {"replicas": 2}})
        terminating = endpoint("vllm-7d9f-b", "10.0.0.12", ready=False, terminating=True)
        await fake.events["vllm"].put({"type": "MODIFIED", "object": vllm_slice(a, terminating, c)})
        await wait_until(lambda: [h.replica_id for h in actuator.endpoints()] == ["vllm-7d9f-a", "vllm-7d9f-c"])
        await fake.events["vllm"].put({"type": "DELETED", "object": vllm_slice(a, c)})
        await wait_until(lambda: actuator.endpoints() == [])
    finally:
        await actuator.shutdown()
    assert fake.replicas == 2  # shutdown leaves the workload as it is


async def test_an_expired_watch_lists_again_and_catches_up(api):
    fake, kubeconfig = api
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    try:
        assert len(await actuator.replicas()) == 2
        await wait_until(lambda: fake.watchers == 1)
        # while the watch was down the pods changed; the API says the old version is gone
        fake.slices["vllm"] = [vllm_slice(endpoint("vllm-7d9f-z", "10.0.0.19"))]
        await fake.events["vllm"].put({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 5000 (5100)", "reason": "Expired", "code": 410}})
        await wait_until(lambda: [h.replica_id for h in actuator.endpoints()] == ["vllm-7d9f-z"], timeout_s=60)
    finally:
        await actuator.shutdown()


async def test_the_loop_keeps_the_pool_in_step_with_the_pods(api):
    fake, kubeconfig = api
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    pool = BackendPool()
    scaler = Autoscaler(create_policy("seed"), actuator, pool, PoolSignals(pool, ArrivalCounter()))
    try:
        await scaler.reconcile(0.0)
        assert sorted(b.url for b in pool) == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]
        assert all(b.spec.flavor == "vllm" and b.source == "autoscaler" for b in pool)
        for backend in pool:
            backend.state = BackendState.READY
        await scaler.reconcile(1.0)
        assert scaler.fleet_state(1.0).ready == 2
        assert scaler.measured_cold_start_s is None  # found running: their launch time is unknown
        await scaler.start_replicas(1, 5.0)
        assert scaler.fleet_state(6.0).starting == 1  # the placeholder
        await fake.events["vllm"].put({"type": "MODIFIED", "object": vllm_slice(endpoint("vllm-7d9f-a", "10.0.0.11"))})
        await wait_until(lambda: len(actuator.endpoints()) == 1)
        await scaler.reconcile(7.0)
        assert [b.url for b in pool] == ["http://10.0.0.11:8000"]  # the vanished pod left the pool
        assert sorted(scaler.replicas) == ["vllm-7d9f-a", "vllm-scheduling-1"]
        assert scaler.replicas["vllm-scheduling-1"].started_at_s == 5.0
    finally:
        await actuator.shutdown()


async def test_a_wrong_token_is_an_error_naming_the_call(api):
    fake, kubeconfig = api
    fake.token = "another"
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    assert actuator.namespace == "ml"  # the kubeconfig context's
    with pytest.raises(ActuatorError, match="get deployments/vllm/scale: 401 Unauthorized"):
        await actuator.current_scale()
    await actuator.shutdown()


async def test_a_rotated_token_file_is_read_again_on_401(api, tmp_path):
    """The service-account token rotates under a running pod: the client reads the file again
    when the API refuses the old token, as client-go does (here through kubeconfig's tokenFile,
    the same code path as the in-cluster token)."""
    fake, kubeconfig = api
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    kubeconfig.write_text(kubeconfig.read_text().replace(f'token: "{TOKEN}"', f'tokenFile: "{token_file}"'))
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    try:
        assert await actuator.current_scale() == 2
        fake.token = "rotated-token"
        token_file.write_text("rotated-token\n")
        assert await actuator.current_scale() == 2
        assert [c[:2] for c in fake.calls] == [("GET", SCALE), ("GET", SCALE)]  # the 401 is not recorded
    finally:
        await actuator.shutdown()


async def test_a_kubeconfig_exec_plugin_supplies_the_token(api, tmp_path):
    """EKS, GKE and AKS kubeconfigs get their token from an exec credential plugin."""
    fake, kubeconfig = api
    plugin = tmp_path / "plugin.py"
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": TOKEN, "expirationTimestamp": "2099-01-01T00:00:00Z"}}
    plugin.write_text(f"print({json.dumps(json.dumps(credential))})\n")
    user = (f'exec: {{apiVersion: client.authentication.k8s.io/v1beta1, command: "{sys.executable}", '
            f'args: ["{plugin}"], interactiveMode: Never}}')
    kubeconfig.write_text(kubeconfig.read_text().replace(f'token: "{TOKEN}"', user))
    actuator = KubernetesActuator(KubernetesSettings(workload="deployment/vllm", kubeconfig=kubeconfig))
    try:
        assert await actuator.current_scale() == 2
    finally:
        await actuator.shutdown()


def test_the_workload_names_its_kind():
    with pytest.raises(ActuatorError, match="deployment/NAME"):
        KubernetesSettings(workload="vllm")
    assert KubernetesSettings(workload="StatefulSet/llama").kind == "statefulsets"
