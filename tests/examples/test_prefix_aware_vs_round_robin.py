"""Worked comparison: prefix-aware routing beats round-robin on agent sessions.

The seed lesson's Example 16: 6 agent sessions of 5 turns on 4 replicas; every prompt starts
with the same 2,000-token system prompt and each turn appends 2,400 (sessions 0 and 4) or 600
tokens to its session's history. Round-robin sends a session back to a replica that saw it two
turns earlier and reuses 56.7 % of prompt tokens; a cache-aware router (SGLang's cache_aware,
the reference routers' prefix-aware) sends each turn where its history is cached. With
`block_size=8` every prompt is whole KV blocks, so the engines' prefix caches count reuse
exactly as the seed's program does. The same test runs in the simulator and live.
"""

import pytest

from flotilla.testing import compare_policies

AGENTS = "agents:sessions=6,turns=5,system=2000,growth=2400/600/600/600/2400/600,think=2,stagger=0.1"
FLEET = {"engines": 4, "model": "llama-3.1-8b", "gpu": "h100", "time_scale": 0.2,
         "engine_options": {"block_size": 8}}


@pytest.fixture(params=["flotilla_sim", "flotilla_fleet"])
def fleet_factory(request):
    """The same comparison, simulated and live."""
    return request.getfixturevalue(request.param)


async def test_prefix_aware_reuses_more_of_each_agent_prompt_than_round_robin(fleet_factory):
    table = await compare_policies(fleet_factory, ["round-robin", "prefix-aware"], AGENTS, **FLEET)
    print(table.table(["prefix_hit_rate", "ttft_p50_s", "ttft_p90_s", "busiest_backend_share"]))
    rr, pa = table["round-robin"], table["prefix-aware"]
    assert rr["num_ok"] == pa["num_ok"] == 30
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.15
    assert table.best("prefix_hit_rate", lower_is_better=False) == "prefix-aware"
    if rr.result.meta["source"] == "sim":
        # the seed's round-robin figure: 95,200 of 168,000 prompt tokens reused
        assert rr.result.summary.total_cached_tokens == 95200
        assert round(100 * rr["prefix_hit_rate"], 1) == 56.7
        # every later turn finds its whole previous prompt (the seed's session-affinity 124,000);
        # in turn 1 sessions 3-5 find the system prompt, while sessions 1 and 2 arrive before
        # session 0's prefill has finished and put it in the cache
        assert pa.result.summary.total_cached_tokens == 124000 + 3 * 2000
        # less prefill per turn: the slowest first tokens come sooner
        assert pa["ttft_p90_s"] < rr["ttft_p90_s"]
