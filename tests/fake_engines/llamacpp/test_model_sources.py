"""Where router mode finds models: cache records, --models-dir, a preset INI with its global
section, and dedup-cache-models hiding the cache entries a preset stands for."""

from __future__ import annotations

import pytest

from fake_engines.llamacpp.model_sources import PresetError, load_all, load_on_startup, record_download


def test_sources_merge_presets_over_the_cache_and_dedup_hides_what_a_preset_backs(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    for name in ("org/stories:F32", "org/draft:F32", "org/other:Q8_0"):
        record_download(name, name.split(":")[0])
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "solo.gguf").write_bytes(b"")
    (tmp_path / "dir" / "mmproj-x.gguf").write_bytes(b"")
    (tmp_path / "dir" / "split").mkdir()
    (tmp_path / "dir" / "split" / "part-00001-of-00002.gguf").write_bytes(b"")
    preset = tmp_path / "p.ini"
    preset.write_text("[*]\ndedup-cache-models = 1\n\n[mine]\nhf-repo = org/stories\nspec-draft-hf = org/draft\n"
                      "tags = a, b\nload-on-startup = true\n")
    models = {m.name: m for m in load_all(str(tmp_path / "dir"), str(preset))}
    assert set(models) == {"org/stories:F32", "org/draft:F32", "org/other:Q8_0", "solo", "split", "mine"}
    assert [n for n, m in models.items() if m.hidden] == ["org/draft:F32", "org/stories:F32"]
    assert models["mine"].tags == ["a", "b"] and load_on_startup(models["mine"])
    assert models["mine"].to_ini().startswith("[mine]\ndedup-cache-models = 1\nhf-repo = org/stories\n")
    assert models["solo"].source == "models_dir" and models["org/other:Q8_0"].source == "cache"

    preset.write_text("[mine]\nhf-repo = org/stories\n")  # without dedup every cache entry shows
    assert not any(m.hidden for m in load_all(None, str(preset)))
    preset.write_text("[broken\n")
    with pytest.raises(PresetError, match="failed to read preset file"):
        load_all(None, str(preset))
