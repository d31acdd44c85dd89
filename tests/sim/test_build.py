"""Simulated replicas built from a `flotilla up` fleet file's engine groups."""

from __future__ import annotations

from fake_engines.core import LlamaCppScheduler, VllmScheduler
from proxy.fleetfile import load_up_fleet, parse_up_fleet
from sim.build import up_fleet_replicas


class _Quiet:
    def on_token(self, *args: object) -> None: ...
    def on_tokens(self, *args: object) -> None: ...
    def on_finish(self, *args: object) -> None: ...
    def on_reject(self, *args: object) -> None: ...


def test_the_default_fleet_lists_the_llama_server_first_as_its_proxy_does_then_the_autoscaled_vllm() -> None:
    fleet = load_up_fleet()
    replicas = up_fleet_replicas(fleet)
    vllm, llama = fleet.engines
    assert replicas.count == 3
    assert replicas.weights == (llama.capacity_weight(), vllm.capacity_weight(), vllm.capacity_weight())
    cores = [type(replicas.make_replica(i, _Quiet()).core) for i in range(3)]
    assert cores == [LlamaCppScheduler, VllmScheduler, VllmScheduler]


def test_declared_weights_and_replica_counts_are_kept() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.2-1b, replicas: 2, weight: 3}\n"
                           "  - {flavor: llamacpp, model: llama-3.2-1b, weight: 1}\n")
    assert up_fleet_replicas(fleet).weights == (3.0, 3.0, 1.0)
