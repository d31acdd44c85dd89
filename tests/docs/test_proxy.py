"""docs/proxy.md: its fleet example loads as written and every metric it names exists."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from proxy.config import BackendSpec, parse_fleet
from proxy.metrics import RouterMetrics
from tests.conftest import REPO

DOC = (REPO / "docs" / "proxy.md").read_text()


def test_the_documented_fleet_file_parses() -> None:
    fleet = parse_fleet(re.search(r"```yaml\n(.*?)```", DOC, re.S).group(1))
    assert fleet.policy == "session-affinity:bound=1.25"
    assert fleet.backends[0] == BackendSpec("http://127.0.0.1:8001", "vllm", ("llama-3.1-8b", "sql-lora"), 1.0)


def test_every_documented_metric_is_exposed() -> None:
    metrics = RouterMetrics()
    metrics.request_done("m", "http://b", 200, 0.1, 0.01)
    metrics.retries.labels("connect").inc()
    metrics.ejections.labels("http://b").inc()
    metrics.decision("round-robin", "round-robin")
    metrics.in_flight.labels("http://b").set(0)
    metrics.scrape_age.labels("http://b").set(0)
    metrics.state.labels("http://b", "ready").set(1)
    metrics.client_disconnects.inc()
    metrics.prefix_prediction("http://b", 160, 144)
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    exposed = {f.name for f in families} | {s.name for f in families for s in f.samples}
    documented = set(re.findall(r"`(flotilla_[a-z_]+)\{?", DOC.split("## Metrics", 1)[1]))
    assert len(documented) == 12
    assert documented <= exposed
