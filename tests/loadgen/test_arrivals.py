import random
import statistics

import pytest

from loadgen.arrivals import RateProfile, arrival_times, jittered
from loadgen.readers import read_trace
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


def test_poisson_gaps_are_exponential_with_the_asked_rate():
    times = list(arrival_times(random.Random(1), RateProfile.parse("50"), 200.0))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) == pytest.approx(10_000, rel=0.03)
    assert statistics.mean(gaps) == pytest.approx(0.02, rel=0.03)
    # exponential: the coefficient of variation is 1, and gaps are not clipped
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)
    assert max(gaps) > 5 * 0.02


def test_gamma_burstiness_below_one_keeps_the_rate_but_raises_the_variation():
    times = list(arrival_times(random.Random(2), RateProfile.parse("50"), 200.0, burstiness=0.25))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.02, rel=0.1)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(2.0, rel=0.1)  # 1/sqrt(0.25)


def test_a_rate_profile_sends_each_segment_at_its_own_rate():
    times = list(arrival_times(random.Random(3), RateProfile.parse("10@0/100@20/0@40"), 60.0))
    counts = [sum(lo <= t < lo + 20 for t in times) for lo in (0, 20, 40)]
    assert counts[0] == pytest.approx(200, rel=0.2) and counts[1] == pytest.approx(2000, rel=0.1)
    assert counts[2] == 0


def test_the_same_seed_gives_the_same_arrivals():
    profile = RateProfile.parse("7")
    assert list(arrival_times(random.Random(9), profile, 30)) == list(arrival_times(random.Random(9), profile, 30))


@pytest.mark.parametrize("spec", ["5@3", "5@0/6@0", "0", "-1"])
def test_bad_rate_profiles_are_rejected(spec):
    with pytest.raises(ValueError, match="rate profile"):
        RateProfile.parse(spec)


def test_jitter_spreads_mooncake_ticks_inside_the_tick_and_keeps_order():
    trace = list(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))
    smooth = list(jittered(trace, 3.0, random.Random(4)))
    times = [r.timestamp_s for r in smooth]
    assert len(smooth) == 162 and times == sorted(times)
    assert len(set(times)) == 162  # no two requests share a millisecond any more
    assert sorted(r.input_length for r in smooth) == sorted(r.input_length for r in trace)
    original = {r.hash_ids: r.timestamp_s for r in trace}
    assert len(original) == 162
    assert all(0 <= r.timestamp_s - original[r.hash_ids] < 3.0 for r in smooth)
