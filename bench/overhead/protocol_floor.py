"""The lowest floor: a pass-through on asyncio's protocols (uvloop), the least a Python
proxy can spend per request. Each client connection gets one engine connection of its own;
requests are written on as the client sent them and answers passed back byte for byte. No
HTTP parsing, routing, timeouts, accounting or metrics: what `flotilla proxy` spends beyond
it is its request path's own work, not Python's I/O."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import uvloop

from bench.overhead.floor import floor_args


class Engine(asyncio.Protocol):
    """The engine side of one client connection: answers go back to the client as they arrive."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is one, not a subclass

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    """One client connection: its bytes go to its engine connection once that is open."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.transport: asyncio.Transport | None = None
        self.engine: Engine | None = None
        self.waiting: list[bytes] | None = []
        """What the client sent before the engine connection was open."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            _, self.engine = await asyncio.get_running_loop().create_connection(
                lambda: Engine(self), self.host, self.port)
        except OSError:
            self.close()
            return
        for data in self.waiting or ():
            self.engine.transport.write(data)  # type: ignore[union-attr]
        self.waiting = None

    def data_received(self, data: bytes) -> None:
        if self.waiting is not None:
            self.waiting.append(data)
        elif self.engine is not None and self.engine.transport is not None:
            self.engine.transport.write(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.engine is not None and self.engine.transport is not None:
            self.engine.transport.close()


async def serve(port: int, backend: str) -> None:
    url = urlsplit(backend)
    host, engine_port = url.hostname or "127.0.0.1", url.port or 80
    server = await asyncio.get_running_loop().create_server(lambda: Client(host, engine_port), "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    args = floor_args(__doc__)
    uvloop.run(serve(args.port, args.backend))


if __name__ == "__main__":
    main()
