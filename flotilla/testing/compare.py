"""Several policies on identical arrivals, as a table with rows by policy and columns by metric.

    table = await compare_policies(flotilla_sim, ["round-robin", "least-outstanding"],
                                   workload="poisson:rate=5,duration=20", engines=3)
    table["least-outstanding"]["e2e_p99_s"] < table["round-robin"]["e2e_p99_s"]
    print(table.table())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flotilla.testing.spec import FleetSpec
from flotilla.testing.workload import ReplayOptions, Workload, load_workload
from loadgen.results import RunResult

FleetFactory = Callable[..., Awaitable[Any]]
"""`flotilla_fleet` or `flotilla_sim`: (config=None, **fleet settings) -> a started fleet."""

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
DEFAULT_COLUMNS = ("num_ok", "num_failed", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "e2e_p90_s",
                   "e2e_p99_s", "e2e_max_s", "prefix_hit_rate", "goodput_per_s", "busiest_backend_share")


@dataclass(frozen=True)
class Row:
    """One policy's figures; `row["e2e_p99_s"]` reads a metric."""

    policy: str
    """The policy spec as given."""
    metrics: Mapping[str, float | None]
    """Metric name -> value; latencies in modelled seconds, rates in [0, 1]."""
    result: Any
    """The full result: a loadgen `RunResult`, or a `FluidRun` for scaling comparisons."""

    def __getitem__(self, metric: str) -> float | None:
        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r}; known: {sorted(self.metrics)}")
        return self.metrics[metric]


@dataclass(frozen=True)
class Comparison:
    """Rows in the order the policies were given; `table[policy][metric]` reads one figure."""

    rows: tuple[Row, ...]
    """One row per policy."""

    def __getitem__(self, policy: str) -> Row:
        for row in self.rows:
            if row.policy == policy:
                return row
        raise KeyError(f"no policy {policy!r}; compared: {self.policies}")

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def policies(self) -> list[str]:
        """The compared policies, in order."""
        return [row.policy for row in self.rows]

    def metric(self, name: str) -> dict[str, float | None]:
        """Policy -> value of one metric."""
        return {row.policy: row[name] for row in self.rows}

    def best(self, name: str, lower_is_better: bool = True) -> str:
        """The policy with the lowest (or highest) value of `name`; rows without one are skipped."""
        values = {p: v for p, v in self.metric(name).items() if v is not None}
        if not values:
            raise ValueError(f"no policy has a value for {name!r}")
        pick = min if lower_is_better else max
        return pick(values, key=lambda p: values[p])

    def table(self, columns: Sequence[str] | None = None) -> str:
        """A fixed-width text table: a row per policy; latencies in ms (s when a column reaches
        10 s), rates and shares in %."""
        cols = list(columns) if columns else self._default_columns()
        formats = [_Column(c, [row[c] for row in self.rows]) for c in cols]
        width = max([len("policy"), *(len(p) for p in self.policies)])
        head = f"{'policy':<{width}}  " + "  ".join(f"{f.heading:>{f.width}}" for f in formats)
        lines = [head, "-" * len(head)]
        for row in self.rows:
            cells = "  ".join(f"{f.cell(row[f.name]):>{f.width}}" for f in formats)
            lines.append(f"{row.policy:<{width}}  {cells}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _default_columns(self) -> list[str]:
        if not self.rows:
            return []
        present = list(self.rows[0].metrics)
        cols = [c for c in DEFAULT_COLUMNS if c in present]
        if "goodput_per_s" in cols and all(r["goodput_per_s"] is None for r in self.rows):
            cols.remove("goodput_per_s")
        return cols or present


class _Column:
    """How one column is headed and printed, from its name's unit suffix and its values."""

    def __init__(self, name: str, values: Sequence[float | None]) -> None:
        self.name = name
        numbers = [abs(v) for v in values if v is not None]
        self.scale, unit = 1.0, ""
        if name.endswith("_s"):
            self.scale, unit = (1.0, "s") if max(numbers, default=0.0) >= 10 else (1e3, "ms")
            name = name[:-2]
        elif name.endswith(("_rate", "_share")):
            self.scale, unit = 100.0, "%"
        self.unit = unit
        self.heading = f"{name} {unit}".strip()
        self.width = max(9, len(self.heading))

    def cell(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.unit:
            return f"{value * self.scale:.1f}"
        return f"{value:g}"


def run_metrics(result: RunResult) -> dict[str, float | None]:
    """The flat figures of a loadgen result that comparisons name."""
    s = result.summary
    out: dict[str, float | None] = {"num_requests": s.num_requests, "num_ok": s.num_ok, "num_failed": s.num_failed}
    for name in LATENCIES:
        stats = getattr(s, f"{name}_s")
        out.update({f"{name}_{stat}_s": getattr(stats, stat) for stat in STATS})
    e2e = [r.e2e_s for r in result.requests if r.ok and r.e2e_s is not None]
    out["e2e_max_s"] = max(e2e, default=None)
    out["prefix_hit_rate"] = s.prefix_hit_rate
    out["goodput_per_s"] = s.goodput_per_s
    out["request_throughput_per_s"] = s.request_throughput_per_s
    out["output_throughput_tok_per_s"] = s.output_throughput_tok_per_s
    served = s.requests_per_backend.values()
    out["busiest_backend_share"] = max(served) / s.num_ok if s.num_ok else None
    return out


async def compare_policies(factory: FleetFactory, policies: Sequence[str], workload: Workload,
                           config: str | Path | Mapping[str, Any] | FleetSpec | None = None,
                           **options: Any) -> Comparison:
    """Run `workload` through a fresh fleet per policy, on identical arrivals.

    `options` mix fleet settings (engines, flavor, model, gpu, time_scale, engine_options, ..., or
    `fleet=` a `flotilla up` fleet file)
    and replay options (max_requests, duration_s, slo, endpoint, ...); `seed` seeds both the
    fleet and a synthetic workload. Each fleet is closed once its replay is done."""
    fleet_settings, replay_settings = _split(options)
    opts = ReplayOptions.from_kwargs(**replay_settings)
    requests = load_workload(workload, opts)
    rows = []
    for policy in policies:
        fleet = await factory(config, **fleet_settings, policy=policy)
        try:
            result = await fleet.replay(requests, **{**replay_settings, "label": policy,
                                                     "max_requests": None, "duration_s": None})
        finally:
            await fleet.close()
        rows.append(Row(policy, run_metrics(result), result))
    return Comparison(tuple(rows))


def _split(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fleet_names = {f.name for f in dataclasses.fields(FleetSpec)} | {"fleet"}
    replay_names = {f.name for f in dataclasses.fields(ReplayOptions)}
    if "policy" in options:
        raise TypeError("compare_policies takes the policies as a list; do not pass policy=")
    if unknown := sorted(set(options) - fleet_names - replay_names):
        raise TypeError(f"unknown option(s) {unknown}; fleet settings: {sorted(fleet_names)}, "
                        f"replay options: {sorted(replay_names)}")
    return ({k: v for k, v in options.items() if k in fleet_names},
            {k: v for k, v in options.items() if k in replay_names})
