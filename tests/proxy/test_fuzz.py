"""Generated requests through a real socket: bodies, header bytes, paths and methods. Whatever
arrives, the proxy answers with a status below 500 and, when it answers itself, an OpenAI-style
JSON error; its log never holds a traceback or an error record; and afterwards a normal request
is served by a backend that was never ejected."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.routing.base import BackendState
from proxy.app import start_proxy
from proxy.limits import LimitsConfig
from tests.proxy.conftest import FakeBackend, Knobs, fast_config

BODY_EXAMPLES = 2000
REQUEST_EXAMPLES = 1000
KEY = "fuzz-key"
ADMIN = "fuzz-admin"
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te",
                   "trailer", "keep-alive"}
TCHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
request_keys = st.sampled_from(["model", "prompt", "messages", "stream", "max_tokens", "max_completion_tokens",
                                "stream_options", "user", "n", "temperature"])
content_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                               optional={"text": json_values}) | json_values, max_size=3)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | json_values},
                                          optional={"content": json_values | content_parts}), max_size=3)
request_objects = st.dictionaries(request_keys, json_values | messages, max_size=6)
nested = st.integers(1, 3000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n + b"}")
bodies = st.one_of(
    request_objects.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
    nested,
    st.sampled_from([b'{"prompt": "x", "temperature": 1e400}', b'{"prompt": NaN}', b'{"prompt": -Infinity}']),
)
header_names = st.text(TCHARS, min_size=1, max_size=20).filter(lambda n: n.lower() not in FRAMING_HEADERS)
header_values = st.binary(max_size=60).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b"").strip())
authorizations = st.sampled_from([f"Bearer {KEY}".encode(), f"Bearer {ADMIN}".encode(), b"Bearer wrong", b"",
                                  b"Bearer \xff\xfe\x80", b"Basic \xc3\xa9t\xc3\xa9", b"bearer " + KEY.encode()])
header_sets = st.lists(st.tuples(header_names.map(str.encode), header_values), max_size=6)
content_types = st.sampled_from([b"application/json", b"application/json; charset=utf-8", b"text/plain", b"",
                                 b"application/x-www-form-urlencoded", b"application/vnd.api+json", b"*/*",
                                 b"application/json; charset=\xff"])
generation_paths = st.sampled_from([b"/v1/completions", b"/v1/chat/completions"])
segments = st.sampled_from(["v1", "completions", "chat", "models", "admin", "backends", "faults", "metrics",
                            "version", "health", "ready", "debug", "load_lora_adapter", "..", ".", "", "%2e%2e",
                            "%2E", "%2f", "%2F", "%252e%252e", "%00", "%ff", "%", "x", ";a=b", "\\", "~"])
queries = st.sampled_from(["", "?url=http://127.0.0.1:9", "?a=%ff", "?" + "a" * 300, "?x=..%2f"])
paths = st.one_of(
    st.tuples(st.lists(segments, min_size=1, max_size=6), queries).map(lambda t: ("/" + "/".join(t[0]) + t[1])),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(lambda t: "/" + t),
    st.sampled_from(["*", "http://127.0.0.1/v1/models", "//v1/models", "/v1/../admin/faults", "/v1/%2e%2e/metrics"]),
).map(lambda p: p.encode())
methods = st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD", b"TRACE", b"FOO"])


class LogRecords(logging.Handler):
    """Every record at WARNING or above, from any thread (the proxy runs on its own)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def bad(self) -> list[str]:
        """Tracebacks and errors: no client input may cause one."""
        return [self.format(r) for r in self.records
                if r.exc_info or r.levelno >= logging.ERROR or "Traceback" in r.getMessage()]


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
        config = fast_config([self.backend], max_body_bytes=64 * 1024, admin_token=ADMIN,
                             limits=LimitsConfig(api_keys=(KEY,)))
        self.proxy = self.run(start_proxy(config, rng=random.Random(1)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self.proxy.close())
        self.run(self.backend.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def running() -> Iterator[ProxyThread]:
    with ProxyThread() as proxy_thread:
        yield proxy_thread


@pytest.fixture(scope="module")
def log_records() -> Iterator[LogRecords]:
    handler = LogRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def send(port: int, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
         body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request as raw bytes (any header bytes at all), read to the close."""
    head = [method + b" " + target + b" HTTP/1.1", b"Host: proxy", b"Connection: close",
            b"Content-Length: %d" % len(body), *(name + b": " + value for name, value in headers)]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (and closed) before the body was all sent: the answer is still there
        answer = bytearray()
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    status_line, _, rest = bytes(answer).partition(b"\r\n")
    raw_headers, _, payload = rest.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in raw_headers.split(b"\r\n") if b": " in line)
    return int(status_line.split(b" ")[1]), {k.lower(): v for k, v in fields.items()}, payload


def check_answer(method: bytes, status: int, headers: dict[bytes, bytes], payload: bytes) -> None:
    assert b"Traceback" not in payload
    assert status < 500, payload
    if headers.get(b"x-flotilla-backend") or status < 400 or method == b"HEAD":
        return  # a backend's answer relayed, or a success: not the proxy's error to check
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["type"].endswith("_error")


FUZZ_SETTINGS = settings(deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                HealthCheck.data_too_large])


@settings(FUZZ_SETTINGS, max_examples=BODY_EXAMPLES)
@given(path=generation_paths, body=bodies, headers=header_sets, content_type=content_types)
def test_generated_bodies_get_a_status_below_500_and_json_errors(running, log_records, path, body, headers,
                                                                 content_type):
    headers = [*headers, (b"Authorization", f"Bearer {KEY}".encode())]
    if content_type:
        headers.append((b"Content-Type", content_type))
    check_answer(b"POST", *send(running.proxy.port, b"POST", path, headers, body))
    assert log_records.bad() == []


@settings(FUZZ_SETTINGS, max_examples=REQUEST_EXAMPLES)
@given(method=methods, target=paths, headers=header_sets, authorization=authorizations, body=bodies)
def test_generated_paths_methods_and_header_bytes_get_a_status_below_500_and_json_errors(
        running, log_records, method, target, headers, authorization, body):
    if authorization:
        headers = [*headers, (b"Authorization", authorization)]
    check_answer(method, *send(running.proxy.port, method, target, headers, body))
    assert log_records.bad() == []


def test_after_the_fuzzing_a_normal_request_is_served_and_no_backend_was_ejected(running, log_records):
    body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}).encode()
    headers = [(b"Authorization", f"Bearer {KEY}".encode()), (b"Content-Type", b"application/json")]
    status, resp_headers, _ = send(running.proxy.port, b"POST", b"/v1/completions", headers, body)
    assert status == 200 and resp_headers[b"x-flotilla-backend"] == running.backend.url.encode()
    assert [b.state for b in running.proxy.proxy.pool] == [BackendState.READY]
    assert log_records.bad() == []
