from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views

ADAPTERS = [frozenset(), frozenset(), frozenset({"sql"}), frozenset({"sql", "chat"})]


def decide(loads, request, spec="lora-affinity"):
    d = create_policy(spec).select(views(4, in_flight=loads, lora_adapters=ADAPTERS), request)
    return d.index, d.rule


def test_least_loaded_backend_running_the_adapter_wins_within_the_bound():
    assert decide([0, 0, 5, 3], RequestInfo(lora="sql")) == (3, "lora-affinity")
    assert decide([0, 0, 8, 9], RequestInfo(lora="sql")) == (2, "lora-affinity")


def test_an_adapter_backend_too_far_above_the_least_load_is_passed_over():
    assert decide([1, 2, 10, 12], RequestInfo(lora="sql")) == (0, "load-guard")
    assert decide([1, 2, 10, 12], RequestInfo(lora="sql"), "lora-affinity:bound_abs=9") == (2, "lora-affinity")


def test_without_an_active_adapter_prefer_backends_that_list_it():
    models = [frozenset({"base"}), frozenset({"base", "poem"}), frozenset({"base"}), frozenset({"base", "poem"})]
    backends = views(4, in_flight=[0, 3, 0, 2], lora_adapters=ADAPTERS, models=models)
    d = create_policy("lora-affinity").select(backends, RequestInfo(lora="poem"))
    assert (d.index, d.rule) == (3, "no-affinity")
    assert decide([2, 1, 0, 0], RequestInfo(lora="none-such")) == (2, "no-affinity")
    assert decide([2, 1, 0, 0], RequestInfo()) == (2, "no-adapter")
