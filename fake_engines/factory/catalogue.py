"""The catalogue the engines are sized from, read once per process and set of extra files."""

from __future__ import annotations

import functools

from fake_engines.perf.catalogue import Catalogue, load_catalogue


@functools.lru_cache(maxsize=32)
def catalogue_of(files: tuple[str, ...] = ()) -> Catalogue:
    """The built-in catalogue with `files` (--catalogue) laid over it; a simulated fleet builds
    an engine per replica, so the YAML is parsed once, not per engine."""
    return load_catalogue(files)
