import logging
import os
from pathlib import Path

import pytest

from policies.routing.base import BackendState
from proxy import reload
from proxy.reload import apply_fleet
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


def _reload_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "proxy.reload" and r.levelno == logging.ERROR]


async def test_an_invalid_edit_keeps_the_old_backends_logs_one_line_and_later_edits_apply(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # issue 16: `models: 5` raised TypeError inside the watcher task, which died silently
    a = await fake_backend("a")
    b = await fake_backend("b")
    path = tmp_path / "fleet.yaml"
    write_fleet(path, [a.url], 1_000_000)
    p = await proxy_for([a], config_path=path, reload_interval_s=0.05)
    bad_edits = [
        (f"proxy:\n  backends:\n    - {{url: '{b.url}', models: 5}}\n", "proxy.backends[0].models=5: must be"),
        ("proxy:\n  backends: [\n    - {url: x\n", f"{path}:3:5: invalid YAML"),
        (f"backends:\n  - {{url: '{b.url}', weight: x}}\n", "backends[0].weight='x': must be a finite number"),
        ("backends: 5\n", "backends=5: must be a list"),
        ("policy: [1, 2]\nbackends: []\n", "policy=[1, 2]: must be a policy spec"),
    ]
    for n, (text, cause) in enumerate(bad_edits, start=1):
        caplog.clear()
        path.write_text(text)
        os.utime(path, (1_000_000 + 100 * n, 1_000_000 + 100 * n))
        [record] = await wait_until(lambda: _reload_errors(caplog), what=f"the watcher logged {cause!r}")
        message = record.getMessage()
        assert cause in message and str(path) in message, message
        assert "\n" not in message and record.exc_info is None
        assert [x.url for x in p.proxy.pool] == [a.url]
    write_fleet(path, [b.url], 1_001_000)
    await wait_until(lambda: [x.url for x in p.proxy.pool] == [b.url]
                     and p.proxy.pool.backends[0].state is BackendState.READY, what="the next valid edit applied")


async def test_an_unexpected_error_in_a_reload_is_logged_and_the_watcher_keeps_watching(
        fake_backend: BackendFactory, proxy_for: ProxyFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    a = await fake_backend("a")
    b = await fake_backend("b")
    calls: list[int] = []

    def flaky(pool, specs):  # the second reload hits a bug
        calls.append(len(specs))
        if len(calls) == 2:
            raise RuntimeError("boom")
        return apply_fleet(pool, specs)

    monkeypatch.setattr(reload, "apply_fleet", flaky)
    path = tmp_path / "fleet.yaml"
    write_fleet(path, [a.url], 1_000_000)
    p = await proxy_for([a], config_path=path, reload_interval_s=0.05)
    await wait_until(lambda: calls, what="the first read of the file")
    write_fleet(path, [a.url, b.url], 1_000_100)
    [record] = await wait_until(lambda: _reload_errors(caplog), what="the failed reload logged")
    assert "RuntimeError('boom')" in record.getMessage() and "\n" not in record.getMessage()
    write_fleet(path, [b.url], 1_000_200)
    await wait_until(lambda: [x.url for x in p.proxy.pool] == [b.url], what="the edit after the failure applied")
