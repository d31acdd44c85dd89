"""Replica count over time, read from the router's Prometheus metrics while a run goes on.

The router exports `flotilla_backend_state{backend, state}` as 1 for the state each backend is
in; the replica count is the number of backends in state `ready`. Unreachable metrics give no
samples rather than an error: the plot then simply has no replica line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

REPLICA_METRIC = "flotilla_backend_state"
READY_STATE = "ready"


def ready_replicas(metrics_text: str, state: str | None = READY_STATE) -> int | None:
    """Backends in state `state` (None: in any state, so every replica paid for) in a Prometheus
    exposition; None when the metric is absent."""
    # parse only the one family: a full engine exposition takes tens of milliseconds to parse,
    # long enough to make the open loop late while the poll runs on the same event loop
    wanted = "\n".join(line for line in metrics_text.splitlines() if REPLICA_METRIC in line)
    count: int | None = None
    for family in text_string_to_metric_families(wanted):
        if family.name != REPLICA_METRIC:
            continue
        count = count or 0
        count += sum(int(s.value) for s in family.samples if state is None or s.labels.get("state") == state)
    return count


async def poll_replicas(session: aiohttp.ClientSession, metrics_url: str, now_s: Callable[[], float],
                        interval_s: float, samples: list[tuple[float, int]],
                        listed: list[tuple[float, int]] | None = None) -> None:
    """Append (now_s(), ready replicas) to `samples`, and (now_s(), replicas in any state) to
    `listed`, every `interval_s` until cancelled."""
    while True:
        text = None
        try:
            async with session.get(metrics_url) as resp:
                text = await resp.text() if resp.status == 200 else None
            count = ready_replicas(text) if text is not None else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            count = None  # the router may not be up yet, or not export the metric
        if count is not None and text is not None:
            samples.append((now_s(), count))
            if listed is not None:
                listed.append((now_s(), ready_replicas(text, None) or 0))
        await asyncio.sleep(interval_s)
