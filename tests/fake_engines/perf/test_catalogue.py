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
