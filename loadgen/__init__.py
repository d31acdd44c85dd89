"""Load generator: trace readers, synthetic workloads, the open-loop client, statistics and reports.

Public surface:
- `read_trace(path, fmt=None)` streams `TraceRequest`s from Mooncake, Azure, BurstGPT or Flotilla
  JSONL files; `synthetic_requests(spec, seed)` builds Poisson, gamma or agent-session workloads.
- `OpenLoopRunner(RunnerConfig(...)).run(requests)` replays them and returns a `RunResult`.
- `RunResult` / `RequestRecord` / `Summary` are the result schema (also emitted by `sim`);
  `summarize(records, slo)` computes the summary.
"""

from loadgen.readers import read_trace
from loadgen.results import LatencyStats, RequestRecord, RunResult, Slo, Summary
from loadgen.runner import OpenLoopRunner, RunnerConfig
from loadgen.stats import parse_slo, summarize
from loadgen.synthetic import synthetic_requests
from loadgen.trace import TraceRequest

__all__ = [
    "LatencyStats",
    "OpenLoopRunner",
    "RequestRecord",
    "RunResult",
    "RunnerConfig",
    "Slo",
    "Summary",
    "TraceRequest",
    "parse_slo",
    "read_trace",
    "summarize",
    "synthetic_requests",
]
