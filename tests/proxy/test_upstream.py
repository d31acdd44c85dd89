"""proxy/upstream.py: the request path's HTTP/1.1 client against raw servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from proxy.records import ResponseHead
from proxy.upstream import UpstreamPool, target_of


def test_a_target_names_the_host_as_the_backend_url_does() -> None:
    t = target_of("http://127.0.0.1:8001")
    assert (t.host, t.port, t.tls, t.base_path, t.host_header) == ("127.0.0.1", 8001, False, "", b"127.0.0.1:8001")
    t = target_of("https://engine.example/prefix/")
    assert (t.port, t.tls, t.base_path, t.host_header) == (443, True, "/prefix", b"engine.example")
    assert target_of("http://[::1]:9000").host_header == b"[::1]:9000"


class Sink:
    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.body = b""
        self.ended = asyncio.get_running_loop().create_future()

    def on_head(self, head: ResponseHead) -> None:
        self.head = head

    def on_body(self, chunk: bytes) -> None:
        self.body += chunk

    def on_end(self) -> None:
        self.ended.set_result("end")

    def on_lost(self, reason: str) -> None:
        self.ended.set_result(reason)


Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def exchange(answer: Answer) -> tuple[Sink, UpstreamPool]:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool()
    target = target_of(f"http://127.0.0.1:{port}")
    conn = await pool.connect(target)
    sink = Sink()
    conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n", b"{}", sink)
    async with asyncio.timeout(10):
        await sink.ended
    server.close()
    return sink, pool


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_kept_alive_answer_is_parsed_and_its_connection_goes_back_to_the_pool(framing: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        if framing == "length":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                         b"Content-Length: 11\r\n\r\n{\"ok\":true}")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"6\r\ndata: \r\n5\r\nhello\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection open until the client closes it

    sink, pool = await exchange(answer)
    assert sink.ended.result() == "end" and sink.head is not None and sink.head.status == 200
    if framing == "length":
        assert (sink.head.content_type, sink.head.content_length, sink.body) == ("application/json", 11, b'{"ok":true}')
    else:
        assert sink.head.event_stream and sink.head.chunked and sink.body == b"data: hello"
    assert sum(len(c) for c in pool.idle.values()) == 1
    pool.close()


async def test_a_body_delimited_by_the_close_ends_at_the_close() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        writer.close()

    sink, pool = await exchange(answer)
    assert (sink.ended.result(), sink.body) == ("end", b"all of it")
    assert not any(pool.idle.values())


@pytest.mark.parametrize(("reply", "reason"), [(b"this is no HTTP\r\n\r\n", "protocol"),
                                                (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "disconnect"),
                                                (b"", "disconnect")])
async def test_a_broken_answer_is_lost_with_its_reason(reply: bytes, reason: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(reply)
        writer.close()

    sink, pool = await exchange(answer)
    assert sink.ended.result() == reason
    assert not any(pool.idle.values())


async def test_an_informational_answer_is_skipped_for_the_final_one() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    sink, pool = await exchange(answer)
    assert (sink.ended.result(), sink.head.status, sink.body) == ("end", 201, b"ok")  # type: ignore[union-attr]
    pool.close()


async def test_the_head_reads_retry_after_and_every_connection_option_in_its_one_pass() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nConnection: X-Hop-A\r\nRETRY-AFTER: 9\r\n"
                     b"connection: keep-alive, X-Hop-B\r\nX-Engine: vllm\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    sink, pool = await exchange(answer)
    head = sink.head
    assert head is not None and sink.ended.result() == "end"
    assert head.retry_after == "7"  # the first, as a lookup of the field would find
    assert head.connection == "X-Hop-A, keep-alive, X-Hop-B"
    assert head.relayed == head.headers  # the pool was given no field to leave out
    pool.close()
