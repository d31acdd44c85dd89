"""Load generator: trace readers, synthetic workloads, the open-loop client, statistics and reports.

Public surface:
- `read_trace(path, fmt=None)` streams `TraceRequest`s from Mooncake, Azure, BurstGPT or Flotilla
  JSONL files; `synthetic_requests(spec, seed)` builds Poisson, gamma or agent-session workloads.
- `OpenLoopRunner(RunnerConfig(...)).run(requests)` replays them and returns a `RunResult`.
- `RunResult` / `RequestRecord` / `Summary` are the result schema (also emitted by `sim`);
  `summarize(records, slo)` computes the summary.
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
    "TraceRequest": "loadgen.trace",
    "parse_slo": "loadgen.stats",
    "read_trace": "loadgen.readers",
    "summarize": "loadgen.stats",
    "synthetic_requests": "loadgen.synthetic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
