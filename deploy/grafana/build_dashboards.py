"""Write the Grafana dashboards (Fleet, Router, Autoscaler) as JSON.

Panels are listed as data so every PromQL expression lives in one place; the tests run each
expression against a real Prometheus scraping a running fleet. Engine panels use the real vLLM
and llama.cpp metric names, so the Fleet dashboard works unchanged on real engines.

    python deploy/grafana/build_dashboards.py      # rewrites deploy/grafana/dashboards/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
W = "[1m]"


def q(p: float, metric: str) -> str:
    return f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{W})))"


def either(vllm: str, llamacpp: str) -> str:
    """A fleet total over both engine kinds that still has a value when only one kind runs
    (a plain `+` is empty as soon as one side has no series)."""
    return f"({vllm} or vector(0)) + ({llamacpp} or vector(0))"


# dashboard -> [(panel title, unit, [(legend, expr), ...]), ...]
DASHBOARDS: dict[str, list[tuple[str, str, list[tuple[str, str]]]]] = {
    "Fleet": [
        ("Requests finished per second", "reqps", [
            ("vLLM {{instance}}", f"sum by (instance) (rate(vllm:request_success_total{W}))"),
            ("llama.cpp {{instance}}", f"sum by (instance) (rate(llamacpp:n_decode_total{W}))"),
        ]),
        ("Time to first token", "s", [
            ("p50", q(0.5, "vllm:time_to_first_token_seconds")),
            ("p90", q(0.9, "vllm:time_to_first_token_seconds")),
            ("p99", q(0.99, "vllm:time_to_first_token_seconds")),
        ]),
        ("Inter-token latency", "s", [
            ("p50", q(0.5, "vllm:inter_token_latency_seconds")),
            ("p99", q(0.99, "vllm:inter_token_latency_seconds")),
        ]),
        ("End-to-end latency", "s", [
            ("p50", q(0.5, "vllm:e2e_request_latency_seconds")),
            ("p99", q(0.99, "vllm:e2e_request_latency_seconds")),
        ]),
        ("Running and waiting per engine", "short", [
            ("running {{instance}}", "sum by (instance) (vllm:num_requests_running)"),
            ("waiting {{instance}}", "sum by (instance) (vllm:num_requests_waiting)"),
            ("processing {{instance}}", "sum by (instance) (llamacpp:requests_processing)"),
            ("deferred {{instance}}", "sum by (instance) (llamacpp:requests_deferred)"),
        ]),
        ("KV-cache usage", "percentunit", [
            ("{{instance}}", "max by (instance) (vllm:kv_cache_usage_perc)"),
        ]),
        ("Prefix-cache hit rate", "percentunit", [
            ("vLLM", f"sum(rate(vllm:prefix_cache_hits_total{W})) / sum(rate(vllm:prefix_cache_queries_total{W}))"),
            ("llama.cpp", f"sum(rate(llamacpp:prompt_tokens_cached_total{W})) / "
                          f"(sum(rate(llamacpp:prompt_tokens_total{W})) + sum(rate(llamacpp:prompt_tokens_cached_total{W})))"),
        ]),
        ("Tokens per second", "short", [
            ("prompt", either(f"sum(rate(vllm:prompt_tokens_total{W}))", f"sum(rate(llamacpp:prompt_tokens_total{W}))")),
            ("generation", either(f"sum(rate(vllm:generation_tokens_total{W}))",
                                  f"sum(rate(llamacpp:tokens_predicted_total{W}))")),
        ]),
    ],
    "Router": [
        ("Requests by status", "reqps", [
            ("{{status}}", f"sum by (status) (rate(flotilla_requests_total{W}))"),
        ]),
        ("Requests by backend", "reqps", [
            ("{{backend}}", f"sum by (backend) (rate(flotilla_requests_total{W}))"),
        ]),
        ("Routing decisions by rule", "reqps", [
            ("{{policy}} {{rule}}", f"sum by (policy, rule) (rate(flotilla_routing_decisions_total{W}))"),
        ]),
        ("Router time to first byte", "s", [
            ("p50", q(0.5, "flotilla_time_to_first_token_seconds")),
            ("p99", q(0.99, "flotilla_time_to_first_token_seconds")),
        ]),
        ("In flight per backend", "short", [
            ("{{backend}}", "sum by (backend) (flotilla_backend_in_flight)"),
        ]),
        ("Retries and ejections", "short", [
            ("retries", f"sum(rate(flotilla_retries_total{W})) or vector(0)"),
            ("ejections", "sum(flotilla_backend_ejections_total) or vector(0)"),
        ]),
        ("Scrape age", "s", [
            ("{{backend}}", "max by (backend) (flotilla_backend_scrape_age_seconds)"),
        ]),
    ],
    "Autoscaler": [
        ("Replicas", "short", [
            ("desired", "max(flotilla_autoscaler_desired_replicas)"),
            ("{{state}}", "sum by (state) (flotilla_autoscaler_replicas)"),
        ]),
        ("Scaling decisions by reason", "short", [
            ("{{policy}} {{reason}}", "sum by (policy, reason) (flotilla_autoscaler_decisions_total)"),
        ]),
        ("Measured cold start", "s", [
            ("last", "max(flotilla_autoscaler_cold_start_seconds)"),
        ]),
        ("Waiting requests (scaling signal)", "short", [
            ("waiting", either("sum(vllm:num_requests_waiting)", "sum(llamacpp:requests_deferred)")),
        ]),
    ],
}


def expressions() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every panel target: what a live Prometheus must answer
    with data (tests/deploy/test_prometheus_live.py, tests/compose/run.py)."""
    return [(board, title, expr) for board, panels in DASHBOARDS.items()
            for title, _unit, targets in panels for _legend, expr in targets]


def panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, object]:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "prometheus"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend}
            for k, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard(name: str) -> dict[str, object]:
    return {
        "uid": f"flotilla-{name.lower()}",
        "title": f"Flotilla {name}",
        "tags": ["flotilla"],
        "schemaVersion": 39,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "panels": [panel(i, *p) for i, p in enumerate(DASHBOARDS[name])],
    }


def render(name: str) -> str:
    return json.dumps(dashboard(name), indent=2) + "\n"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name in DASHBOARDS:
        (OUT / f"{name.lower()}.json").write_text(render(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
