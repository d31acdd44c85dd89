from __future__ import annotations

import pytest

from fake_engines.perf.catalogue import CatalogueError, load_catalogue, model_from_shape


def test_builtin_entries_carry_the_issue_figures_and_a_source():
    cat = load_catalogue()
    h100 = cat.gpu("h100")
    assert (h100.memory_gb, h100.bandwidth_tbs, h100.bf16_tflops, h100.nvlink_gbps) == (80, 3.35, 989, 450)
    assert (cat.gpu("h200").memory_gb, cat.gpu("h200").bandwidth_tbs) == (141, 4.8)
    assert cat.link("pcie4").gbps_per_direction == 31.5
    for table in (cat.gpus, cat.links, cat.models):
        assert all(entry.source for entry in table.values())
    assert {"a100", "l40s", "rtx4090", "cpu"} <= set(cat.gpus)
    assert {"nvlink", "pcie5", "ib400", "eth100"} <= set(cat.links)


def test_kv_bytes_per_token_match_the_seed_lesson():
    cat = load_catalogue()
    kib = [cat.model(n).kv_bytes_per_token() / 1024 for n in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b")]
    assert kib == [128, 320, 504]


def test_moe_models_know_their_experts():
    cat = load_catalogue()
    mixtral = cat.model("mixtral-8x7b")
    assert (mixtral.experts, mixtral.top_k, mixtral.is_moe) == (8, 2, True)
    assert cat.model("qwen3-30b-a3b").active_params < cat.model("qwen3-30b-a3b").params
    # MLA caches a 576-wide latent per layer instead of K and V heads
    assert cat.model("deepseek-v3").kv_bytes_per_token() == 61 * 576 * 2


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(CatalogueError, match="unknown model 'llama-9b'.*llama-3.1-8b"):
        load_catalogue().model("llama-9b")


def test_user_file_adds_and_overrides_entries_by_name(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text(
        "gpus:\n  - {name: h100, memory_gb: 94, bandwidth_tbs: 3.9, bf16_tflops: 989, source: nvl}\n"
        "models:\n  - {name: tiny, params: 1e9, active_params: 1e9, layers: 4, kv_heads: 2, head_dim: 64}\n"
    )
    cat = load_catalogue([user])
    assert cat.gpu("h100").memory_gb == 94
    assert cat.model("tiny").kv_bytes_per_token() == 2 * 4 * 2 * 64 * 2
    assert cat.gpu("h200").memory_gb == 141


def test_malformed_user_entry_names_the_file_and_field(tmp_path):
    user = tmp_path / "bad.yaml"
    user.write_text("links:\n  - {name: x, gbps: 3}\n")
    with pytest.raises(CatalogueError, match=r"bad.yaml.*unknown fields \['gbps'\]"):
        load_catalogue([user])


def test_explicit_shape_builds_a_model_and_rejects_zero_layers():
    m = model_from_shape(params=70.6e9, layers=80, kv_heads=8, head_dim=128)
    assert m.weight_bytes(16) == pytest.approx(141.2e9)
    with pytest.raises(CatalogueError, match="layers"):
        model_from_shape(params=1e9, layers=0, kv_heads=8)


def test_entries_validate_their_figures_naming_the_field(tmp_path):
    user = tmp_path / "bad.yaml"
    user.write_text("gpus:\n  - {name: broken, memory_gb: 0, bandwidth_tbs: 1, bf16_tflops: 1}\n")
    with pytest.raises(CatalogueError, match="memory_gb must be positive"):
        load_catalogue([user])
    with pytest.raises(CatalogueError, match=r"top_k \(3\) exceeds experts \(2\)"):
        model_from_shape(params=1e9, layers=2, kv_heads=1, experts=2, top_k=3)


@pytest.mark.parametrize(("name", "entry"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "llama-3.1-70b"),
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),  # an alias: same config.json shape
    ("Qwen/Qwen2.5-32B-Instruct", "qwen2.5-32b"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
    ("/models/llama-3.2-1b", "llama-3.2-1b"),
    ("LLAMA-3.2-3B", "llama-3.2-3b"),
])
def test_hugging_face_ids_and_variants_resolve_to_their_catalogue_entry(name, entry):
    assert load_catalogue().model(name).name == entry


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-9B-Instruct", "Qwen/Qwen2.5-14B-Instruct",
                                  "meta-llama/Llama-3.1-8B-Guard"])
def test_the_rule_never_reaches_another_size_or_an_unknown_word(name):
    with pytest.raises(CatalogueError) as err:
        load_catalogue().model(name)
    message = str(err.value)
    assert f"unknown model {name!r}" in message and "llama-3.1-8b" in message and "--catalogue FILE" in message


def test_catalogue_file_aliases_name_a_new_entry(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("models:\n  - {name: my-8b, params: 8e9, active_params: 8e9, layers: 32, kv_heads: 8,\n"
                     "     aliases: [acme/Chat-Model-8B], source: test}\n")
    cat = load_catalogue([extra])
    assert cat.model("acme/Chat-Model-8B").name == "my-8b"
    assert cat.model("acme/chat-model-8b-instruct-awq").name == "my-8b"  # the rule applies to aliases too
