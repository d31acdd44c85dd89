"""docs/routing-policies.md: the capacity weights it quotes are the ones `flotilla up` gives the default fleet."""

from __future__ import annotations

from proxy.fleetfile import load_up_fleet
from tests.conftest import REPO

DOC = (REPO / "docs" / "routing-policies.md").read_text()


def test_the_quoted_default_fleet_weights_are_the_modelled_ones() -> None:
    vllm, llama = load_up_fleet().engines
    assert f"weighs {vllm.capacity_weight():.1f}" in DOC
    assert f"weighs {llama.capacity_weight():.2f}" in DOC
    assert f"{llama.capacity_weight():.2f} of {llama.capacity_weight() + 2 * vllm.capacity_weight():.1f}" in DOC
