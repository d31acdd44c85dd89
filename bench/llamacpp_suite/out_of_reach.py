"""llama.cpp's server tests that no look-alike can pass, each with why: judged from the test's source
(tools/server/tests/unit of llama-cpp-python 0.3.36's sdist), not from our output. The classifier
(classify.py) looks a failure up here first; what is not here is a difference still to close.

A key is `test_file.py::test_name` (every parametrization) or `test_file.py::test_name[id]`, where `*` in
the id stands for any text (pytest's ids as `--collect-only` prints them). The kind is the first
out-of-reach assertion in the test's source order; the detail says what it checks."""

from __future__ import annotations

import re

WEIGHTS = "real weights"
TOKENIZER = "real tokenizer"
DOWNLOAD = "download"
INTERNET = "internet"
CONTAINER = "container runtime"

KINDS: dict[str, str] = {
    WEIGHTS: "asserts on a real model's output (its generated text or scores)",
    TOKENIZER: "asserts exact token counts, ids or detokenized text of a real model's tokenizer",
    DOWNLOAD: "needs a file from the Hugging Face hub that the wrapper cannot map to the catalogue model "
              "(LoRA adapter, draft model, image, mmproj, remote preset)",
    INTERNET: "needs the internet beyond the hub",
    CONTAINER: "needs a docker or podman container engine",
}

_STORY = "stories260K"  # ServerPreset.tinyllama2 (ggml-org/test-model-stories260K): a tiny story generator, SentencePiece
_IMAGE = "an image fetched from huggingface.co (tinygemma3's test/91_cat.png, 11_truck.png)"
_MMPROJ = ("tinygemma3's mmproj, which the hub's registry API adds to the model download (the look-alike is "
           "llama-server without one)")

