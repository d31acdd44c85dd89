"""Live and simulated runs of the same two-minute workload agree: the simulator runs the code that ships.

Two look-alike vLLM engines (Llama 3.1 8B on L40S) behind the proxy, at 0.8 of real time, against
the same fleet in the simulator. Prompts are long (4,000-8,000 tokens, prefill 0.3-0.6 s) so the
few milliseconds the live path spends in HTTP, JSON and tokenizing, which the time scale
magnifies, stay small against what is modelled. Prefix hits come from a shared 2,048-token
system prompt and must match exactly: both runs use the same engine core on the same tokens.
"""

from __future__ import annotations

import pytest

WORKLOAD = "poisson:rate=0.4,duration=120,input=uniform:4000:8000,output=uniform:8:32,system=2048"
FLEET = {"engines": 2, "model": "llama-3.1-8b", "gpu": "l40s", "policy": "round-robin", "time_scale": 0.8}


def _within(live: float, sim: float, tolerance: float = 0.10) -> bool:
    return abs(live - sim) <= tolerance * abs(sim)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_live_and_simulated_two_minute_runs_agree_within_ten_percent(flotilla_fleet, flotilla_sim) -> None:
    simulated = await (await flotilla_sim(**FLEET)).replay(WORKLOAD, seed=3)
    live = await (await flotilla_fleet(**FLEET)).replay(WORKLOAD, seed=3)
    s, lv = simulated.summary, live.summary
    print(f"mean TTFT  sim {s.ttft_s.mean:.4f} s  live {lv.ttft_s.mean:.4f} s")
    print(f"p90 E2E    sim {s.e2e_s.p90:.4f} s  live {lv.e2e_s.p90:.4f} s")
    print(f"hit rate   sim {s.prefix_hit_rate:.4f}    live {lv.prefix_hit_rate:.4f}")
    assert s.num_requests == lv.num_requests == s.num_ok == lv.num_ok > 30
    assert _within(lv.ttft_s.mean, s.ttft_s.mean)
    assert _within(lv.e2e_s.p90, s.e2e_s.p90)
    assert _within(lv.prefix_hit_rate, s.prefix_hit_rate)
    assert s.prefix_hit_rate > 0.15
