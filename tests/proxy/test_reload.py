import os
from pathlib import Path

import pytest

from policies.routing.base import BackendState
from tests.proxy.conftest import BackendFactory, ProxyFactory
from tests.waiting import wait_until


def write_fleet(path: Path, urls: list[str], stamp: int) -> None:
    lines = ["proxy:", "  policy: round-robin", "  backends:"]
    lines += [f"    - {{url: '{u}', flavor: vllm, models: [tiny-llama]}}" for u in urls]
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, (stamp, stamp))  # mtime moves even within one clock tick


async def test_changed_fleet_file_adds_and_drains_backends(fake_backend: BackendFactory, proxy_for: ProxyFactory,
                                                           tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = await fake_backend("a")
    b = await fake_backend("b")
    path = tmp_path / "fleet.yaml"
    write_fleet(path, [a.url], 1_000_000)
    p = await proxy_for([a], config_path=path,
                        reload_interval_s=0.05)
    write_fleet(path, [b.url], 1_000_100)
    await wait_until(lambda: [x.url for x in p.proxy.pool] == [b.url]
                     and p.proxy.pool.backends[0].state is BackendState.READY, what="b alone and READY")
    path.write_text("backends: [ {url: 'not a url'} ]\n")  # a broken edit keeps the last good pool
    os.utime(path, (1_000_200, 1_000_200))
    await wait_until(lambda: "not reloaded" in caplog.text, what="the watcher read the broken file")
    assert [x.url for x in p.proxy.pool] == [b.url]
