"""Which clock a run is reported in, and the conversion of a wall-clock result to modelled time."""

import pytest

from loadgen.results import RequestRecord, RunResult
from loadgen.stats import parse_slo, summarize
from loadgen.timebase import count_scales, in_time_base, parse_scale, scaled_record, time_base


def _wall_result(slo: str | None = None) -> RunResult:
    # two requests, each 5 ms to the first token and 1 ms per token after it on the wall clock
    recs = [RequestRecord(index=i, scheduled_time_s=0.1 * i, send_time_s=0.1 * i, ttft_s=0.005, tpot_s=0.001,
                          e2e_s=0.014, itl_s=[0.001] * 9, prompt_tokens=10, completion_tokens=10, ok=True)
            for i in range(2)]
    parsed = parse_slo(slo) if slo else None
    return RunResult(summary=summarize(recs, parsed), requests=recs, meta={"target_time_scales": {"0.05": 2}},
                     replicas=[(0.0, 2), (1.0, 3)])


def test_one_scale_named_by_every_response_is_used_and_said():
    base = time_base({"0.05": 40})
    assert (base.scale, base.source, base.name) == (0.05, "target", "modelled")
    assert base.note.startswith("times are modelled: measured wall times / 0.05 (time scale from target)")


def test_different_scales_are_reported_in_wall_time_and_named_never_guessed():
    base = time_base({"0.05": 30, "0.1": 7, "none": 3})
    assert base.scale is None and base.name == "wall"
    assert "different time scales (0.05 on 30, 0.1 on 7, none on 3)" in base.note
    assert "--time-scale" in base.note


def test_a_target_naming_no_scale_stays_in_wall_time():
    for seen in ({}, {"none": 12}):
        base = time_base(seen)
        assert base.scale is None and base.note == "times are wall-clock: the target named no time scale"


def test_the_flags_win_over_the_target_and_say_what_the_target_named():
    forced = time_base({"0.05": 4}, override=0.1)
    assert (forced.scale, forced.source) == (0.1, "--time-scale")
    assert "wall times / 0.1 (--time-scale; the target said 0.05)" in forced.note
    assert time_base({}, override=0.5).scale == 0.5
    wall = time_base({"0.05": 4}, wall=True)
    assert wall.scale is None and wall.note == "times are wall-clock (--wall-time; the target's time scale is 0.05)"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_an_unusable_time_scale_flag_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match="--time-scale must be a positive number"):
        time_base({}, override=bad)


@pytest.mark.parametrize(("text", "scale"), [("0.05", 0.05), ("1", 1.0), (None, None), ("", None), ("abc", None),
                                             ("0", None), ("-0.5", None), ("nan", None), ("inf", None)])
def test_header_values_parse_to_positive_finite_scales_only(text, scale):
    assert parse_scale(text) == scale


def test_counts_merge_spellings_of_one_scale_and_unusable_values():
    assert count_scales({"0.05": 3, "5e-2": 1, None: 2, "bogus": 1}) == {"0.05": 4, "none": 3}


def test_every_time_of_a_record_is_divided_by_the_scale():
    rec = RequestRecord(index=3, backend="b", scheduled_time_s=0.1, send_time_s=0.11, ttft_s=0.02,
                        itl_s=[0.005, 0.01], tpot_s=0.0075, e2e_s=0.035, ok=True)
    out = scaled_record(rec, 0.05)
    assert (out.backend, out.scheduled_time_s, out.send_time_s, out.ttft_s, out.tpot_s, out.e2e_s) == (
        "b", pytest.approx(2.0), pytest.approx(2.2), pytest.approx(0.4), pytest.approx(0.15), pytest.approx(0.7))
    assert out.itl_s == pytest.approx([0.1, 0.2]) and rec.ttft_s == 0.02  # the measured record is untouched


def test_a_modelled_result_has_modelled_figures_rates_replicas_and_meta():
    wall = _wall_result()
    out = in_time_base(wall, time_base(wall.meta["target_time_scales"]))
    assert out.summary.tpot_s.p50 == pytest.approx(0.02) and out.summary.ttft_s.p50 == pytest.approx(0.1)
    assert out.summary.duration_s == pytest.approx(wall.summary.duration_s / 0.05)
    assert out.summary.request_throughput_per_s == pytest.approx(wall.summary.request_throughput_per_s * 0.05)
    assert out.replicas == [(0.0, 2), (pytest.approx(20.0), 3)]
    assert (out.meta["time_base"], out.meta["time_scale"], out.meta["time_scale_source"]) == ("modelled", 0.05, "target")


def test_slos_are_judged_in_the_time_base_printed():
    # TPOT 1 ms on the wall clock meets tpot=0.005; the same run in modelled time (20 ms) does not
    wall = _wall_result("tpot=0.005")
    assert wall.summary.goodput_per_s == pytest.approx(wall.summary.request_throughput_per_s)
    modelled = in_time_base(wall, time_base({"0.05": 2}))
    assert modelled.summary.goodput_per_s == 0.0 and modelled.summary.slo == parse_slo("tpot=0.005")
    kept = in_time_base(wall, time_base({"0.05": 2}, wall=True))
    assert kept.summary == wall.summary and kept.requests == wall.requests and kept.meta["time_base"] == "wall"
