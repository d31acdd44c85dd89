import math
import random
import statistics

import pytest

from loadgen.prompts import PromptBuilder
from loadgen.synthetic import LengthDist, LoraMix, synthetic_requests


def test_poisson_spec_gives_the_rate_lengths_and_a_shared_system_prompt():
    reqs = list(synthetic_requests("poisson:rate=20,duration=50,input=300,output=uniform:10:30,system=64", seed=5))
    assert len(reqs) == pytest.approx(1000, rel=0.1)
    assert all(r.input_length == 364 and 10 <= r.output_length <= 30 for r in reqs)
    builder = PromptBuilder()
    a, b = builder.build(reqs[0], 0), builder.build(reqs[1], 1)
    assert a[:256] == b[:256] and a[256:272] != b[256:272]  # 64 shared tokens, then unique text


def test_the_same_seed_replays_the_same_workload_and_another_seed_does_not():
    spec = "gamma:rate=5,burstiness=0.5,duration=20,input=exp:200,lora=a:0.5"
    assert list(synthetic_requests(spec, seed=1)) == list(synthetic_requests(spec, seed=1))
    assert list(synthetic_requests(spec, seed=1)) != list(synthetic_requests(spec, seed=2))


def test_lora_mix_sends_each_adapter_its_share():
    reqs = list(synthetic_requests("poisson:rate=100,duration=50,lora=a:0.5/b:0.2", seed=3))
    picks = [r.lora for r in reqs]
    assert picks.count("a") / len(picks) == pytest.approx(0.5, abs=0.03)
    assert picks.count("b") / len(picks) == pytest.approx(0.2, abs=0.03)
    assert picks.count(None) / len(picks) == pytest.approx(0.3, abs=0.03)


def test_length_distributions_have_their_parameters():
    rng = random.Random(7)
    logn = [LengthDist.parse("lognormal:1000:0.5").sample(rng) for _ in range(5000)]
    exp = [LengthDist.parse("exp:300").sample(rng) for _ in range(5000)]
    assert statistics.median(logn) == pytest.approx(1000, rel=0.05)
    assert statistics.mean(exp) == pytest.approx(300, rel=0.05)
    assert LengthDist.parse("42").sample(rng) == 42


@pytest.mark.parametrize(("spec", "message"), [
    ("zipf:rate=1", "unknown synthetic workload 'zipf'"),
    ("poisson:rate=1,burstiness=2", "use gamma"),
    ("poisson:speed=3", r"unknown poisson option\(s\) \['speed'\]"),
    ("poisson:input=normal:3:4", "unknown length distribution 'normal'"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        list(synthetic_requests(spec))


def test_lora_shares_over_one_are_rejected():
    with pytest.raises(ValueError, match="sum to <= 1"):
        LoraMix.parse("a:0.7/b:0.4")


def test_diurnal_rate_follows_the_day_from_trough_at_2am_to_peak_at_2pm() -> None:
    from loadgen.synthetic import DiurnalWorkload

    day = DiurnalWorkload(peak=10, trough=2, duration_s=2400, slots=24)  # 100 s per hour of the day
    assert day.day_rate(200) == pytest.approx(2) and day.day_rate(1400) == pytest.approx(10)
    assert day.day_rate(850) == pytest.approx(day.day_rate(899))  # constant within the slot
    assert day.day_rate(800) == pytest.approx(2 + 8 * (1 + math.cos(2 * math.pi * -6 / 24)) / 2)


def test_diurnal_bursts_multiply_the_rate_at_seeded_moments_and_replay_exactly() -> None:
    import random

    from loadgen.synthetic import parse_spec

    spec = "diurnal:peak=4,trough=4,duration=600,bursts=1,burst=5,burst_s=60,input=64,output=8"
    profile = parse_spec(spec).profile(random.Random(3))  # type: ignore[union-attr]
    assert sorted({rate for _, rate in profile.steps}) == [4.0, 20.0]
    start = min(t for t, r in profile.steps if r == 20.0)
    assert min(t for t, r in profile.steps if t > start and r == 4.0) == pytest.approx(start + 60)
    first, again = list(synthetic_requests(spec, seed=3)), list(synthetic_requests(spec, seed=3))
    assert first == again and 600 * 4 * 0.8 < len(first) < (600 * 4 + 60 * 16) * 1.2
    burst = sum(1 for r in first if start <= r.timestamp_s < start + 60)
    assert burst > 3 * 60 * 4  # five times the base rate for that minute


def test_an_unknown_diurnal_option_is_named() -> None:
    with pytest.raises(ValueError, match="unknown diurnal option.*'peek'"):
        list(synthetic_requests("diurnal:peek=3"))
