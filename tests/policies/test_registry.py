"""The registry both policy kinds share: one spec language, one conversion, one duplicate rule."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.errors import ConfigError
from policies.registry import EmptyConfig, PolicyRegistry, UnknownPolicyError, convert, parse_spec
from policies.routing import registry as routing
from policies.scaling import registry as scaling


def test_spec_splits_name_and_raw_settings_with_dashes_read_as_underscores() -> None:
    assert parse_spec(" kpa : target=4, min-replicas = 0 ,") == ("kpa", {"target": "4", "min_replicas": "0"})
    assert parse_spec("round-robin") == ("round-robin", {})


@pytest.mark.parametrize(("spec", "field", "reason"), [
    (":x=1", "policy", "empty policy name"),
    ("seed:drain_s", "drain_s", "expected key=value"),
    ("seed:=3", "spec", "expected key=value"),
    ("seed:drain_s=1,drain-s=2", "drain_s", "given twice"),
])
def test_malformed_specs_are_config_errors_naming_the_field(spec: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_spec(spec)
    assert (err.value.field, err.value.reason) == (field, reason)


@pytest.mark.parametrize(("raw", "hint", "value"), [
    ("yes", bool, True), ("OFF", bool, False), ("40", int, 40), ("1.25", float, 1.25), ("modulo", str, "modulo"),
    ("none", float | None, None), ("", int | None, None), ("3", int | None, 3), ("3", int | str, 3),
    ("x", int | str, "x"),
])
def test_values_take_the_fields_type_trying_union_members_in_order(raw: str, hint: object, value: object) -> None:
    converted = convert("f", raw, hint)
    assert converted == value and type(converted) is type(value)


@pytest.mark.parametrize(("raw", "hint", "reason"), [
    ("high", float | None, "expected float/NoneType"),
    ("2.5", int, "expected int"),
    ("maybe", bool, "expected bool"),
    ("a,b", tuple[str, ...], "cannot be given in a spec"),
])
def test_a_value_of_the_wrong_type_names_the_expected_types(raw: str, hint: object, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        convert("f", raw, hint)
    assert err.value.field == "f" and reason in err.value.reason


def test_both_kinds_report_bad_specs_with_the_same_error_and_wording() -> None:
    for create, spec in ((routing.create_policy, "round-robin:x=1,x=2"), (scaling.create_policy, "seed:x=1,x=2")):
        with pytest.raises(ConfigError, match="x='2': given twice"):
            create(spec)
    with pytest.raises(UnknownPolicyError, match="unknown routing policy 'nope'"):
        routing.create_policy("nope")
    with pytest.raises(UnknownPolicyError, match="unknown scaling policy 'nope'"):
        scaling.create_policy("nope")


def test_a_second_class_under_a_taken_name_raises_and_the_same_class_is_idempotent() -> None:
    reg: PolicyRegistry[routing.RoutingPolicy] = PolicyRegistry("routing", routing.RoutingPolicy, "policies.routing",
                                                                "flotilla.test_policies")

    class One(routing.RoutingPolicy):
        def select(self, backends, request):
            return None

    class Two(One):
        pass

    reg.register("one")(One)
    reg.register("one")(One)
    assert reg.entry("one").config is EmptyConfig
    with pytest.raises(ValueError, match="routing policy 'one' is already registered by .*One"):
        reg.register("one")(Two)


PLUGIN = textwrap.dedent('''
    from policies.routing.base import Decision, RoutingPolicy
    from policies.scaling.base import Reason, Recommendation, ScalingPolicy


    class Shadow(RoutingPolicy):
        def select(self, backends, request):
            return Decision(backends[-1].index, "shadow")


    class ShadowScaling(ScalingPolicy):
        def recommend(self, history, fleet):
            return Recommendation(7, Reason.STEADY, "shadow")
''')


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist: str, entry_points: str) -> None:
    """A distribution on sys.path that declares `entry_points` (an entry_points.txt body)."""
    info = tmp_path / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.fixture
def shadow_module(tmp_path: Path) -> Iterator[None]:
    (tmp_path / "shadow_policies.py").write_text(PLUGIN)
    yield
    sys.modules.pop("shadow_policies", None)


@pytest.mark.usefixtures("shadow_module")
def test_a_plug_in_reusing_a_built_in_name_is_an_error_naming_both(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _install(tmp_path, monkeypatch, "shadow_policies", """\
        [flotilla.routing_policies]
        round-robin = shadow_policies:Shadow
        [flotilla.scaling_policies]
        seed = shadow_policies:ShadowScaling
        """)
    for create, name, built_in in ((routing.create_policy, "round-robin", "policies.routing.round_robin.RoundRobin"),
                                   (scaling.create_policy, "seed", "policies.scaling.seed.SeedPolicy")):
        with pytest.raises(ConfigError) as err:
            create(name)
        assert err.value.field == "policy" and err.value.value == name
        assert built_in in err.value.reason and "shadow_policies:" in err.value.reason
    assert "shadow_policies" not in sys.modules  # refused before the plug-in's code runs
    assert routing.create_policy("least-load").name == "least-load"  # other names are unaffected


@pytest.mark.usefixtures("shadow_module")
def test_two_plug_ins_of_one_name_are_an_error_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _install(tmp_path / "a", monkeypatch, "shadow_a", "[flotilla.routing_policies]\nshadow = shadow_policies:Shadow\n")
    _install(tmp_path / "b", monkeypatch, "shadow_b", "[flotilla.routing_policies]\nshadow = shadow_policies:Shadow\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="claimed by both .*shadow_[ab].* and .*shadow_[ab]"):
        routing.create_policy("shadow")

