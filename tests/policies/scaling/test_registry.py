import sys
import textwrap
from pathlib import Path

import pytest

from policies.scaling import registry
from policies.scaling.base import ConfigError, FleetState, ScalingLimits
from policies.scaling.cold_start_aware import ColdStartAwarePolicy
from policies.scaling.seed import SeedPolicy


def test_built_in_policies_are_listed_by_name() -> None:
    assert registry.available_policies() == ["cold-start-aware", "kpa", "pd-decode", "pd-prefill", "seed", "slo-capacity",
                                             "target-tracking"]


def test_spec_settings_fill_the_policy_config_and_the_shared_limits_by_type() -> None:
    policy = registry.create_policy("seed:capacity_rps=4,scale-down=yes,max_replicas=12,max_scale_up_step=none")
    assert isinstance(policy, SeedPolicy)
    assert (policy.config.capacity_rps, policy.config.scale_down) == (4.0, True)
    assert policy.limits == ScalingLimits(max_replicas=12, max_scale_up_step=None)
    stepped = registry.create_policy("seed:max_scale_up_step=3,scale_down_cooldown_s=0")
    assert (stepped.limits.max_scale_up_step, stepped.limits.scale_down_cooldown_s) == (3, 0.0)


def test_defaults_fill_only_fields_the_config_has_and_the_spec_wins() -> None:
    defaults = {"capacity_rps": 3.0, "drain_s": 90.0, "metric": "ignored-by-seed"}
    policy = registry.create_policy("cold-start-aware:drain_s=30", defaults)
    assert isinstance(policy, ColdStartAwarePolicy)
    assert (policy.config.capacity_rps, policy.config.drain_s) == (3.0, 30.0)


def test_unknown_policy_lists_the_valid_names() -> None:
    with pytest.raises(registry.UnknownPolicyError) as exc:
        registry.create_policy("hpa")
    assert str(exc.value) == (
        "unknown scaling policy 'hpa'; valid policies: cold-start-aware, kpa, pd-decode, pd-prefill, seed, slo-capacity, "
        "target-tracking")


@pytest.mark.parametrize(("spec", "field", "message"), [
    ("seed:speed=3", "speed", "unknown parameter of seed; known: capacity_rps, drain_s, interval_s,"),
    ("seed:capacity_rps=fast", "capacity_rps", "expected float"),
    ("seed:scale_down=maybe", "scale_down", "expected bool"),
    ("seed:max_replicas=2.5", "max_replicas", "expected int"),
    ("seed:drain_s", "drain_s", "expected key=value"),
    ("seed:drain_s=1,drain_s=2", "drain_s", "given twice"),
    ("kpa:panic_threshold=1.5,panic_window_s=120", "panic_window_s", "must be <= stable_window_s"),
    ("kpa:min_replicas=5,max_replicas=3", "max_replicas", "must be >= 1 and >= min_replicas"),
    (":x=1", "policy", "empty policy name"),
])
def test_bad_specs_raise_config_errors_naming_the_field(spec: str, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        registry.create_policy(spec)
    assert exc.value.field == field
    assert message in str(exc.value)


def test_registering_a_taken_name_raises() -> None:
    with pytest.raises(ValueError, match="'seed' is already registered by SeedPolicy"):
        registry.register_policy("seed")(type("Other", (SeedPolicy,), {}))


PLUGIN = '''
from dataclasses import dataclass

from policies.scaling.base import Reason, Recommendation, ScalingPolicy


@dataclass(frozen=True)
class FixedConfig:
    replicas: int = 3
    """Replicas to keep, always."""


class FixedPolicy(ScalingPolicy):
    """Keeps a fixed count."""

    Config = FixedConfig

    def recommend(self, history, fleet):
        return Recommendation(self.config.replicas, Reason.STEADY, "fixed")
'''


def test_plug_ins_from_the_entry_point_group_are_listed_and_built_on_first_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fixed_scaling_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "fixed_scaling_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fixed-scaling-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [{registry.ENTRY_POINT_GROUP}]
        fixed = fixed_scaling_plugin:FixedPolicy
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fixed_scaling_plugin", raising=False)
    try:
        assert "fixed" in registry.available_policies()
        policy = registry.create_policy("fixed:replicas=7,max_replicas=5")
        assert policy.name == "fixed"
        assert policy.decide([], FleetState(0)).desired == 5
    finally:
        registry.REGISTRY.forget("fixed")
