"""The build the proxy runs: plain Python, or the request path compiled with mypyc (`make compiled`).

`make compiled-test` runs tests/proxy against the compiled build with FLOTILLA_EXPECT_COMPILED=1.
"""

from __future__ import annotations

import os

from proxy.build import REQUEST_PATH, compiled_modules, describe


def test_the_build_loaded_is_the_one_expected() -> None:
    if os.environ.get("FLOTILLA_EXPECT_COMPILED") == "1":
        assert compiled_modules() == list(REQUEST_PATH)
        assert describe() == "request path compiled with mypyc"
    else:
        assert compiled_modules() == []
        assert describe() == "pure Python"

