import pytest

from policies.scaling.base import ConfigError
from policies.scaling.fluid import FluidRow, FluidScenario, RateProfile, simulate
from policies.scaling.registry import create_policy

EXAMPLE_18_RATE = RateProfile.parse("0:2,120:2,240:8,600:8")


def test_rate_profile_is_piecewise_linear_and_flat_outside_its_points() -> None:
    profile = RateProfile.parse("10:2, 20:4, 40:0")
    assert [profile.rate_at(t) for t in (0, 10, 15, 20, 30, 40, 99)] == [2.0, 2.0, 3.0, 4.0, 2.0, 0.0, 0.0]


def test_example_18_ramp_matches_the_lesson_formula() -> None:
    assert [EXAMPLE_18_RATE.rate_at(t) for t in (119, 179, 239, 240)] == [2.0, 2 + 6.0 * 59 / 120, 2 + 6.0 * 119 / 120, 8.0]


@pytest.mark.parametrize(("text", "message"), [
    ("", "needs at least one time:rps point"),
    ("0:2,0:3", "times must increase strictly"),
    ("0:-1", "rates must be >= 0"),
    ("5", "expected time:rps"),
])
def test_bad_rate_profiles_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RateProfile.parse(text)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"capacity_rps": 0}, "capacity_rps"),
    ({"cold_start_s": -1}, "cold_start_s"),
    ({"duration_s": 0}, "duration_s"),
    ({"report_every_s": 0}, "report_every_s"),
])
def test_scenario_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        FluidScenario(**kwargs)
    assert exc.value.field == field


def test_seed_run_with_190_s_cold_start_peaks_at_14_replicas_and_831_waiting() -> None:
    run = simulate(create_policy("seed"), EXAMPLE_18_RATE, FluidScenario(cold_start_s=190))
    assert (run.peak_replicas, round(run.peak_waiting), run.peak_queueing_delay_s) == (14, 831, 207.75)
    assert run.rows[5] == FluidRow(360, 8.0, 2, 12, pytest.approx(795, abs=0.5))


def test_cold_start_aware_does_not_overshoot_where_seed_does() -> None:
    seed = simulate(create_policy("seed"), EXAMPLE_18_RATE, FluidScenario(cold_start_s=190))
    aware = simulate(create_policy("cold-start-aware"), EXAMPLE_18_RATE, FluidScenario(cold_start_s=190))
    assert (seed.peak_replicas, aware.peak_replicas) == (14, 9)
    assert aware.scale_ups < seed.scale_ups
    # the queue cannot be beaten while no new capacity can arrive, but it is not made worse
    assert round(aware.peak_waiting) == round(seed.peak_waiting) == 831


def test_cold_start_aware_with_70_s_cold_start_needs_6_replicas_where_seed_takes_8() -> None:
    aware = simulate(create_policy("cold-start-aware"), EXAMPLE_18_RATE, FluidScenario(cold_start_s=70))
    assert (aware.peak_replicas, round(aware.peak_waiting)) == (6, 254)
    # 8 / 1.6 = 5 replicas once the 300 s scale-down cooldown has passed
    assert (aware.rows[-1].ready, aware.rows[-1].starting) == (5, 0)


def test_kpa_scales_an_idle_fleet_to_zero_after_the_grace_period() -> None:
    run = simulate(create_policy("kpa:min_replicas=0"), RateProfile.parse("0:0"),
                   FluidScenario(duration_s=60, report_every_s=10))
    # the first tick (t=1) asks for zero; 30 s of grace later (t=31) the replica goes
    assert [(row.t_s, row.ready) for row in run.rows] == [(10, 1), (20, 1), (30, 1), (40, 0), (50, 0), (60, 0)]
    assert run.peak_queueing_delay_s == 0.0


def test_limits_cap_the_fleet_in_the_fluid_model() -> None:
    run = simulate(create_policy("seed:max_replicas=4,max_scale_up_step=1"), EXAMPLE_18_RATE,
                   FluidScenario(cold_start_s=70))
    assert run.peak_replicas == 4
    assert run.rows[-1].ready == 4
