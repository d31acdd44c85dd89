import asyncio
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest

from bench.overhead.__main__ import REPO, free_port, wait_ready
from bench.overhead.instructions import END, START, command, main, totals
from tests.processes import kill_if_running


def test_the_count_is_read_from_the_dumps_totals_line() -> None:
    assert totals("events: Ir\nfn=(1) main\n5 10\ntotals: 123456\n") == 123456
    assert totals("events: Ir\nsummary: 42\n") == 42
    with pytest.raises(ValueError):
        totals("events: Ir\n")


async def test_the_protocol_floor_passes_requests_and_answers_through_on_kept_alive_connections() -> None:
    backend_port, floor_port = free_port(), free_port()
    backend = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.overhead.backend", "--port",
                                                   str(backend_port), cwd=REPO)
    floor = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.overhead.protocol_floor", "--port",
                                                 str(floor_port), "--backend", f"http://127.0.0.1:{backend_port}",
                                                 cwd=REPO)
    try:
        await wait_ready(f"http://127.0.0.1:{floor_port}/health")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
            async def one(i: int) -> dict:
                async with session.post(f"http://127.0.0.1:{floor_port}/v1/completions",
                                        json={"model": "bench", "prompt": f"p{i}", "max_tokens": 2}) as r:
                    assert r.status == 200
                    return await r.json()
            answers = await asyncio.gather(*(one(i) for i in range(40)))
        assert all(a["object"] == "text_completion" and a["usage"]["completion_tokens"] == 2 for a in answers)
    finally:
        for proc in (floor, backend):
            await kill_if_running(proc)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="needs valgrind")
def test_the_floors_are_counted_under_callgrind_and_published(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{START}\nold\n{END}\n\n## Later\n")
    assert main(["--policies", "--requests", "60", "--warmup", "10", "--write", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.endswith(f"{END}\n\n## Later\n")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in text.splitlines()
            if line.startswith("| protocol floor") or line.startswith("| aiohttp floor")}
    per_request = {name: float(value.rstrip("k").replace(",", "")) for name, value in rows.items()}
    # an aiohttp proxy parses, builds and schedules far more per request than two protocol callbacks
    assert set(per_request) == {"protocol floor", "aiohttp floor"}
    assert 0 < per_request["protocol floor"] < per_request["aiohttp floor"]


def test_asking_to_count_nothing_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--no-floor", "--policies"])
    assert exc.value.code == 2


def test_a_workers_target_runs_the_proxy_with_that_many_workers_in_its_build() -> None:
    argv = command("flotilla prefix-aware --workers 2 (compiled)", 8000, "http://127.0.0.1:9")
    assert argv[:3] == ["-m", "flotilla", "proxy"]
    assert argv[argv.index("--policy") + 1] == "prefix-aware"
    assert argv[argv.index("--workers") + 1] == "2"
    assert "--workers" not in command("flotilla prefix-aware (compiled)", 8000, "http://127.0.0.1:9")
