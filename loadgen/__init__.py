"""Load generator: trace readers, synthetic workloads, the open-loop client, statistics and reports.

Public surface:
- `read_trace(path, fmt=None)` streams `TraceRequest`s from Mooncake, Azure, BurstGPT or Flotilla
  JSONL files; `synthetic_requests(spec, seed)` builds Poisson, gamma or agent-session workloads.
- `OpenLoopRunner(RunnerConfig(...)).run(requests)` replays them and returns a `RunResult`.
- `RunResult` / `RequestRecord` / `Summary` are the result schema (also emitted by `sim`);
  `summarize(records, slo)` computes the summary.
- `time_base(result.meta["target_time_scales"])` and `in_time_base(result, base)` turn a run
  against time-scaled look-alike engines into modelled time, as `flotilla loadgen` reports it.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module defining it; imported on first use, so `import loadgen.results` (the
# simulator's path) does not pay for aiohttp, tqdm and numpy
_EXPORTS = {
    "LatencyStats": "loadgen.results",
    "OpenLoopRunner": "loadgen.runner",
    "RequestRecord": "loadgen.results",
    "RunResult": "loadgen.results",
    "RunnerConfig": "loadgen.runner",
    "Slo": "loadgen.results",
    "Summary": "loadgen.results",
    "TimeBase": "loadgen.timebase",
    "TraceRequest": "loadgen.trace",
    "parse_slo": "loadgen.stats",
    "in_time_base": "loadgen.timebase",
    "read_trace": "loadgen.readers",
    "summarize": "loadgen.stats",
    "synthetic_requests": "loadgen.synthetic",
    "time_base": "loadgen.timebase",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
