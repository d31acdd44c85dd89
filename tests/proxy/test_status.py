"""The `flotilla up` status table from the proxy's and the engines' metrics text."""

from __future__ import annotations

from proxy.status import fleet_status, format_line, format_table, parse_proxy_metrics, requests_per_s

A, B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def proxy_text(a_ok: int, a_err: int, b_ok: int, desired: int | None = None) -> str:
    lines = [
        "# TYPE flotilla_requests_total counter",
        f'flotilla_requests_total{{model="m",backend="{A}",status="200"}} {a_ok}.0',
        f'flotilla_requests_total{{model="m",backend="{A}",status="503"}} {a_err}.0',
        f'flotilla_requests_total{{model="m",backend="{B}",status="200"}} {b_ok}.0',
        "# TYPE flotilla_backend_in_flight gauge",
        f'flotilla_backend_in_flight{{backend="{A}"}} 3.0',
        f'flotilla_backend_in_flight{{backend="{B}"}} 0.0',
        "# TYPE flotilla_backend_state gauge",
        *[f'flotilla_backend_state{{backend="{A}",state="{s}"}} {1.0 if s == "ready" else 0.0}'
          for s in ("starting", "ready", "draining", "ejected")],
        *[f'flotilla_backend_state{{backend="{B}",state="{s}"}} {1.0 if s == "starting" else 0.0}'
          for s in ("starting", "ready", "draining", "ejected")],
    ]
    if desired is not None:
        lines += ["# TYPE flotilla_autoscaler_desired_replicas gauge", f"flotilla_autoscaler_desired_replicas {desired}"]
    return "\n".join(lines) + "\n"


VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4375
"""
LLAMA = """# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


def test_proxy_metrics_give_state_in_flight_and_requests_over_every_status() -> None:
    rows, desired = parse_proxy_metrics(proxy_text(10, 2, 5))
    assert (rows[A].state, rows[A].in_flight, rows[A].requests_total) == ("ready", 3.0, 12.0)
    assert (rows[B].state, rows[B].requests_total) == ("starting", 5.0)
    assert desired is None
    assert parse_proxy_metrics(proxy_text(0, 0, 0, desired=4))[1] == 4.0


def test_engine_metrics_add_flavor_queue_and_kv_usage() -> None:
    status = fleet_status(1.0, proxy_text(10, 2, 5), {A: VLLM, B: LLAMA})
    a, b = status.backends
    assert (a.flavor, a.waiting, a.kv_usage) == ("vllm", 7.0, 0.4375)
    assert (b.flavor, b.waiting, b.kv_usage) == ("llamacpp", 2.0, None)
    assert status.ready == 1


def test_requests_per_second_come_from_two_snapshots() -> None:
    before = fleet_status(10.0, proxy_text(10, 2, 5), {})
    now = fleet_status(12.0, proxy_text(16, 4, 6), {})
    assert requests_per_s(now, before) == {A: 4.0, B: 0.5}
    assert requests_per_s(now, None) == {A: 0.0, B: 0.0}


def test_table_has_a_row_per_backend_and_a_fleet_total() -> None:
    before = fleet_status(10.0, proxy_text(10, 2, 5), {})
    now = fleet_status(12.0, proxy_text(16, 4, 6, desired=3), {A: VLLM, B: None})
    lines = format_table(now, before).splitlines()
    assert lines[0].split() == ["backend", "flavor", "state", "in-flight", "waiting", "KV", "use", "req/s"]
    assert lines[1].split() == [A, "vllm", "ready", "3", "7", "43.8%", "4.0"]
    assert lines[2].split() == [B, "-", "starting", "0", "-", "-", "0.5"]
    assert lines[3] == "1/2 ready, 3 in flight, 4.5 req/s, autoscaler wants 3"


def test_one_line_status_has_the_fleet_total_with_queue_and_fullest_kv_cache() -> None:
    before = fleet_status(10.0, proxy_text(10, 2, 5), {})
    now = fleet_status(12.0, proxy_text(16, 4, 6, desired=3), {A: VLLM, B: None})
    line = format_line(now, before)
    assert line == "1/2 ready, 3 in flight, 7 waiting, KV max 43.8%, 4.5 req/s, autoscaler wants 3"
    assert "\n" not in line
