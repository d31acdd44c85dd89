"""Soak outcomes and the growth check, on hand-made figures."""

from __future__ import annotations

import pytest

from bench.soak.report import Bounds, Sample, SoakReport, classify, growth, over_bounds


def test_outcomes_tell_ok_error_event_status_and_truncated_apart():
    done = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    broken = b'data: {"choices": []}\n\ndata: {"error": {"code": 502}}\n\ndata: [DONE]\n\n'
    assert classify(200, done, stream=True) == "ok"
    assert classify(200, broken, stream=True) == "error_event"
    assert classify(200, b'data: {"choices": []}\n\n', stream=True) == "truncated"
    assert classify(504, b"{}", stream=False) == "status_504"
    assert classify(200, b"{}", stream=False) == "ok"
    assert classify(None, b"", stream=True) == "no_answer"


def _samples(rss: list[int], fds: list[int], tasks: list[int]) -> list[Sample]:
    return [Sample(float(i), r, f, t) for i, (r, f, t) in enumerate(zip(rss, fds, tasks, strict=True))]


def test_growth_is_last_quarter_peak_minus_first_quarter_peak():
    s = _samples([100, 90, 95, 97, 99, 101, 120, 110], [10, 12, 11, 11, 11, 11, 13, 12], [5, 9, 5, 5, 5, 5, 6, 7])
    assert growth(s) == {"rss_bytes": 20, "open_fds": 1, "asyncio_tasks": -2}
    assert over_bounds(s, Bounds(rss_bytes=19, open_fds=1, asyncio_tasks=0)) == {"rss_bytes": 20}
    with pytest.raises(ValueError):
        growth(s[:3])


def test_unanswered_counts_timeouts_connection_errors_and_requests_never_classified():
    report = SoakReport(sent=10)
    report.outcomes.update({"ok": 6, "status_504": 1, "no_answer": 1, "connection_error": 1})
    assert report.completed == 6
    assert report.failed == {"connection_error": 1, "no_answer": 1, "status_504": 1}
    assert report.unanswered == 3  # two counted, one never came back
