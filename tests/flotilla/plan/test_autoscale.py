import json

import pytest

from flotilla.cli import main
from flotilla.plan.autoscale import format_run, half_up
from policies.scaling.fluid import FluidScenario, RateProfile, simulate
from policies.scaling.registry import create_policy

EXAMPLE_18_ARGS = ["plan", "autoscale", "--capacity", "2", "--target", "0.8", "--interval", "30",
                   "--drain-s", "60", "--cold-start", "70,190", "--rate", "0:2,120:2,240:8,600:8",
                   "--duration", "600"]

COLD_START_70 = """\
cold start 70 s
  t= 60 s  rate 2.0/s  ready 1  starting 1  waiting    0
  t=120 s  rate 2.0/s  ready 2  starting 0  waiting    0
  t=180 s  rate 5.0/s  ready 2  starting 1  waiting   10
  t=240 s  rate 8.0/s  ready 2  starting 5  waiting  158
  t=300 s  rate 8.0/s  ready 5  starting 3  waiting  212
  t=360 s  rate 8.0/s  ready 8  starting 0  waiting    0
  t=420 s  rate 8.0/s  ready 8  starting 0  waiting    0
  t=480 s  rate 8.0/s  ready 8  starting 0  waiting    0
  t=540 s  rate 8.0/s  ready 8  starting 0  waiting    0
  t=600 s  rate 8.0/s  ready 8  starting 0  waiting    0
  peak waiting 254 requests, peak queueing delay 49 s"""

COLD_START_190 = """\
cold start 190 s
  t= 60 s  rate 2.0/s  ready 1  starting 1  waiting    0
  t=120 s  rate 2.0/s  ready 1  starting 1  waiting    0
  t=180 s  rate 5.0/s  ready 1  starting 3  waiting   89
  t=240 s  rate 8.0/s  ready 2  starting 6  waiting  315
  t=300 s  rate 8.0/s  ready 2  starting 9  waiting  555
  t=360 s  rate 8.0/s  ready 2  starting 12  waiting  795
  t=420 s  rate 8.0/s  ready 6  starting 8  waiting  747
  t=480 s  rate 8.0/s  ready 10  starting 4  waiting  219
  t=540 s  rate 8.0/s  ready 13  starting 1  waiting    0
  t=600 s  rate 8.0/s  ready 14  starting 0  waiting    0
  peak waiting 831 requests, peak queueing delay 208 s"""


def test_cli_prints_example_18_tables_line_for_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(EXAMPLE_18_ARGS) == 0
    assert capsys.readouterr().out == COLD_START_70 + "\n" + COLD_START_190 + "\n"


@pytest.mark.parametrize(("cold_start_s", "table"), [(70, COLD_START_70), (190, COLD_START_190)])
def test_library_run_of_seed_policy_gives_example_18_table(cold_start_s: int, table: str) -> None:
    policy = create_policy("seed:capacity_rps=2,target_utilization=0.8,interval_s=30,drain_s=60")
    run = simulate(policy, RateProfile.parse("0:2,120:2,240:8,600:8"),
                   FluidScenario(capacity_rps=2, cold_start_s=cold_start_s, duration_s=600))
    assert format_run(run) == table


def test_json_reports_peaks_and_overshoot_to_14_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE_18_ARGS, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["cold_start_s"] for r in runs] == [70, 190]
    assert [r["peak_replicas"] for r in runs] == [8, 14]
    assert [round(r["peak_waiting"]) for r in runs] == [254, 831]
    assert runs[1]["rows"][3] == {"t_s": 240, "rate_rps": pytest.approx(7.95), "ready": 2, "starting": 6,
                                  "waiting": pytest.approx(315, abs=0.5)}


def test_cold_start_aware_policy_through_cli_peaks_at_9_not_14_and_settles_at_5(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = [a if a != "70,190" else "190" for a in EXAMPLE_18_ARGS]
    assert main([*args, "--policy", "cold-start-aware", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["policy"] == "cold-start-aware"
    assert run["peak_replicas"] == 9
    # 8 req/s at 80% of 2 req/s needs 5 replicas; the 300 s cooldown lets it shrink by t=600.
    assert (run["rows"][-1]["ready"], run["rows"][-1]["starting"]) == (5, 0)


def test_printf_rounding_is_half_up_like_the_lesson() -> None:
    # 88.5 waiting at t=180 prints 89 and a 48.5 s delay prints 49 in the lesson's output.
    assert (half_up(88.5, 0), half_up(48.5, 0), half_up(4.95, 1), half_up(0.0, 0)) == ("89", "49", "5.0", "0")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--policy", "no-such", "unknown scaling policy 'no-such'; valid policies: "),
    ("--policy", "seed:bogus=1", "bogus='1': unknown parameter of seed"),
    ("--policy", "seed:target_utilization=1.5", "target_utilization=1.5: must be in (0, 1]"),
    ("--rate", "0:2,abc", "rate='abc': expected time:rps"),
    ("--rate", "10:2,5:3", "times must increase strictly"),
    ("--cold-start", "fast", "cold_start='fast': expected seconds"),
])
def test_bad_input_exits_2_with_a_message_naming_the_field(
        capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    assert main(["plan", "autoscale", flag, value]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_flags_not_given_leave_the_policy_its_own_interval(capsys: pytest.CaptureFixture[str]) -> None:
    # KPA ticks every 2 s: asked for zero first at t=1, the idle replica goes at t=31 (30 s grace)
    argv = ["plan", "autoscale", "--policy", "kpa:min_replicas=0", "--rate", "0:0", "--duration", "60",
            "--report-every", "10", "--json"]
    assert main(argv) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert [row["ready"] for row in run["rows"]] == [1, 1, 1, 0, 0, 0]
    assert main([*argv, "--interval", "30"]) == 0  # decisions at t=29 and t=59 only
    (slow,) = json.loads(capsys.readouterr().out)["runs"]
    assert [row["ready"] for row in slow["rows"]] == [1, 1, 1, 1, 1, 1]
