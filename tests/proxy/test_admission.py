"""Per-model slots, the bounded FIFO queue behind them, and Retry-After when it is full."""

from __future__ import annotations

import asyncio

import pytest

from proxy.admission import Admission, retry_after_s
from proxy.errors import ProxyError
from tests.waiting import wait_until


def _in_flight(adm: Admission, model: str) -> int:
    return adm.gates[model].in_flight if model in adm.gates else 0


def test_retry_after_is_the_queue_drain_time_in_whole_seconds():
    assert retry_after_s(queued=50, slots=4, mean_service_s=0.2) == 3  # 50 / 4 x 0.2 = 2.5
    assert retry_after_s(queued=1, slots=8, mean_service_s=0.1) == 1  # never below one second
    assert retry_after_s(queued=100, slots=10, mean_service_s=2.0) == 20


async def test_requests_past_the_slots_wait_in_order_and_past_the_queue_get_429():
    adm = Admission(slots=1, max_queued=2, queue_timeout_s=10)
    order: list[int] = []
    release = asyncio.Event()

    async def request(i: int) -> None:
        async with adm.slot("m"):
            order.append(i)
            await release.wait()

    tasks = [asyncio.create_task(request(i)) for i in range(3)]
    await wait_until(lambda: order == [0] and adm.queued() == 2, what="one request in, two queued")
    with pytest.raises(ProxyError) as err:
        async with adm.slot("m"):
            pass
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "3"  # 3 ahead x 1 s (no history)
    async with adm.slot("other"):  # another model has its own gate
        pass
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert adm.gates["m"].in_flight == 0 and adm.queued() == 0


async def test_a_request_that_waits_too_long_gets_503_and_leaves_the_queue():
    adm = Admission(slots=1, max_queued=5, queue_timeout_s=0.05)
    hold = asyncio.Event()

    async def holder() -> None:
        async with adm.slot("m"):
            await hold.wait()

    task = asyncio.create_task(holder())
    await wait_until(lambda: _in_flight(adm, "m") == 1, what="the holder has the slot")
    with pytest.raises(ProxyError) as err:
        async with adm.slot("m"):
            pass
    assert err.value.status == 503 and adm.queued() == 0
    hold.set()
    await task
    assert adm.gates["m"].in_flight == 0


async def test_a_cancelled_waiter_does_not_leak_its_slot():
    adm = Admission(slots=1, max_queued=5, queue_timeout_s=10)
    hold = asyncio.Event()

    async def user() -> None:
        async with adm.slot("m"):
            await hold.wait()

    first = asyncio.create_task(user())
    await wait_until(lambda: _in_flight(adm, "m") == 1, what="the first user has the slot")
    waiting = asyncio.create_task(user())
    await wait_until(lambda: adm.queued() == 1, what="the second user queued")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    hold.set()
    await first
    gate = adm.gates["m"]
    assert gate.in_flight == 0 and not gate.waiters
    async with adm.slot("m"):
        assert gate.in_flight == 1


def test_model_names_past_the_cap_share_one_gate():
    adm = Admission(slots=1, max_queued=1, queue_timeout_s=1, max_models=3)
    for i in range(10):
        adm.gate(f"model-{i}")
    assert len(adm.gates) == 4  # three named, one shared overflow
