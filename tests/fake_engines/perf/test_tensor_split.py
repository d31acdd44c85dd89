from __future__ import annotations

import numpy as np

from fake_engines.perf.tensor_split import column_split, lesson_column_inputs, lesson_mlp_inputs, mlp_split


def test_example_2_column_split_equals_one_device():
    r = column_split(*lesson_column_inputs(), devices=2)
    assert r.full.tolist() == [[-5, -3, 4, 6, -2, -5], [1, 7, 3, -6, -5, 1]]
    assert r.parts[0].tolist() == [[-5, -3, 4], [1, 7, 3]]
    assert r.parts[1].tolist() == [[6, -2, -5], [-6, -5, 1]]
    assert r.gathered.tolist() == r.full.tolist()
    assert r.equal is True
    assert (r.weights_per_device, r.weights_total) == (12, 24)


def test_example_3_mlp_column_then_row_split_needs_one_all_reduce():
    r = mlp_split(*lesson_mlp_inputs(), devices=2)
    assert r.partials[0].tolist() == [[0, 0, 0, 0], [9, 25, 11, -33]]
    assert r.partials[1].tolist() == [[-28, -10, 8, 26], [-5, 0, 5, 10]]
    assert r.reduced.tolist() == [[-28, -10, 8, 26], [4, 25, 16, -23]]
    assert r.reference.tolist() == [[-28, -10, 8, 26], [4, 25, 16, -23]]
    assert r.equal is True
    assert r.wrong_equal is False


def test_mlp_split_holds_for_random_shapes_and_four_devices():
    rng = np.random.default_rng(3)
    x, a, b = rng.integers(-4, 5, (5, 8)), rng.integers(-4, 5, (8, 16)), rng.integers(-4, 5, (16, 8))
    assert mlp_split(x, a, b, devices=4).equal
    assert column_split(x, a, devices=4).equal
