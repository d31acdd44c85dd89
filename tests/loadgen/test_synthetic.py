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
