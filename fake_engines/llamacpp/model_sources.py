"""Where a router-mode llama-server finds its models: the download cache, --models-dir and a
--models-preset INI (llama.cpp's server_models::load_models, tools/server/server-models.cpp).

Nothing can be downloaded here, so the look-alike's cache is a folder of small records, one per
"downloaded" model (`$LLAMA_CACHE/fake-llama-server/*.json`, LLAMA_CACHE defaulting to
~/.cache/llama.cpp as llama.cpp's does); whatever maps a download (bench/llamacpp_suite/wrapper.py)
writes them with `record_download`. Every model of every source runs as a catalogue model.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

CACHE_SUBDIR = "fake-llama-server"
SOURCE_CACHE, SOURCE_DIR, SOURCE_PRESET = "cache", "models_dir", "preset"
_TAG = re.compile(r"[-._](I?Q\d[A-Z0-9_]*|BF16|F16|F32)(?:-\d+-of-\d+)?\.gguf$", re.IGNORECASE)


class PresetError(ValueError):
    """A preset INI llama-server would refuse to start with."""


@dataclass
class ModelSource:
    """One model the router can run, as load_models() lists it."""

    name: str
    """Its id (repo:TAG for a cache entry, the file or folder name for --models-dir, the section for a preset)."""
    source: str
    """cache, models_dir or preset (server_model_source_to_string)."""
    options: dict[str, str] = field(default_factory=dict)
    """Preset options (INI keys as written, without leading dashes)."""
    repo: str = ""
    """Hugging Face repo of a cache entry (without the :TAG)."""
    aliases: list[str] = field(default_factory=list)
    """From the preset's `alias` (comma-separated)."""
    tags: list[str] = field(default_factory=list)
    """From the preset's `tags` (comma-separated)."""
    hidden: bool = False
    """A cache entry a preset with dedup-cache-models stands for: hidden from GET /models, still usable."""

    def to_ini(self) -> str:
        """The preset as GET /models reports it in status.preset."""
        lines = [f"[{self.name}]"] + [f"{k} = {v}" for k, v in self.options.items()
                                      if k not in ("alias", "tags", "host", "port")]
        return "\n".join(lines) + "\n"


def cache_dir() -> Path:
    """LLAMA_CACHE, else llama.cpp's default cache folder."""
    env = os.environ.get("LLAMA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "llama.cpp"


def cache_name(repo: str, hf_file: str | None) -> str | None:
    """The cache id llama-server lists for a download: `owner/repo:TAG`; None when no tag is known."""
    if ":" in repo:
        base, tag = repo.rsplit(":", 1)
        return f"{base}:{tag.upper()}"
    found = _TAG.search(hf_file or "")
    return f"{repo}:{found.group(1).upper()}" if found else None


def _record_path(name: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / CACHE_SUBDIR / (hashlib.sha1(name.encode()).hexdigest()[:16] + ".json")


def record_download(name: str, repo: str, cache: Path | None = None) -> None:
    """Note `name` as downloaded into the cache (what a real download leaves behind)."""
    path = _record_path(name, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "repo": repo}))


def remove_download(name: str) -> bool:
    """Forget a cached model; False when there was nothing to remove."""
    path = _record_path(name)
    if not path.exists():
        return False
    path.unlink()
    return True


def cached_models() -> list[ModelSource]:
    """The cache's entries."""
    folder = cache_dir() / CACHE_SUBDIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            found.append(ModelSource(record["name"], SOURCE_CACHE, repo=record["repo"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written record is no model
    return found


def models_dir_models(folder: str) -> list[ModelSource]:
    """Each *.gguf file (named by its stem) and each folder holding GGUF files (named by the folder)."""
    root = Path(folder)
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_file() and path.suffix == ".gguf" and not path.name.startswith("mmproj"):
            found.append(ModelSource(path.stem, SOURCE_DIR, {"model": str(path)}))
        elif path.is_dir() and any(path.glob("*.gguf")):
            found.append(ModelSource(path.name, SOURCE_DIR, {"model": str(path)}))
    return found


class _KeysAsWritten(configparser.ConfigParser):
    def optionxform(self, optionstr: str) -> str:
        return optionstr


def preset_models(path: str) -> tuple[dict[str, str], list[ModelSource]]:
    """The INI's global `[*]` options and one model per other section."""
    parser = _KeysAsWritten(interpolation=None, default_section="\0none")  # `[*]` is a section like any
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as exc:
        raise PresetError(f"failed to read preset file '{path}': {exc}") from None
    glob = {k.lstrip("-"): v for k, v in parser["*"].items()} if parser.has_section("*") else {}
    models = [ModelSource(section, SOURCE_PRESET, {k.lstrip("-"): v for k, v in parser[section].items()})
              for section in parser.sections() if section != "*"]
    return glob, models


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "on", "yes", "enabled")


def _repo_of(value: str) -> tuple[str, str | None]:
    repo, _, tag = value.partition(":")
    return repo, tag.upper() or None


def _hidden_by_presets(cached: list[ModelSource], presets: list[ModelSource]) -> set[str]:
    """Cache entries backing a preset (its hf-repo or draft repo) that asks for dedup-cache-models."""
    wanted: list[tuple[str, str | None]] = []
    for preset in presets:
        if _truthy(preset.options.get("dedup-cache-models")):
            wanted += [_repo_of(preset.options[k]) for k in ("hf-repo", "hf", "spec-draft-hf", "hf-repo-draft")
                       if preset.options.get(k)]
    hidden = set()
    for entry in cached:
        repo, tag = _repo_of(entry.name)
        if any(repo == r and (t is None or t == tag) for r, t in wanted):
            hidden.add(entry.name)
    return hidden


def load_all(models_dir: str | None, models_preset: str | None) -> list[ModelSource]:
    """Cache, then --models-dir (wins over the cache), then presets (merged over both), as load_models()."""
    by_name: dict[str, ModelSource] = {m.name: m for m in cached_models()}
    cached = list(by_name.values())
    for model in models_dir_models(models_dir) if models_dir else []:
        by_name[model.name] = model
    glob, presets = preset_models(models_preset) if models_preset else ({}, [])
    for preset in presets:
        preset.options = {**glob, **preset.options}
        base = by_name.get(preset.name)
        if base is not None:
            preset.options = {**base.options, **preset.options}
        by_name[preset.name] = preset
    hidden = _hidden_by_presets([m for m in cached if by_name[m.name].source == SOURCE_CACHE], presets)
    for model in by_name.values():
        model.hidden = model.name in hidden
        model.aliases = _split(model.options.get("alias"))
        model.tags = _split(model.options.get("tags"))
    return sorted(by_name.values(), key=lambda m: m.name)


def load_on_startup(model: ModelSource) -> bool:
    """The preset's load-on-startup option."""
    return _truthy(model.options.get("load-on-startup"))
