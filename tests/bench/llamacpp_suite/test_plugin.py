import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.llamacpp_suite import plugin

requests = pytest.importorskip("requests")


class _Server(BaseHTTPRequestHandler):
    """llama-server's answer to a route it lacks on /missing; a 404 of its own (not a route miss) elsewhere."""

    def do_GET(self):
        if self.path == "/ok":
            self._send(200, {"ok": True})
        elif self.path == "/missing":
            self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
        else:
            self._send(404, {"error": {"code": 404, "message": "model not found", "type": "not_found_error"}})

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_route_miss_through_requests_is_recorded_against_the_running_test_which_still_reads_it(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(requests.Session, "send", requests.Session.send)  # undone after the test
    monkeypatch.setattr(plugin, "_SEEN", {})
    monkeypatch.setattr(plugin, "_CURRENT", ["unit/test_x.py::test_y"])
    plugin._record_requests()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        missed = requests.get(f"{base}/missing", timeout=10)
        assert requests.get(f"{base}/ok", timeout=10).status_code == 200
        assert requests.get(f"{base}/models/x", timeout=10).status_code == 404
        streamed = requests.get(f"{base}/missing", stream=True, timeout=10)
        assert b"File Not Found" in b"".join(streamed.iter_content(64))
    finally:
        server.shutdown()
    assert missed.json()["error"]["message"] == "File Not Found"
    assert plugin._SEEN == {"unit/test_x.py::test_y": ["GET /missing", "GET /missing"]}
