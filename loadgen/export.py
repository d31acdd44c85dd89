"""Results in shapes other tools read: `vllm bench serve --save-result` JSON and CSV.

`--output-format json` (the default) writes Flotilla's own `RunResult` schema; `vllm-bench`
writes the keys and units of vLLM 0.32's `vllm/benchmarks/serve.py` (milliseconds, `mean_`,
`median_`, `std_` and `pNN_` keys per metric, `request_throughput`, ...), so scripts written for
`vllm bench serve` results read a Flotilla run; `csv` writes one row per request and a summary
file beside it (`RUN.summary.csv`), one row per run.

vLLM's definitions are followed where they differ from the Flotilla summary: a metric without
samples is 0.0, not None; `total_input_tokens` and `total_output_tokens` count completed
requests only; `request_goodput` is None without SLOs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.results import RequestRecord, RunResult
from loadgen.stats import DEFAULT_PERCENTILES, _all_gaps, percentile_key

OUTPUT_FORMATS = ("json", "vllm-bench", "csv")
VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")
"""vLLM's metric names (`--percentile-metrics`); e2el is the end-to-end latency."""


def output_format(fmt: str | None, path: str | Path) -> str:
    """The format to write `path` in: `fmt`, else csv for a `.csv` path, else json."""
    if fmt is None:
        return "csv" if str(path).endswith(".csv") else "json"
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"--output-format {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    return fmt


def parse_percentile_metrics(spec: str) -> tuple[str, ...]:
    """`ttft,tpot,itl,e2el` (vLLM's `--percentile-metrics`) to metric names, checked."""
    names = tuple(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    bad = [n for n in names if n not in VLLM_METRICS]
    if not names or bad:
        raise ValueError(f"bad --percentile-metrics {spec!r}: choose from {','.join(VLLM_METRICS)}")
    return names


def write_result(result: RunResult, path: str | Path, fmt: str | None = None,
                 percentile_metrics: Sequence[str] = VLLM_METRICS) -> list[Path]:
    """Write `result` to `path` in `fmt` (see `output_format`); the files written."""
    chosen = output_format(fmt, path)
    if chosen == "json":
        result.save(path)
        return [Path(path)]
    if chosen == "vllm-bench":
        data = vllm_bench_result(result, percentile_metrics=percentile_metrics)
        Path(path).write_text(json.dumps(data) + "\n", encoding="utf-8")
        return [Path(path)]
    return write_csv(result, path)


# -- vllm bench serve ------------------------------------------------------------------------


def _ms_stats(name: str, values: Sequence[float] | np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    # vLLM: np.mean(values or 0) * 1000 -- a metric without samples is 0.0
    arr = np.asarray(values, dtype=float) if len(values) else np.zeros(1)
    out = {f"mean_{name}_ms": float(arr.mean()) * 1000, f"median_{name}_ms": float(np.median(arr)) * 1000,
           f"std_{name}_ms": float(arr.std()) * 1000}
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(arr, p)) * 1000
    return out


def _metric_samples(ok: Sequence[RequestRecord]) -> dict[str, Sequence[float] | np.ndarray]:
    return {"ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
            "tpot": [r.tpot_s for r in ok if r.tpot_s is not None and r.completion_tokens > 1],
            "itl": _all_gaps(ok),
            "e2el": [r.e2e_s for r in ok if r.e2e_s is not None]}


def peak_per_second(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's `max_output_tokens_per_s` and `max_concurrent_requests`: tokens and requests in
    flight per one-second bucket from the first send, at the busiest bucket."""
    if not ok:
        return 0.0, 0
    start = min(r.send_time_s for r in ok)
    end = max(r.send_time_s + (r.e2e_s or 0.0) for r in ok)
    buckets = int(np.ceil(end - start)) + 1
    tokens = np.zeros(buckets)
    active = np.zeros(buckets + 1)
    for r in ok:
        first = r.send_time_s + (r.ttft_s or 0.0)
        times = first + np.concatenate(([0.0], np.cumsum(np.asarray(r.itl_s, dtype=float))))
        idx = (times - start).astype(int)
        np.add.at(tokens, idx[(idx >= 0) & (idx < buckets)], 1)
        lo, hi = int(r.send_time_s - start), int(r.send_time_s + (r.e2e_s or 0.0) - start)
        active[lo] += 1
        active[hi + 1] -= 1
    return float(tokens.max()), int(np.cumsum(active)[:buckets].max())


def _date(meta: dict[str, Any]) -> str:
    started = meta.get("started_at")
    when = datetime.fromisoformat(started) if started else datetime.now()
    return when.strftime("%Y%m%d-%H%M%S")  # vLLM's --save-result date


def _offered_rate(result: RunResult) -> float | str:
    """The request rate vLLM records: the run's own (a sweep point's) or the schedule's mean."""
    rate = result.meta.get("request_rate")
    if rate is not None:
        return rate if rate != float("inf") else "inf"
    times = [r.scheduled_time_s for r in result.requests]
    span = max(times, default=0.0) - min(times, default=0.0)
    return len(times) / span if span > 0 else "inf"


def vllm_bench_result(result: RunResult, percentiles: Sequence[float] | None = None,
                      percentile_metrics: Sequence[str] = VLLM_METRICS) -> dict[str, Any]:
    """`result` as `vllm bench serve --save-result` writes it (vLLM 0.32, without
    `--save-detailed`); `percentiles` default to the ones the summary was made with."""
    meta, s = result.meta, result.summary
    pcts = percentiles or [float(k[1:]) for k in s.ttft_s.percentiles] or list(DEFAULT_PERCENTILES)
    ok = [r for r in result.requests if r.ok]
    backend = "flotilla-sim" if meta.get("source") == "sim" else \
        ("openai-chat" if meta.get("endpoint") == "chat" else "openai")
    model = meta.get("model")
    peak_tokens, peak_requests = peak_per_second(ok)
    total_in, total_out = sum(r.prompt_tokens for r in ok), sum(r.completion_tokens for r in ok)
    dur = s.duration_s
    per_s = 1.0 / dur if dur > 0 else 0.0
    out: dict[str, Any] = {
        "date": _date(meta), "endpoint_type": backend, "backend": backend, "label": result.label,
        "model_id": model, "tokenizer_id": model, "num_prompts": len(result.requests),
        # Flotilla's provenance, as vLLM's --metadata KEY=VALUE adds keys at the top level
        "flotilla_version": meta.get("flotilla_version"), "flotilla_command": meta.get("command"),
        "flotilla_trace_sha256": meta.get("trace_sha256"), "flotilla_time_base": meta.get("time_base"),
        "request_rate": _offered_rate(result), "burstiness": float(meta.get("burstiness", 1.0)),
        "max_concurrency": meta.get("max_concurrency"),
        "duration": dur, "completed": len(ok), "failed": len(result.requests) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) * per_s,
        "request_goodput": s.goodput_per_s,
        "output_throughput": total_out * per_s, "total_token_throughput": (total_in + total_out) * per_s,
        "latencies": [r.e2e_s if r.ok and r.e2e_s is not None else 0.0 for r in result.requests],
        "queue_times": [max(0.0, r.lateness_s) for r in result.requests],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests, "rtfx": 0.0,
    }
    samples = _metric_samples(ok)
    for name in VLLM_METRICS:
        if name in percentile_metrics:
            out.update(_ms_stats(name, samples[name], pcts))
    return out


