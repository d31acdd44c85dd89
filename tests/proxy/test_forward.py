from multidict import CIMultiDict

from proxy.forward import downstream_headers, upstream_headers


def test_hop_by_hop_headers_are_stripped_and_the_request_id_set() -> None:
    incoming = CIMultiDict({"Host": "proxy", "Connection": "keep-alive, X-Secret-Hop", "Keep-Alive": "timeout=5",
                            "X-Secret-Hop": "1", "Transfer-Encoding": "chunked", "Content-Length": "12",
                            "Authorization": "Bearer k", "Content-Type": "application/json",
                            "x-flotilla-debug": "1", "x-session-id": "s1"})
    out = upstream_headers(incoming, "rid-1")
    assert dict(out) == {"Authorization": "Bearer k", "Content-Type": "application/json", "x-session-id": "s1",
                         "X-Request-Id": "rid-1"}


def test_response_headers_keep_end_to_end_ones_only() -> None:
    back = CIMultiDict({"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked", "Server": "uvicorn",
                        "Date": "x", "Connection": "close", "X-Engine": "vllm", "Content-Encoding": "gzip"})
    assert dict(downstream_headers(back)) == {"Content-Type": "text/event-stream", "X-Engine": "vllm",
                                              "Content-Encoding": "gzip"}
