"""The live driver: engine time follows modelled step times, aborts free the core at once, drain waits."""

from __future__ import annotations

import asyncio

import pytest

from fake_engines.core import EngineRequest, VllmScheduler, VllmSchedulerConfig
from fake_engines.driver.live import LiveDriver, RequestHandle, StepReport
from tests.waiting import wait_until

STEP_S = 0.02


class Recorder:
    """Keeps what the driver reports (the metrics surfaces get the same calls)."""

    def __init__(self) -> None:
        self.steps: list[StepReport] = []
        self.aborted: list[str] = []

    def on_step(self, report: StepReport) -> None:
        self.steps.append(report)

    def on_abort(self, handle: RequestHandle, now_s: float) -> None:
        self.aborted.append(handle.request.request_id)


def _driver(recorder: Recorder, time_scale: float = 0.05) -> LiveDriver:
    core = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=64, max_model_len=512, max_num_batched_tokens=512))
    return LiveDriver(core, lambda batch: STEP_S, time_scale=time_scale, observer=recorder)


def _request(rid: str, max_tokens: int) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=list(range(40)), max_tokens=max_tokens,
                         output_len=max_tokens)


async def test_engine_time_advances_by_modelled_step_times_only():
    recorder = Recorder()
    driver = _driver(recorder)
    driver.start()
    handle = driver.submit(_request("a", 5))
    outputs = [out async for out in handle.outputs()]
    await driver.stop()
    times = handle.times
    assert [len(o.new_token_ids) for o in outputs] == [1, 1, 1, 1, 1] and outputs[-1].finished
    assert times.scheduled_s == times.arrival_s
    assert times.first_token_s - times.arrival_s == pytest.approx(STEP_S)
    assert times.finished_s - times.first_token_s == pytest.approx(4 * STEP_S)
    assert [r.finished_s - r.started_s for r in recorder.steps] == pytest.approx([STEP_S] * 5)


async def test_abort_frees_the_request_at_once_and_tells_the_observer():
    recorder = Recorder()
    driver = _driver(recorder, time_scale=1.0)
    driver.start()
    handle = driver.submit(_request("a", 400))
    await handle.queue.get()
    driver.abort("a")
    stats = driver.core.stats()
    await driver.stop()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
    assert recorder.aborted == ["a"] and handle.aborted and driver.handles == {}


async def test_drain_returns_once_every_request_finished():
    driver = _driver(Recorder())
    driver.start()
    handles = [driver.submit(_request(f"r{i}", 3)) for i in range(4)]
    await asyncio.wait_for(driver.drain(), 10)
    await driver.stop()
    assert all(h.times.finished_s is not None for h in handles)


def test_time_scale_must_be_positive():
    with pytest.raises(ValueError, match="time_scale"):
        LiveDriver(VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=8)), lambda batch: 0.0, time_scale=0)


async def test_pipeline_parallel_core_keeps_two_steps_in_flight_and_finishes():
    core = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=64, max_model_len=512, max_concurrent_batches=2))
    recorder = Recorder()
    driver = LiveDriver(core, lambda batch: STEP_S, time_scale=0.05, observer=recorder)
    driver.start()
    handles = [driver.submit(_request("r0", 4))]
    # once the first step is launched the next request gets its own batch; poll by yielding only, as
    # a step lasts 1 ms here and a timed poll could see r0 finish before r1 is sent
    await wait_until(lambda: handles[0].times.scheduled_s is not None, poll_s=0, what="r0's first step launched")
    handles.append(driver.submit(_request("r1", 4)))
    await asyncio.wait_for(driver.drain(), 10)
    await driver.stop()
    assert all(len(h.request.output_token_ids) == 4 for h in handles)
    starts = sorted(r.started_s for r in recorder.steps)
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) == pytest.approx(STEP_S / 2)


async def test_async_scheduling_runs_steps_back_to_back_scheduling_each_before_the_last_ends():
    # vLLM's engine core under async scheduling: step t+1 is scheduled while step t runs and the
    # GPU runs it when step t ends; a lone request gets its tokens exactly when it would in sync
    core = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=64, max_model_len=512, async_scheduling=True))
    recorder = Recorder()
    driver = LiveDriver(core, lambda batch: STEP_S, time_scale=0.05, observer=recorder)
    driver.start()
    handle = driver.submit(_request("a", 5))
    outputs = [out async for out in handle.outputs()]
    await driver.stop()
    assert [o.num_output_tokens for o in outputs] == [1, 2, 3, 4, 5] and outputs[-1].finished
    assert handle.times.first_token_s - handle.times.arrival_s == pytest.approx(STEP_S)
    assert handle.times.finished_s - handle.times.first_token_s == pytest.approx(4 * STEP_S)
    spans = sorted((r.started_s, r.finished_s) for r in recorder.steps)
    assert all(b[0] == pytest.approx(a[1]) for a, b in zip(spans, spans[1:], strict=False))
