from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fake_engines.perf.allreduce import (
    lesson_ring_inputs,
    pass_traffic,
    ring_allreduce,
    ring_bytes_per_device,
    root_traffic_values,
)
from fake_engines.perf.catalogue import load_catalogue, model_from_shape
from fake_engines.perf.memory import matmul_time_s, weight_read_s
from fake_engines.perf.rounding import fixed


def test_example_4_ring_all_reduce_step_by_step():
    t = ring_allreduce(lesson_ring_inputs())
    owned = [(c, v.tolist()) for c, v in t.owned_after_scatter]
    assert owned == [(1, [108, 112]), (2, [116, 120]), (3, [124, 128]), (0, [100, 104])]
    assert t.final.tolist() == [[100, 104, 108, 112, 116, 120, 124, 128]] * 4
    assert t.expected.tolist() == [100, 104, 108, 112, 116, 120, 124, 128]
    assert t.all_equal is True
    assert t.sent_values == [12, 12, 12, 12]
    assert ring_bytes_per_device(8, 4) == 12
    assert root_traffic_values(4, 8) == (24, 24)  # the root device receives and sends


def test_ring_traffic_matches_formula_for_other_sizes():
    t = ring_allreduce(np.arange(6 * 12).reshape(6, 12))
    assert t.all_equal and t.sent_values == [ring_bytes_per_device(12, 6)] * 6


def test_example_5_traffic_and_time_per_forward_pass():
    cat = load_catalogue()
    nvlink, pcie = cat.link("nvlink"), cat.link("pcie4")
    rows = []
    for tokens in (1, 64, 4096):
        p = pass_traffic(tokens, hidden=8192, layers=80, tp=8)
        rows.append((fixed(p.allreduce_bytes / 1e6, 3), fixed(p.bytes_per_gpu / 1e6, 1),
                     fixed(p.bandwidth_s(nvlink) * 1e3, 2), fixed(p.bandwidth_s(pcie) * 1e3, 2)))
    assert rows == [("0.016", "4.6", "0.01", "0.15"), ("1.049", "293.6", "0.65", "9.32"),
                    ("67.109", "18790.5", "41.76", "596.52")]
    p = pass_traffic(1, hidden=8192, layers=80, tp=8)
    assert (p.allreduces, p.sequential_steps // p.allreduces, p.sequential_steps) == (160, 14, 2240)
    assert [fixed(p.latency_s(us * 1e-6) * 1e3, 2) for us in (1, 5)] == ["2.24", "11.20"]


def test_example_5_references():
    weights = model_from_shape(params=70.6e9, layers=80, kv_heads=8).weight_bytes(16) / 8
    assert (fixed(weights / 1e9, 2), fixed(weight_read_s(weights, 3.35e12) * 1e3, 2)) == ("17.65", "5.27")
    assert fixed(matmul_time_s(70.6e9, 4096, 989e12, gpus=8) * 1e3, 1) == "73.1"


def test_one_gpu_has_no_all_reduce():
    p = pass_traffic(64, hidden=4096, layers=32, tp=1)
    assert (p.bytes_per_gpu, p.sequential_steps) == (0.0, 0)


@given(devices=st.integers(2, 8), chunk=st.integers(1, 4), seed=st.integers(0, 1000))
def test_ring_all_reduce_sums_any_input_and_sends_2_n_minus_1_over_n(devices, chunk, seed):
    values = np.random.default_rng(seed).integers(-100, 100, (devices, devices * chunk))
    t = ring_allreduce(values)
    assert t.all_equal
    assert t.sent_values == [ring_bytes_per_device(devices * chunk, devices)] * devices
