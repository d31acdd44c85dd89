from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.step_time import (
    decode_batch,
    decode_run_s,
    pipeline_step_interval_s,
    prefill_batch,
    step_breakdown,
    step_time_s,
)
from tests.conftest import DATA

CALIBRATION = DATA / "calibration" / "h200-llama-3.1-8b.json"
CAT = load_catalogue()
H200, H100 = CAT.gpu("h200"), CAT.gpu("h100")
LLAMA_8B, LLAMA_70B = CAT.model("llama-3.1-8b"), CAT.model("llama-3.1-70b")


def _rows():
    return json.loads(CALIBRATION.read_text())["rows"]


def _batch(row):
    make = decode_batch if row["kind"] == "decode" else prefill_batch
    return make(row["batch"], row["tokens"])


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['kind']}-b{r['batch']}-t{r['tokens']}")
def test_every_calibration_row_is_predicted_within_15_percent(row):
    predicted_ms = step_time_s(CAT.model(row["model"]), H200, _batch(row)) * 1e3
    assert predicted_ms == pytest.approx(row["ms"], rel=0.15)


def test_read_weights_match_the_calibration_weight_bytes():
    # the embedding table is only looked up; every other weight is read once per step
    read = LLAMA_8B.weight_bytes(16) - LLAMA_8B.embedding_params * 2
    assert read == pytest.approx(_rows()[0]["weight_bytes"], rel=1e-3)


def test_decode_cost_grows_with_context_and_batch():
    assert step_time_s(LLAMA_8B, H200, decode_batch(64, 8192)) > step_time_s(LLAMA_8B, H200, decode_batch(64, 2048))
    assert step_time_s(LLAMA_8B, H200, decode_batch(128, 1024)) > step_time_s(LLAMA_8B, H200, decode_batch(1, 1024))


def test_slower_memory_gives_slower_decode():
    assert step_time_s(LLAMA_8B, H100, decode_batch(1, 1024)) > step_time_s(LLAMA_8B, H200, decode_batch(1, 1024))


def test_tensor_parallel_over_nvlink_beats_one_gpu_and_pcie_costs_more():
    batch = decode_batch(64, 2048)
    one = step_time_s(LLAMA_70B, H200, batch)
    nvlink = step_time_s(LLAMA_70B, H200, batch, Layout(tp=4))
    pcie = step_time_s(LLAMA_70B, H200, batch, Layout(tp=4, link="pcie4"))
    assert nvlink < one / 2
    assert pcie > nvlink
    parts = step_breakdown(LLAMA_70B, H200, batch, Layout(tp=4))
    assert parts.allreduce_s > 0 and parts.stage_s == pytest.approx(parts.compute_s + parts.allreduce_s)


def test_pipeline_pass_spans_all_stages_and_interval_one_stage():
    batch = decode_batch(32, 1024)
    layout = Layout(pp=4)
    parts = step_breakdown(LLAMA_70B, H200, batch, layout)
    assert step_time_s(LLAMA_70B, H200, batch, layout) == pytest.approx(4 * parts.stage_s + 3 * parts.transfer_s)
    interval = pipeline_step_interval_s(LLAMA_70B, H200, batch, layout)
    assert interval == pytest.approx(parts.stage_s + parts.transfer_s)
    assert step_time_s(LLAMA_70B, H200, batch) == pytest.approx(
        pipeline_step_interval_s(LLAMA_70B, H200, batch))


def test_moe_decode_reads_only_the_experts_it_hits():
    mixtral = CAT.model("mixtral-8x7b")
    one = step_time_s(mixtral, H200, decode_batch(1, 1024))
    dense_equivalent = step_time_s(replace(mixtral, experts=0, top_k=0), H200, decode_batch(1, 1024))
    assert one < dense_equivalent / 2


def test_expert_parallel_pays_all_to_all_and_imbalance():
    qwen = CAT.model("qwen3-30b-a3b")
    layout = Layout(tp=1, dp=4, ep=True)
    batch = decode_batch(64, 1024)
    parts = step_breakdown(qwen, H100, batch, layout)
    assert parts.all_to_all_s > 0
    assert step_time_s(qwen, H100, batch, layout, expert_imbalance=2.13) > step_time_s(qwen, H100, batch, layout)


def test_layers_left_on_the_cpu_slow_the_step():
    batch = decode_batch(1, 512)
    full = step_time_s(LLAMA_8B, H200, batch)
    half = step_time_s(LLAMA_8B, H200, batch, Layout(gpu_layer_fraction=0.5))
    assert half > 10 * full


def test_bad_layout_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="Layout.tp"):
        step_time_s(LLAMA_8B, H200, StepBatch(decode_seqs=1), Layout(tp=0))
    with pytest.raises(ValueError, match="gpu_layer_fraction"):
        step_time_s(LLAMA_8B, H200, StepBatch(decode_seqs=1), Layout(gpu_layer_fraction=1.5))


@pytest.mark.parametrize("layout", [Layout(), Layout(tp=2), Layout(pp=2)])
def test_decode_run_times_equal_step_time_bit_for_bit(layout: Layout) -> None:
    cat = load_catalogue()
    for model_name, gpu_name in (("llama-3.1-8b", "h100"), ("llama-3.1-70b", "h200")):
        model, gpu = cat.model(model_name), cat.gpu(gpu_name)
        for seqs, ctx in ((1, 17), (37, 37 * 900), (256, 256 * 4000)):
            first = StepBatch(decode_seqs=seqs, decode_context_tokens=ctx, lora_adapters=1)
            times = decode_run_s(model, gpu, first, seqs, 40, layout)
            assert times == [step_time_s(model, gpu, StepBatch(decode_seqs=seqs, decode_context_tokens=ctx + i * seqs,
                                                               lora_adapters=1), layout) for i in range(40)]
