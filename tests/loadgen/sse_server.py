"""The test SSE server as a separate process: `python -m tests.loadgen.sse_server --token-delay-s 0.1`.

Timing tests run the server out of process so its work does not share the client's event loop;
it prints its port on the first line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

from tests.loadgen.conftest import SseServerState, make_app


async def _serve(token_delay_s: float) -> None:
    runner = web.AppRunner(make_app(SseServerState(token_delay_s=token_delay_s)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    asyncio.run(_serve(parser.parse_args().token_delay_s))


if __name__ == "__main__":
    sys.exit(main())
