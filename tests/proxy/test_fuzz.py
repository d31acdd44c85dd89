"""Generated bodies and header sets through a real socket: whatever arrives, the proxy answers
with a status and, when it answers itself, an OpenAI-style JSON error; never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import start_proxy
from tests.proxy.conftest import FakeBackend, Knobs, fast_config

EXAMPLES = 2000
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection", "expect", "content-encoding",
                   "upgrade", "te", "trailer", "keep-alive"}
TCHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
request_keys = st.sampled_from(["model", "prompt", "messages", "stream", "max_tokens", "max_completion_tokens",
                                "stream_options", "user", "n", "temperature"])
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"])},
                                          optional={"content": json_values}), max_size=3)
request_objects = st.dictionaries(request_keys, json_values | messages, max_size=6)
bodies = st.one_of(
    request_objects.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
header_sets = st.dictionaries(
    st.text(TCHARS, min_size=1, max_size=20).filter(lambda n: n.lower() not in FRAMING_HEADERS),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(str.strip),
    max_size=6)
content_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "",
                                 "application/x-www-form-urlencoded", "application/vnd.api+json", "*/*"])
paths = st.sampled_from(["/v1/completions", "/v1/chat/completions"])


class ProxyThread:
    """One proxy and one fake backend on their own loop, for synchronous clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def __enter__(self) -> ProxyThread:
        self.thread.start()
        self.backend = FakeBackend(name="b", knobs=Knobs(chunks=1))
        self.run(self.backend.start())
        self.proxy = self.run(start_proxy(fast_config([self.backend], max_body_bytes=64 * 1024),
                                          rng=random.Random(1)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self.proxy.close())
        self.run(self.backend.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def proxy_port() -> Iterator[int]:
    with ProxyThread() as running:
        yield running.proxy.port


def send(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(path=paths, body=bodies, headers=header_sets, content_type=content_types)
def test_generated_requests_get_a_status_and_json_errors_never_a_500(proxy_port, path, body, headers, content_type):
    headers = {**headers, "Content-Type": content_type} if content_type else headers
    status, resp_headers, payload = send(proxy_port, path, body, headers)
    assert b"Traceback" not in payload
    if resp_headers.get("x-flotilla-backend"):
        return  # the backend's own answer, relayed
    assert status != 500 and 400 <= status < 600, payload
    error = json.loads(payload)["error"]
    assert isinstance(error["message"], str) and error["type"].endswith("_error")
