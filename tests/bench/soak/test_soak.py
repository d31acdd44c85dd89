"""A one-minute soak through the proxy with engine faults switched on."""

from __future__ import annotations

import pytest

from bench.soak.report import Bounds, over_bounds
from bench.soak.run import SoakConfig, run_soak


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(180)
async def test_a_minute_of_faults_leaves_every_request_answered_and_no_figure_growing():
    report = await run_soak(SoakConfig(minutes=1.0, concurrency=6, engines=3, sample_every_s=2.0, fault_every_s=3.0))
    print(report.text(Bounds()))
    assert report.sent > 500
    assert report.unanswered == 0
    assert report.completed > report.sent // 2
    assert len(report.samples) >= 20
    assert over_bounds(report.samples, Bounds()) == {}
