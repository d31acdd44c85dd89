from fake_engines.core import EngineRequest
from fake_engines.core._step_builder import StepBuilder, is_decode
from fake_engines.perf.batch import StepBatch


def _req(request_id: str, prompt_len: int, computed: int, outputs: int = 0, lora: str | None = None):
    request = EngineRequest(request_id, [1] * prompt_len, max_tokens=9, output_len=9, lora=lora)
    request.output_token_ids = [2] * outputs
    request.num_computed_tokens = computed
    return request


def test_prefill_chunks_and_decodes_fill_the_step_batch():
    builder = StepBuilder(token_budget=200)
    builder.add(_req("fresh", 20, 0), 20)
    builder.add(_req("second-chunk", 200, 63), 63)
    builder.add(_req("decode", 30, 31, outputs=2, lora="sql"), 1)
    step = builder.build(step_id=7)
    assert step.batch == StepBatch(prefill_tokens=83, prefill_attended_tokens=210 + 63 * 63 + 63 * 64 // 2,
                                   decode_seqs=1, decode_context_tokens=32, lora_adapters=1)
    assert step.num_scheduled_tokens == {"fresh": 20, "second-chunk": 63, "decode": 1}
    assert builder.token_budget == 200 - 84 and step.step_id == 7 and step.lora_adapters == {"sql"}


def test_recompute_of_a_preempted_request_counts_as_prefill():
    recompute = _req("r", 8, 0, outputs=3)
    assert not is_decode(recompute, 11)
    assert is_decode(_req("d", 8, 10, outputs=3), 1)
    assert not is_decode(_req("last-prompt-token", 8, 7), 1)
