"""P/D fleets in the simulator: transfer time as the capacity model gives it (hand-computed
figures), link sharing, and a colocated fleet on identical arrivals."""

from __future__ import annotations

import pytest

from fake_engines.perf.catalogue import LinkSpec
from loadgen.results import Slo
from loadgen.trace import TraceRequest
from sim.build import EngineSpec
from sim.link import SharedLink
from sim.pd import PdFleet, PdSim, compare_pd

# llama-3.1-8b: 32 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes (bf16) = 131,072 bytes a
# token on one GPU; a 4096-token prompt is 256 blocks of 16 = 536,870,912 bytes
PROMPT_BYTES = 2 * 32 * 8 * 128 * 2 * 4096
PCIE5_S = 5e-6 + PROMPT_BYTES / 63e9  # 8.5269 ms: PCIe 5.0 x16, 63 GB/s, 5 us
NVLINK_S = 1e-6 + PROMPT_BYTES / 450e9  # 1.1940 ms: NVLink 4, 450 GB/s, 1 us
SPEC = EngineSpec(model="llama-3.1-8b", gpu="h100")


def _one_prompt(n: int = 1, at_s: float = 0.0) -> list[TraceRequest]:
    return [TraceRequest(timestamp_s=at_s, input_length=4096, output_length=8) for _ in range(n)]


def test_shared_link_alone_takes_latency_plus_bytes_over_bandwidth_and_two_flows_share_it() -> None:
    link = SharedLink(LinkSpec("test", gbps_per_direction=1.0, latency_us=0.0))  # 1e9 bytes/s
    link.add("a", 1e9, 0.0)
    assert link.next_done_s() == pytest.approx(1.0)
    link.add("b", 1e9, 0.5)  # a has 0.5e9 left; from now each gets 0.5e9 bytes/s
    assert link.next_done_s() == pytest.approx(1.5)
    assert link.take_done(1.5) == ["a"]
    assert link.next_done_s() == pytest.approx(2.0)  # b: 0.5e9 moved while shared, 0.5e9 alone
    assert link.take_done(2.0) == ["b"] and link.next_done_s() is None
    assert link.bytes_moved == pytest.approx(2e9) and link.peak_flows == 2


def test_pd_transfer_follows_the_capacity_model_and_enters_ttft() -> None:
    runs = {}
    for name in ("pcie5", "nvlink"):
        sim = PdSim(SPEC, PdFleet(1, 1, "round-robin", "round-robin", name))
        runs[name] = (sim, sim.run(_one_prompt()))
    (pcie_sim, pcie), (_, nvlink) = runs["pcie5"], runs["nvlink"]
    assert pcie.meta["kv_transfer"]["blocks"] == 256
    assert pcie.meta["kv_transfer"]["bytes_per_gpu"] == PROMPT_BYTES
    assert pcie.meta["kv_transfer"]["mean_s"] == pytest.approx(PCIE5_S, abs=2e-9)
    assert nvlink.meta["kv_transfer"]["mean_s"] == pytest.approx(NVLINK_S, abs=2e-9)
    # everything but the link is the same: TTFT differs by exactly the transfer times' difference
    ttft_gap = pcie.requests[0].ttft_s - nvlink.requests[0].ttft_s
    assert ttft_gap == pytest.approx(PCIE5_S - NVLINK_S, abs=1e-8)
    # the decode side computed one prompt token (the last), the rest was loaded
    rec = pcie.requests[0]
    assert rec.ok and rec.completion_tokens == 8 and rec.cached_tokens == 4095
    prefill_core = pcie_sim.prefill.replicas[0].core  # type: ignore[attr-defined]
    assert prefill_core.held_for_transfer == {}  # blocks released once pulled
    assert pcie.meta["gpus"] == 2 and pcie.meta["pd"]["kv_link"] == "pcie5"


def test_concurrent_pulls_into_one_decode_replica_share_its_link() -> None:
    # two prefill replicas finish identical-length prompts together; both pull into one decoder
    sim = PdSim(SPEC, PdFleet(2, 1, "round-robin", "round-robin", "pcie5"))
    result = sim.run(_one_prompt(2))
    shared_s = 5e-6 + 2 * PROMPT_BYTES / 63e9  # each at half the bandwidth, to the end
    assert sim.stats.seconds == pytest.approx([shared_s, shared_s], abs=2e-9)
    assert result.meta["kv_transfer"]["peak_concurrent"] == 2
    assert result.meta["kv_transfer"]["alone_mean_s"] == pytest.approx(PCIE5_S, abs=2e-9)


def test_pd_and_colocated_fleets_get_the_same_arrivals_and_gpus() -> None:
    def workload() -> list[TraceRequest]:
        return [TraceRequest(timestamp_s=0.1 * i, input_length=512 + 64 * (i % 5), output_length=16)
                for i in range(30)]

    colocated, pd = compare_pd(workload, SPEC, [PdFleet(1, 2)], colocated_replicas=3,
                               slo=Slo(ttft_s=1.0, tpot_s=0.1))
    assert [colocated.label, pd.label] == ["colocated x3", "P/D 1:2 ib400"]
    assert colocated.meta["gpus"] == pd.meta["gpus"] == 3
    arrivals = [[(r.index, r.scheduled_time_s) for r in run.requests] for run in (colocated, pd)]
    assert arrivals[0] == arrivals[1] and len(arrivals[0]) == 30
    assert all(r.ok for r in pd.requests) and pd.summary.goodput_per_s is not None
    # the client's tokens all come from the decode pool, the prefill pool produced one each
    assert sum(r.completion_tokens or 0 for r in pd.requests) == 30 * 16


def test_a_pd_fleet_needs_vllm_and_a_known_link() -> None:
    with pytest.raises(ValueError, match="kv link"):
        PdFleet(1, 1, kv_link="carrier-pigeon")
    with pytest.raises(ValueError, match="vLLM"):
        PdSim(EngineSpec(kind="fixed"), PdFleet(1, 1))


@pytest.mark.parametrize(("requests", "grows"), [
    # long prompts, short answers: prefill is the bottleneck
    ([TraceRequest(timestamp_s=0.1 * i, input_length=8000, output_length=8) for i in range(150)], "prefill"),
    # short prompts, long answers: decode is
    ([TraceRequest(timestamp_s=0.05 * i, input_length=200, output_length=400) for i in range(300)], "decode"),
])
def test_each_pool_scales_on_its_own_signals(requests: list[TraceRequest], grows: str) -> None:
    spec = EngineSpec(model="llama-3.1-8b", gpu="h100", num_gpu_blocks_override=1500,
                      scheduler={"max_model_len": 16384})
    limits = "interval_s=3,scale_down_cooldown_s=60,max_replicas=6"
    fleet = PdFleet(1, 1, "round-robin", "least-load", "ib400", f"pd-prefill:{limits}", f"pd-decode:{limits}")
    pd = PdSim(spec, fleet, cold_start=3.0).run(requests).meta["pd"]
    other = "decode" if grows == "prefill" else "prefill"
    assert pd[f"{grows}_peak_replicas"] >= 2 and pd[f"{grows}_scale_events"][0][1] >= 2
    assert pd[f"{other}_peak_replicas"] == 1 and pd[f"{other}_scale_events"] == []
