"""docs/pd.md: its fleet example loads as written and every metric it names exists."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from flotilla.fleet.load import parse_fleet_file
from proxy.metrics import RouterMetrics
from proxy.pd import PdMetrics
from tests.conftest import REPO

DOC = (REPO / "docs" / "pd.md").read_text()


def test_the_documented_fleet_file_parses_with_its_roles() -> None:
    fleet = parse_fleet_file(re.search(r"```yaml\n(.*?)```", DOC, re.S).group(1))
    assert [g.role for g in fleet.engines] == ["prefill", "decode"]


def test_every_documented_metric_is_exposed() -> None:
    from fake_engines.vllm.metrics import VllmMetrics
    from fake_engines.vllm.nixl import NixlMetrics

    router = RouterMetrics()
    PdMetrics(router).prefill_failures.labels("http://b", "status_503").inc()
    engine = VllmMetrics("m", 4096, {})
    NixlMetrics(engine)
    exposed = set()
    for text in (router.exposition().decode(), engine.render().decode()):
        families = list(text_string_to_metric_families(text))
        exposed |= {f.name for f in families} | {s.name for f in families for s in f.samples}
    section = DOC.split("## Metrics", 1)[1].split("## What differs", 1)[0]
    documented = set(re.findall(r"`((?:flotilla_pd|vllm:nixl)_[a-z_]+)\{?", section))
    assert len(documented) == 7
    assert documented <= exposed
