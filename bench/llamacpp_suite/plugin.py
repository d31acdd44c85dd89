"""pytest plugin loaded into llama.cpp's test session: records the "File Not Found" answers (the 404 of
a route the server does not have) each test received, through utils' helpers, `requests` or the openai client,
so a pass that rests on one can be flagged hollow.
It also makes ServerPreset.load_all, the session fixture that pre-downloads every preset's model by starting
each preset once, start nothing: nothing can be downloaded here, and one preset failing there would error
every test of the file instead of its own. What it leaves is what the downloads would: each preset's model
noted in LLAMA_CACHE (`tmp`, as utils.py gives the servers), which a router-mode server lists."""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import pytest

_SEEN: dict[str, list[str]] = {}
_CURRENT: list[str] = []


def _is_route_miss(status: int, body: object) -> bool:
    if status != 404 or not isinstance(body, dict):
        return False
    error = body.get("error")
    return isinstance(error, dict) and error.get("message") == "File Not Found"


def _note(status: int, read_json, method: str, path: str) -> None:
    """Record a route miss against the running test. Only a 404 is read (a small body; both clients keep what
    they read, so the test still gets it)."""
    if not _CURRENT or status != 404:
        return
    try:
        body = read_json()
    except Exception:  # not JSON: not llama-server's "File Not Found"
        return
    if _is_route_miss(status, body):
        _SEEN.setdefault(_CURRENT[0], []).append(f"{method} {path}")


def pytest_sessionstart(session: pytest.Session) -> None:
    import utils  # type: ignore[import-not-found]  # llama.cpp's tests/utils.py, on sys.path through its conftest

    utils.ServerPreset.load_all = staticmethod(lambda: _cache_presets(utils.ServerPreset))
    _record_requests()
    _record_httpx()


def _record_requests() -> None:
    """Every request the tests make with `requests` (utils' make_request and make_stream_request, and their
    direct requests.get/post) goes through Session.send."""
    import requests

    original = requests.Session.send

    def recording(self, request, **kwargs):
        response = original(self, request, **kwargs)
        _note(response.status_code, response.json, request.method or "", urlsplit(request.url or "").path)
        return response

    requests.Session.send = recording


def _record_httpx() -> None:
    """The openai client's requests go through httpx.Client.send."""
    try:
        import httpx
    except ImportError:
        return
    original = httpx.Client.send

    def recording(self, request, **kwargs):
        response = original(self, request, **kwargs)
        if response.status_code == 404:
            _note(404, lambda: (response.read(), response.json())[1], request.method, request.url.path)
        return response

    httpx.Client.send = recording


def _cache_presets(presets) -> None:
    from pathlib import Path

    from bench.llamacpp_suite.wrapper import downloaded
    from fake_engines.llamacpp.model_sources import record_download

    cache = Path(os.environ.get("LLAMA_CACHE", "tmp"))
    for name in list(vars(presets)):
        if name == "load_all" or not callable(getattr(presets, name)):
            continue
        server = getattr(presets, name)()
        argv = ["--hf-repo", server.model_hf_repo] if server.model_hf_repo else []
        argv += ["--hf-file", server.model_hf_file] if server.model_hf_file else []
        download = downloaded(argv)
        if download is not None:
            record_download(*download, cache=cache)


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
