from __future__ import annotations

from fake_engines.perf.pipeline import batches_in_flight, busy_share, timeline
from fake_engines.perf.rounding import fixed


def _row(cells):
    return "".join(f" m{c}" if c is not None else "  ." for c in cells)


def test_example_6_one_batch_keeps_each_gpu_busy_a_quarter():
    t = timeline(4, 1)
    assert t.slots == 4
    assert [_row(r) for r in t.cells] == [" m0  .  .  .", "  . m0  .  .", "  .  . m0  .", "  .  .  . m0"]
    assert (t.busy, t.stages * t.slots, fixed(100 * t.busy_share, 1)) == (4, 16, "25.0")


def test_example_6_four_micro_batches_fill_the_pipeline():
    t = timeline(4, 4)
    assert t.slots == 7
    assert [_row(r) for r in t.cells] == [" m0 m1 m2 m3  .  .  .", "  . m0 m1 m2 m3  .  .",
                                          "  .  . m0 m1 m2 m3  .", "  .  .  . m0 m1 m2 m3"]
    assert (t.busy, t.stages * t.slots, fixed(100 * t.busy_share, 1)) == (16, 28, "57.1")
    assert t.busy_share == busy_share(4, 4)


def test_example_7_busy_share_table():
    table = {p: [fixed(100 * busy_share(m, p), 1) for m in (1, 2, 4, 8, 16, 32)] for p in (2, 4, 8)}
    assert table == {2: ["50.0", "66.7", "80.0", "88.9", "94.1", "97.0"],
                     4: ["25.0", "40.0", "57.1", "72.7", "84.2", "91.4"],
                     8: ["12.5", "22.2", "36.4", "53.3", "69.6", "82.1"]}


def test_example_7_batches_in_flight_multiply_throughput_not_per_sequence_rate():
    rows = [batches_in_flight(stages=4, batches=k, seqs_per_batch=8) for k in range(1, 5)]
    assert [(fixed(100 * r.busy_share, 0), r.tokens, r.token_interval_slots) for r in rows] == [
        ("25", 200, 4), ("50", 400, 4), ("75", 600, 4), ("100", 800, 4)]
