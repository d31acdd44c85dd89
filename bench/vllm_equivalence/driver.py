"""The one engine loop both sides run: arrivals and aborts by step, schedule, model output, update.

Stdlib only: the vLLM venv runs it over vLLM's scheduler, the project venv over the fake core.
A step is one pass of the engine loop. Synchronous: schedule, then apply that step's output.
Async (vLLM's `EngineCore.step_with_batch_queue` with a queue of 2): schedule step t, then apply
step t-1's output, so a request's token lands one pass after the step that computed it.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

Trace = dict[str, Any]


class Core(Protocol):
    """What the loop needs from a scheduler (adapters in vllm_side.py and fake_side.py)."""

    def add(self, request: dict[str, Any]) -> None: ...

    def abort(self, request_id: str) -> bool: ...

    def has_requests(self) -> bool: ...

    def schedule(self) -> tuple[Any, dict[str, Any]]:
        """A handle for `update` and the step's record (sched, new, resumed, preempted, kv)."""
        ...

    def update(self, handle: Any) -> list[tuple[str, bool, bool]]:
        """Apply the handle's step output: (request id, first token, finished) per token."""
        ...


def run(core: Core, workload: dict[str, Any], max_steps: int = 20_000) -> Trace:
    """Drive `core` through the workload; the trace of every step and every request."""
    is_async = bool(workload["settings"].get("async_scheduling"))
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for request in workload["requests"]:
        arrivals.setdefault(request["arrival_step"], []).append(request)
    aborts: dict[int, list[str]] = {}
    for abort in workload.get("aborts", []):
        aborts.setdefault(abort["step"], []).append(abort["id"])
    last_event = max([*arrivals, *aborts, 0])
    per_request = {r["id"]: {"first_token_step": None, "finish_step": None, "aborted": False}
                   for r in workload["requests"]}
    steps: list[dict[str, Any]] = []
    queue: deque[tuple[int, Any]] = deque()
    for step in range(max_steps):
        for request in arrivals.get(step, []):
            core.add(request)
        for request_id in aborts.get(step, []):
            if core.abort(request_id):
                per_request[request_id].update(finish_step=step, aborted=True)
        if step > last_event and not core.has_requests() and not queue:
            break
        if hasattr(core, "set_horizon"):  # a decode run may not cross the next arrival or abort
            upcoming = [k for k in (*arrivals, *aborts) if k > step]
            core.set_horizon(min(upcoming) - step if upcoming else max_steps)
        record: dict[str, Any] = {"step": step}
        if is_async:
            _async_pass(core, step, queue, record, per_request)
        else:
            _sync_pass(core, step, record, per_request)
        steps.append(record)
    return {"steps": steps, "requests": per_request}


def _apply(core: Core, step_of_output: int, handle: Any, per_request: dict[str, dict[str, Any]]) -> None:
    for request_id, first, finished in core.update(handle):
        if first:
            per_request[request_id]["first_token_step"] = step_of_output
        if finished:
            per_request[request_id]["finish_step"] = step_of_output


def _sync_pass(core: Core, step: int, record: dict[str, Any], per_request: dict[str, dict[str, Any]]) -> None:
    if not core.has_requests():
        return
    handle, scheduled = core.schedule()
    record.update(scheduled)
    _apply(core, step, handle, per_request)


def _async_pass(core: Core, step: int, queue: deque[tuple[int, Any]], record: dict[str, Any],
                per_request: dict[str, dict[str, Any]]) -> None:
    if core.has_requests():
        handle, scheduled = core.schedule()
        record.update(scheduled)
        queue.appendleft((step, handle))
        if len(queue) < 2 and (scheduled["sched"] or core.has_requests()):
            return  # the queue is not full: vLLM schedules again before waiting on an output
    elif not queue:
        return
    step_of_output, handle = queue.pop()
    _apply(core, step_of_output, handle, per_request)


def kind(num_computed_before: int, num_new: int, num_prompt: int) -> str:
    """"d" for a one-token step past the prompt (a decode), "p" for a prompt or recompute chunk."""
    return "d" if num_new == 1 and num_computed_before >= num_prompt else "p"


def compare(golden: Trace, trace: Trace) -> tuple[int, int, list[str]]:
    """(identical steps, steps, first differences) between two traces of one workload."""
    a, b = golden["steps"], trace["steps"]
    same = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    total = max(len(a), len(b))
    notes = [f"step {x['step']}: vllm {x} fake {y}" for x, y in zip(a, b, strict=False) if x != y][:3]
    if len(a) != len(b):
        notes.append(f"steps: vllm {len(a)} fake {len(b)}")
    if golden["requests"] != trace["requests"] and not notes:
        notes.append("per-request first-token or finish steps differ")
    return same, total, notes
