"""/infill's fill-in-the-middle prompt and its checks, as llama-server assembles and makes them."""

from __future__ import annotations

import pytest

from fake_engines.core import encode
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.infill import CHUNK_SEPARATOR, FIM_MID, FIM_PRE, FIM_SUF, infill_prompt
from fake_engines.llamacpp.server import start_llama
from fake_engines.llamacpp.vocab import BOS_ID
from tests.fake_engines.client import post_json
from tests.fake_engines.engine_thread import EngineThread


def test_the_prompt_is_extra_then_bos_prefix_prompt_suffix_middle_and_spm_swaps_the_halves():
    body = {"input_prefix": "abcd", "prompt": "efgh", "input_suffix": "ijkl"}
    extra = [{"filename": "x.h", "text": "mnop"}]
    psm = infill_prompt(body, extra, n_batch=1024, n_predict=-1, n_ctx=4096, spm=False)
    snippet = encode(CHUNK_SEPARATOR) + encode("mnop")
    assert psm == [*snippet, BOS_ID, FIM_PRE, *encode("abcd"), *encode("efgh"), FIM_SUF, *encode("ijkl"), FIM_MID]
    spm = infill_prompt(body, extra, n_batch=1024, n_predict=-1, n_ctx=4096, spm=True)
    assert spm == [*snippet, BOS_ID, FIM_SUF, *encode("ijkl"), FIM_PRE, *encode("abcd"), *encode("efgh"), FIM_MID]
    # the prefix keeps its end within 3/4 of a batch; extra chunks need room beyond a batch
    tight = infill_prompt({**body, "input_prefix": "p" * 64}, extra, n_batch=8, n_predict=4, n_ctx=8, spm=False)
    assert tight[:3] == [BOS_ID, FIM_PRE, *encode("pppp")] and tight.count(encode("pppp")[0]) == 6
    with pytest.raises(LlamaError) as err:
        infill_prompt({"input_suffix": "x"}, [], 1024, -1, 4096, False)
    assert (err.value.status, err.value.message) == (500, "[json.exception.out_of_range.403] key 'input_prefix' not found")


def test_infill_completes_on_a_fim_model_checks_input_extra_and_is_501_without_fim_tokens():
    base = {"input_prefix": "int main() {\n", "prompt": "    int n = ", "input_suffix": "}\n", "n_predict": 4}
    config = LlamaServerConfig(model="stories260k-infill-F32.gguf", port=0, time_scale=0.01, n_parallel=1)
    with EngineThread(lambda: start_llama(config, cold_start=False)) as engine:
        extra = [{"filename": "a.h", "text": "int f();\n"}]
        status, body = post_json(engine.base_url, "/infill", {**base, "input_extra": extra})
        assert status == 200 and body["tokens_predicted"] == 4 and body["content"]
        for chunk, words in (({}, 'must contain a "text" field'), ({"filename": 123, "text": "x"}, '"filename"')):
            status, error = post_json(engine.base_url, "/infill", {**base, "input_extra": [chunk]})
            assert status == 400 and words in error["error"]["message"]
        status, error = post_json(engine.base_url, "/infill", {**base, "input_extra": "x"})
        assert status == 400 and error["error"]["message"].startswith('"input_extra" must be an array')
    plain = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01)
    with EngineThread(lambda: start_llama(plain, cold_start=False)) as engine:
        status, error = post_json(engine.base_url, "/infill", base)
        assert (status, error["error"]["message"]) == (501, "Infill is not supported by this model: prefix token "
                                                       "is missing. suffix token is missing. middle token is missing. ")
