from __future__ import annotations

from fake_engines.perf.rounding import fixed, percent


def test_halves_round_up_as_the_lesson_prints_them():
    assert fixed(2.125, 2) == "2.13"
    assert fixed(34 / 16, 2) == "2.13"
    assert fixed(0.5, 0) == "1"


def test_ordinary_values_and_percentages():
    assert fixed(141.2, 1) == "141.2"
    assert fixed(2240 * 5e-3, 2) == "11.20"
    assert percent(4 / 7) == "57.1"