OUT_OF_REACH: dict[str, tuple[str, str]] = {
    # generated text of a real model
    "test_basic.py::test_load_split_model": (WEIGHTS, "regex (little|girl)+ on the split stories15M's story text"),
    "test_chat_completion.py::test_chat_completion_stream": (
        WEIGHTS, f"regex (Suddenly)+ / (Aside|she|felter|alonger)+ on {_STORY}'s reply, then usage token counts "
                 "77 / 104 of its tokenizer"),
    "test_chat_completion.py::test_chat_completion_with_openai_library": (
        WEIGHTS, f"regex (Suddenly)+ on {_STORY}'s reply"),
    "test_compat_oai_responses.py::test_responses_with_openai_library": (
        WEIGHTS, f"regex (Suddenly)+ on {_STORY}'s reply (Responses API)"),
    "test_compat_oai_responses.py::test_responses_stream_with_openai_library": (
        WEIGHTS, f"regex (Suddenly)+ on {_STORY}'s streamed reply (Responses API)"),
    "test_completion.py::test_completion_with_openai_library": (
        WEIGHTS, f"regex (going|bed)+ on {_STORY}'s continuation"),
    "test_completion.py::test_completion_stream_with_openai_library": (
        WEIGHTS, f"regex (going|bed)+ on {_STORY}'s streamed continuation"),
    "test_infill.py::test_infill_without_input_extra": (
        WEIGHTS, f"regex (Ann|small|shiny|Daddy|Jimmy)+ on {_STORY}-infill's text"),
    "test_infill.py::test_infill_with_input_extra": (
        WEIGHTS, f"regex (Dad|excited|park|Jimmy)+ on {_STORY}-infill's text"),
    "test_infill.py::test_with_qwen_model": (WEIGHTS, "Qwen2.5-Coder's completion of C code"),
    "test_rerank.py::test_rerank": (
        WEIGHTS, "jina-reranker's scores: document 2 (machine learning) ranks first"),
    "test_rerank.py::test_rerank_tei_format": (
        WEIGHTS, "jina-reranker's scores: document 2 ranks first and document 3 (Paris) last"),
    "test_slot_save.py::test_slot_save_restore": (
        WEIGHTS, f"regex (Whiskers|Flana)+ / (Jack|said)+ on {_STORY}'s text, then prompt_n 21 / 6 / 1 of its "
                 "tokenizer"),
    "test_slot_save.py::test_slot_erase": (
        WEIGHTS, f"regex (Whiskers|Flana)+ on {_STORY}'s text, then prompt_n 21 of its tokenizer"),
    # the model's own stopping point: stories260K does not end its text (EOS) within these n_predict budgets,
    # so the tests read exactly n_predict tokens; when a model ends its text is in its weights
    "test_completion.py::test_completion_unified": (
        WEIGHTS, f"timings.predicted_n == n_predict (40-90): {_STORY} does not end its text before"),
    "test_completion.py::test_n_probs_post_backend_sampling": (
        WEIGHTS, f"20 completion_probabilities for n_predict 20: {_STORY} does not end its text before"),
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[64-64-False]": (
        WEIGHTS, f"predicted_n 64 for n_predict 64: {_STORY} does not end its text before"),
    "test_ctx_shift.py::test_ctx_shift_disabled_stream": (
        WEIGHTS, f"finish_reason length after n_predict 256: {_STORY} does not end its text before"),
    # a real tokenizer's counts, ids and pieces
    "test_chat_completion.py::test_chat_completion": (
        TOKENIZER, f"usage.prompt_tokens 69 / 77 / 23 / 104 / 79 of {_STORY}'s tokenizer, then a regex on its "
                   "reply (But she couldn't, (Suddenly)+, ^ blue, Whillicter)"),
    "test_chat_completion.py::test_chat_completion_cached_tokens": (
        TOKENIZER, f"usage.prompt_tokens and prompt_tokens_details.cached_tokens of {_STORY}'s tokenizer"),
    "test_chat_completion.py::test_chat_template": (
        TOKENIZER, f"__verbose.prompt as {_STORY}'s SentencePiece vocabulary detokenizes it ('<s> ' before the "
                   "llama3 template's text)"),
    "test_completion.py::test_completion": (
        TOKENIZER, f"timings.prompt_n 18 / 46 of {_STORY}'s tokenizer, then regex (going|bed)+ / "
                   "(princesses|everyone|kids|Anna|forest)+ on its text"),
    "test_completion.py::test_completion_stream": (
        TOKENIZER, f"timings.prompt_n 18 / 46 of {_STORY}'s tokenizer, then a regex on its text"),
    "test_completion.py::test_completion_response_fields[*response_fields1]": (
        TOKENIZER, f"prompt echoed as {_STORY}'s SentencePiece vocabulary detokenizes it ('<s> ' + prompt)"),
    "test_completion.py::test_completion_prompt_cache": (
        TOKENIZER, f"prompt_n + cache_n == (40 + r) * 5 + 2, the token count of ' Hello r' repeats in {_STORY}'s "
                   "tokenizer"),
    "test_chat_completion.py::test_return_progress[64-4-False]": (
        TOKENIZER, f"4 prompt batches of 64: the chat prompt's length in {_STORY}'s tokenizer"),
    "test_ctx_shift.py::test_ctx_shift_enabled": (TOKENIZER, f"timings.prompt_n 226 of {_STORY}'s tokenizer"),
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[-1-248-True]": (
        TOKENIZER, f"248 tokens generated = n_ctx 256 - 8 prompt tokens of {_STORY}'s tokenizer"),
    "test_ctx_shift.py::test_ctx_shift_disabled_long_prompt": (
        TOKENIZER, f"a 445-character prompt past the slot's 256 tokens in {_STORY}'s tokenizer (about 300; 113 "
                   "at the look-alike's 4 characters a token, so it fits and is answered)"),
    "test_embedding.py::test_embedding_usage_single": (
        TOKENIZER, "usage.prompt_tokens 9 / 6 of bge-small's tokenizer"),
    "test_embedding.py::test_embedding_usage_multiple": (
        TOKENIZER, "usage.prompt_tokens 2 * 9 of bge-small's tokenizer"),
    "test_embedding.py::test_embedding_pooling_none": (
        TOKENIZER, "one vector per token: 'hello hello hello' is 3 tokens + [CLS] + [SEP] in bge-small's tokenizer"),
    "test_rerank.py::test_rerank_usage": (TOKENIZER, "usage.prompt_tokens 19 / 26 of jina-reranker's tokenizer"),
    "test_slot_save.py::test_slot_restore_legacy_token_list": (
        TOKENIZER, f"the saved slot holds 84 tokens of {_STORY}'s tokenizer, then prompt_n 6"),
    "test_tokenize.py::test_tokenize_with_bos": (TOKENIZER, f"BOS is token id 1 of {_STORY}'s vocabulary"),
    # files from the hub the wrapper cannot stand in for
    "test_lora.py::*": (DOWNLOAD, "the LoRA adapter moe_shakespeare15M.gguf (then regexes on stories15M_MOE's text)"),
    "test_speculative.py::*": (DOWNLOAD, "the draft model stories15M-q4_0.gguf, fetched by the fixture"),
    "test_router.py::test_router_download_model": (
        DOWNLOAD, "POST /models downloads ggml-org/test-model-stories260K from the hub into the router's cache"),
    "test_router.py::test_router_delete_model": (
        DOWNLOAD, "deletes the model test_router_download_model downloaded (it downloads it first if absent)"),
    "test_router.py::test_router_remote_preset": (
        DOWNLOAD, "the preset file of the hub repo ggml-org/test-preset-ci (its model names)"),
    "test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model": (DOWNLOAD, _IMAGE),
    "test_vision_api.py::test_models_supports_multimodal_capability": (DOWNLOAD, f"{_MMPROJ}: 'multimodal' listed"),
    "test_vision_api.py::test_v1_models_supports_multimodal_capability": (
        DOWNLOAD, f"{_MMPROJ}: 'multimodal' listed"),
    # without an mmproj llama-server refuses every image part (500) before it looks at the file:// path
    "test_security.py::test_local_media_file": (DOWNLOAD, f"{_MMPROJ}: a local image read under --media-path"),
    "test_vision_api.py::test_vision_chat_completion[*-True-*]": (
        DOWNLOAD, f"{_IMAGE}, then regex (cat)+ / (frog)+ on tinygemma3's description of it"),
    "test_vision_api.py::test_vision_chat_completion_token_count": (
        DOWNLOAD, f"{_IMAGE} by URL, counted as more than 10 input tokens by tinygemma3's mmproj"),
    "test_vision_api.py::test_vision_completion[*-True-*]": (
        DOWNLOAD, f"{_IMAGE}, then regex (cat)+ / (frog)+ on tinygemma3's description of it"),
    "test_vision_api.py::test_vision_embeddings[*-True]": (DOWNLOAD, f"{_IMAGE}, embedded by tinygemma3's mmproj"),
    "test_vision_api.py::test_vision_embeddings_oai_content": (DOWNLOAD, f"{_IMAGE}, embedded by tinygemma3's mmproj"),
    "test_slot_save.py::test_slot_save_restore_with_image": (DOWNLOAD, f"{_IMAGE}, its KV saved and restored"),
    "test_slot_save.py::test_slot_save_restore_with_two_images": (DOWNLOAD, f"{_IMAGE}, its KV saved and restored"),
    "test_slot_save.py::test_slot_save_restore_with_image_across_restart": (
        DOWNLOAD, f"{_IMAGE}, its KV saved and restored"),
    "test_slot_save.py::test_slot_save_restore_image_payload_larger_than_context": (
        DOWNLOAD, f"{_IMAGE}, its token count in tinygemma3's context"),
    "test_slot_save.py::test_slot_restore_media_file_without_mmproj": (
        DOWNLOAD, f"{_IMAGE}, its KV saved with the mmproj"),
    # beyond the hub
    "test_proxy.py::test_mcp_proxy": (INTERNET, "/cors-proxy fetches http://example.com"),
    # container engines
    "test_tools_builtin.py::test_tools_builtin_runtime_header[*]": (
        CONTAINER, "tools run in a started docker / podman container (skipped without one)"),
    "test_tools_builtin.py::test_tools_builtin_docker_runtime_cleans_up_spawned_container": (
        CONTAINER, "tools run in a container docker spawns (skipped without docker)"),
}


def _pattern(key: str) -> re.Pattern[str]:
    """`file::name` matches the test with any parameters; `file::name[id]` matches that id, `*` any text."""
    file, _, test = key.partition("::")
    name, bracket, params = test.partition("[")
    head = re.escape(f"{file}::") + (".*" if name == "*" else re.escape(name))
    if not bracket:
        return re.compile(head + r"(\[.*\])?")
    return re.compile(head + re.escape("[" + params).replace(r"\*", ".*"))


_PATTERNS = [(_pattern(key), kind, detail) for key, (kind, detail) in OUT_OF_REACH.items()]


def out_of_reach(nodeid: str) -> tuple[str, str] | None:
    """(kind, detail) of a test that no look-alike can pass, from its pytest node id (`unit/test_x.py::...`)."""
    short = nodeid.removeprefix("unit/")
    for pattern, kind, detail in _PATTERNS:
        if pattern.fullmatch(short):
            return kind, detail
    return None
