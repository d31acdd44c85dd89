"""The binary named by LLAMA_SERVER_BIN_PATH: fake-llama-server with model downloads and template paths mapped.

Nothing can be downloaded here, so `--hf-repo`/`--hf-file`/`--model-url` and a `-m` naming a file that
does not exist become `-m` of a catalogue model; every other flag passes through as the tests give it,
but for one path: the tests name llama.cpp's template files by where they lie in its source tree
(`../../../models/templates/X.jinja`), and the sdist's copies lie under the suite's home instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

CATALOGUE_MODEL = "llama-3.2-1b-Q8_0.gguf"
"""What a download becomes: a small catalogue model, named the way fake-llama-server's -m accepts."""

HUB_QUANTS = {"ggml-org/test-model-stories260K": "F32", "ggml-org/test-model-stories260K-infill": "F32"}
"""The quantisation of the one GGUF in the tests' repos that name no :TAG (what a download resolves
to, and so the cache id a router lists: `repo:F32`)."""

DOWNLOAD_FLAGS = frozenset({"-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"})
MODEL_FLAGS = frozenset({"-m", "--model"})


def map_model_args(argv: list[str], exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """argv with download flags dropped and a missing -m file replaced; one -m of the catalogue model
    stands for them. A command line without any model (router mode) is left as it is."""
    out: list[str] = []
    wants_model = False
    i = 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if flag in DOWNLOAD_FLAGS and value is not None:
            wants_model = True
            i += 2
            continue
        if flag in MODEL_FLAGS and value is not None and not exists(value):
            wants_model = True
            i += 2
            continue
        if flag in MODEL_FLAGS:
            wants_model = False  # a real file: it stands for the model
            out.extend(argv[i:i + 2])
            i += 2
            continue
        out.append(flag)
        i += 1
    has_model = any(flag in MODEL_FLAGS for flag in out)
    if wants_model and not has_model:
        out.extend(["-m", catalogue_model(argv)])
    return out


def catalogue_model(argv: list[str]) -> str:
    """The -m a download becomes: an embedding, reranking or infill model the catalogue knows by the
    name of its --hf-file folder or repo keeps its own entry (its width, pooling and FIM tokens, e.g.
    bert-bge-small); anything else is the small generative CATALOGUE_MODEL."""
    from fake_engines.perf.catalogue import CatalogueError, load_catalogue

    values = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1])}
    hf_file = next((values[f] for f in ("-hff", "--hf-file") if f in values), "")
    repo = next((values[f] for f in ("-hf", "-hfr", "--hf-repo") if f in values), "")
    catalogue = load_catalogue()
    for name in (hf_file.split("/")[0], repo.split(":")[0]):
        try:
            spec = catalogue.model(name) if name else None
        except CatalogueError:
            continue
        if spec is not None and (spec.pooling or spec.fim):
            return f"{spec.name}-{HUB_QUANTS.get(repo.split(':')[0], 'F16')}.gguf"
    return CATALOGUE_MODEL


def downloaded(argv: list[str]) -> tuple[str, str] | None:
    """(cache id, repo) of the model an `--hf-repo [--hf-file]` command line downloads, if its tag is known."""
    from fake_engines.llamacpp.model_sources import cache_name

    values = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1])}
    repo = next((values[f] for f in ("-hf", "-hfr", "--hf-repo") if f in values), None)
    if repo is None:
        return None
    hf_file = next((values[f] for f in ("-hff", "--hf-file") if f in values), None)
    if ":" not in repo and hf_file is None and repo in HUB_QUANTS:
        repo = f"{repo}:{HUB_QUANTS[repo]}"
    name = cache_name(repo, hf_file)
    return (name, repo.split(":")[0]) if name else None


TEMPLATES_ENV = "LLAMACPP_SUITE_TEMPLATES"
"""The folder holding the sdist's models/templates (bench/llamacpp_suite/__main__.py sets it)."""


def map_template_file(argv: list[str], templates: str | None, exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """argv with a `--chat-template-file` under models/templates/ that is not there read from `templates`."""
    out = list(argv)
    for i, flag in enumerate(out[:-1]):
        path = out[i + 1]
        if flag == "--chat-template-file" and templates and not exists(path) and "models/templates/" in path:
            out[i + 1] = os.path.join(templates, os.path.basename(path))
    return out


def main() -> None:
    from fake_engines.llamacpp.cli import main as fake_main
    from fake_engines.llamacpp.model_sources import record_download

    sys.argv[0] = "fake-llama-server"
    download = downloaded(sys.argv[1:])
    if download is not None:  # what the real download leaves in LLAMA_CACHE, for a later router to list
        record_download(*download)
    argv = map_template_file(sys.argv[1:], os.environ.get(TEMPLATES_ENV))
    raise SystemExit(fake_main(map_model_args(argv)))


if __name__ == "__main__":
    main()
