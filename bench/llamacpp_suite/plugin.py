"""pytest plugin loaded into llama.cpp's test session: records the "File Not Found" answers (the 404 of
a route the server does not have) each test received, so a pass that rests on one can be flagged hollow.
It also makes ServerPreset.load_all, the session fixture that pre-downloads every preset's model by starting
each preset once, a no-op: nothing can be downloaded here, and one preset (router mode, no model) failing
there would error every test of the file instead of its own."""

from __future__ import annotations

import json
import os

import pytest

_SEEN: dict[str, list[str]] = {}
_CURRENT: list[str] = []


def _is_route_miss(result) -> bool:
    body = getattr(result, "body", None)
    if getattr(result, "status_code", None) != 404 or not isinstance(body, dict):
        return False
    error = body.get("error")
    return isinstance(error, dict) and error.get("message") == "File Not Found"


def pytest_sessionstart(session: pytest.Session) -> None:
    import utils  # type: ignore[import-not-found]  # llama.cpp's tests/utils.py, on sys.path through its conftest

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    original = utils.ServerProcess.make_request

    def recording(self, method, path, *args, **kwargs):
        result = original(self, method, path, *args, **kwargs)
        if _CURRENT and _is_route_miss(result):
            _SEEN.setdefault(_CURRENT[0], []).append(f"{method} {path}")
        return result

    utils.ServerProcess.make_request = recording


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _CURRENT[:] = [item.nodeid]
    yield
    _CURRENT.clear()


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("LLAMACPP_SUITE_MISSES")
    if path:
        with open(path, "w") as f:
            json.dump(_SEEN, f)
