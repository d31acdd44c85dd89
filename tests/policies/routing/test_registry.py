"""Policy names, the NAME[:key=value,...] spec language, validation errors and plug-ins."""

from __future__ import annotations

import random
import sys
import textwrap

import pytest

from policies.routing import (
    ConfigError,
    RequestInfo,
    RoutingPolicy,
    UnknownPolicyError,
    available_policies,
    create_policy,
    parse_policy_spec,
    register_policy,
    registry,
)
from tests.policies.routing.harness import views

BUILT_IN = [
    "bounded-hash",
    "least-load",
    "least-outstanding",
    "lora-affinity",
    "power-of-two",
    "prefix-aware",
    "prefix-capacity",
    "prefix-cost",
    "round-robin",
    "session-affinity",
    "vllm-dp",
    "weighted",
]


def test_every_built_in_policy_is_listed_and_builds_with_defaults():
    assert set(BUILT_IN) <= set(available_policies())
    for name in BUILT_IN:
        policy = create_policy(name)
        assert policy.name == name
        assert policy.select(views(2), RequestInfo()) is not None


def test_spec_values_take_the_config_fields_types():
    name, params = parse_policy_spec("session-affinity:home=modulo,signal=prefill_tokens,bound=1.25")
    assert name == "session-affinity"
    assert params == {"home": "modulo", "signal": "prefill_tokens", "bound": 1.25}
    assert isinstance(params["bound"], float)
    assert parse_policy_spec("bounded-hash:vnodes=40")[1] == {"vnodes": 40}
    assert parse_policy_spec("session-affinity:bound=none")[1] == {"bound": None}


def test_spec_accepts_engine_metric_names_and_dashed_keys():
    policy = create_policy("prefix-aware:balance-abs-threshold=8,signal=vllm:num_requests_waiting")
    assert policy.config.balance_abs_threshold == 8.0
    assert policy.config.signal == "vllm:num_requests_waiting"


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(UnknownPolicyError) as err:
        create_policy("cache-aware")
    for name in BUILT_IN:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ("least-load:colour=red", "colour", "unknown parameter"),
        ("session-affinity:bound=high", "bound", "expected float/NoneType"),
        ("session-affinity:bound=0.5", "bound", "must be >= 1.0"),
        ("session-affinity:home=random", "home", "must be one of ring, modulo"),
        ("least-load:signal=in-flight", "signal", "must be one of in_flight"),
        ("bounded-hash:c=0.9", "c", "must be >= 1.0"),
        ("prefix-aware:cache_threshold=1.5", "cache_threshold", "must be in [0, 1]"),
        ("weighted:queue=0,kv=0,prefix=0,lora=0", "queue", "at least one scorer weight"),
        ("least-load:signal", "signal", "expected key=value"),
        ("round-robin:x=1", "x", "unknown parameter"),
    ],
)
def test_bad_parameters_name_the_field_value_and_reason(spec, field, reason):
    with pytest.raises(ConfigError) as err:
        create_policy(spec)
    assert err.value.field == field
    assert reason in err.value.reason


def test_registering_a_taken_name_raises():
    with pytest.raises(ValueError, match="already registered"):

        @register_policy("round-robin")
        class Other(RoutingPolicy):
            pass


def test_same_seed_gives_the_same_decisions():
    backends = views(6)

    def run(seed: int) -> list[int]:
        policy = create_policy("power-of-two", rng=random.Random(seed))
        return [policy.select(backends, RequestInfo()).index for _ in range(50)]

    assert run(7) == run(7)
    assert run(7) != run(8)


PLUGIN = textwrap.dedent(
    '''
    from dataclasses import dataclass

    from policies.routing.base import Decision, RoutingPolicy
    from policies.routing.registry import ConfigError


    @dataclass(frozen=True)
    class LastConfig:
        offset: int = 0
        """Backends to skip from the end."""

        def __post_init__(self):
            if self.offset < 0:
                raise ConfigError("offset", self.offset, "must be >= 0")


    class Last(RoutingPolicy):
        Config = LastConfig

        def select(self, backends, request):
            return Decision(backends[-1 - self.config.offset].index, "last")
    '''
)


@pytest.fixture
def plugin_on_path(tmp_path, monkeypatch):
    """An installed distribution that declares one policy through the entry-point group."""
    (tmp_path / "flotilla_last_policy.py").write_text(PLUGIN)
    info = tmp_path / "flotilla_last_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flotilla-last-policy\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[flotilla.routing_policies]\nlast = flotilla_last_policy:Last\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    registry.REGISTRY.forget("last")
    sys.modules.pop("flotilla_last_policy", None)


def test_entry_point_plugin_is_listed_without_import_and_built_on_demand(plugin_on_path):
    assert "last" in available_policies()
    assert "flotilla_last_policy" not in sys.modules
    policy = create_policy("last:offset=1")
    assert policy.name == "last"
    assert policy.select(views(4), RequestInfo()).index == 2
    with pytest.raises(ConfigError) as err:
        create_policy("last:offset=-1")
    assert err.value.field == "offset"


def test_a_policy_built_without_a_config_gets_its_defaults():
    from policies.routing.prefix_aware import PrefixAware, PrefixAwareConfig
    from policies.routing.round_robin import RoundRobin

    assert PrefixAware().config == PrefixAwareConfig()
    assert PrefixAware().config.balance_abs_threshold == 64
    assert RoundRobin().select(views(2), RequestInfo()).index == 0


def test_a_policy_without_select_cannot_be_built():
    from policies.routing.base import RoutingPolicy

    class Incomplete(RoutingPolicy):
        name = "incomplete"

    with pytest.raises(TypeError, match="select"):
        Incomplete()
