"""The build the proxy runs: plain Python, or the request path compiled with mypyc (`make compiled`).

`make compiled-test` runs tests/proxy against the compiled build with FLOTILLA_EXPECT_COMPILED=1.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os

from proxy.build import REQUEST_PATH, compiled_modules, describe


def test_the_build_loaded_is_the_one_expected() -> None:
    # what imports load, checked apart from compiled_modules(), which finds them without importing
    loaded = [name for name in REQUEST_PATH if (importlib.import_module(name).__file__ or "").endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES))]
    if os.environ.get("FLOTILLA_EXPECT_COMPILED") == "1":
        assert loaded == compiled_modules() == list(REQUEST_PATH)
        assert describe() == "request path compiled with mypyc"
    else:
        assert loaded == compiled_modules() == []
        assert describe() == "pure Python"

