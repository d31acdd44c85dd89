"""The image's HEALTHCHECK finds the container's listening ports and asks each one's /health."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flotilla.healthcheck import check, healthy, listening_ports

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F40 0100007F:D9D2 01 00000000:00000000 02:000AFC3D 00000000 10001        0 3 2 0 20 4 30 10 -1
   3: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001        0 4 1 0 100 0 0 10 0
"""


def test_listening_ports_are_the_listen_rows_once_each_in_order() -> None:
    assert listening_ports(TABLE) == [8000, 8080]  # the connected socket (state 01) is not a server


def _server(status: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    """Ports of a server whose /health answers 200 and of one whose /health answers 503."""
    ok, failing = _server(200), _server(503)
    yield ok.server_address[1], failing.server_address[1]
    for s in (ok, failing):
        s.shutdown()
        s.server_close()


def test_a_port_is_healthy_only_when_its_health_answers_200(servers: tuple[int, int]) -> None:
    ok, failing = servers
    assert healthy(ok)
    assert not healthy(failing)
    assert check([failing, ok])
    assert not check([failing])
    assert not check([])


def test_a_port_nothing_listens_on_is_unhealthy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not healthy(port)


def test_a_live_listening_socket_is_found_in_the_kernels_table(servers: tuple[int, int]) -> None:
    ok, _ = servers
    assert ok in listening_ports(Path("/proc/net/tcp").read_text())