# -- CSV -------------------------------------------------------------------------------------

REQUEST_COLUMNS = ("index", "session_id", "backend", "ok", "error", "scheduled_time_s", "send_time_s",
                   "lateness_s", "ttft_s", "tpot_s", "e2e_s", "itl_count", "itl_mean_s", "itl_max_s",
                   "prompt_tokens", "completion_tokens", "cached_tokens", "itl_s")
"""Columns of the per-request CSV; `itl_s` holds every gap, separated by spaces."""


def _request_row(r: RequestRecord) -> list[Any]:
    gaps = list(r.itl_s)
    return [r.index, r.session_id or "", r.backend or "", int(r.ok), r.error or "", r.scheduled_time_s,
            r.send_time_s, r.lateness_s, _blank(r.ttft_s), _blank(r.tpot_s), _blank(r.e2e_s), len(gaps),
            sum(gaps) / len(gaps) if gaps else "", max(gaps) if gaps else "", r.prompt_tokens,
            r.completion_tokens, r.cached_tokens, " ".join(repr(g) for g in gaps)]


def _blank(value: float | None) -> Any:
    return "" if value is None else value


def summary_row(result: RunResult) -> dict[str, Any]:
    """One run's summary flattened to `name -> value` (`ttft_s.p99.9`, `slo.ttft_s`, ...),
    with its label first: a row of the summary CSV."""
    row: dict[str, Any] = {"label": result.label}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                # a latency's chosen percentiles sit beside its p50/p90/p99: ttft_s.p99.9
                flatten(prefix if key == "percentiles" else f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            row[prefix] = _blank(value)

    summary = result.to_json()["summary"]
    summary.pop("requests_per_backend", None)  # one column per backend would differ between runs
    if summary.get("slo") is None:
        summary.pop("slo", None)
    flatten("", summary)
    for key in ("started_at", "flotilla_version", "time_base", "time_scale", "trace_sha256", "command"):
        row[f"meta.{key}"] = _blank(result.meta.get(key))
    return row


def summary_csv(results: Sequence[RunResult]) -> str:
    """The summary CSV of several runs: one header, one row per run."""
    rows = [summary_row(r) for r in results]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def summary_path(path: str | Path) -> Path:
    """`run.csv` -> `run.summary.csv`: where the summary of a per-request CSV goes."""
    p = Path(path)
    return p.with_name(f"{p.stem if p.suffix == '.csv' else p.name}.summary.csv")


def write_csv(result: RunResult, path: str | Path) -> list[Path]:
    """One row per request at `path`, the summary at `summary_path(path)`; the files written."""
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(REQUEST_COLUMNS)
        writer.writerows(_request_row(r) for r in result.requests)
    summary = summary_path(path)
    summary.write_text(summary_csv([result]), encoding="utf-8")
    return [Path(path), summary]
