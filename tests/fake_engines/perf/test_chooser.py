from __future__ import annotations

import pytest

from fake_engines.perf.chooser import Deployment, choose_layout, round_up_power_of_two

SEED_EXAMPLE_14 = [
    (Deployment(16.1, 80, 8, 1, True, False), "needs 1 GPU(s) -> no split, 8 replicas (DP)"),
    (Deployment(141.2, 80, 8, 1, True, False), "needs 3 GPU(s) -> TP=4, 2 replicas (DP)"),
    (Deployment(18.5, 24, 2, 1, False, False), "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)"),
    (Deployment(405, 80, 8, 2, True, False), "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes"),
    (Deployment(235, 80, 8, 1, True, True), "needs 5 GPU(s) -> TP=8, expert parallel for the MoE layers"),
    (Deployment(405, 80, 8, 1, True, False), "does not fit: 9 GPUs needed, 8 present"),
]


@pytest.mark.parametrize(("deployment", "answer"), SEED_EXAMPLE_14)
def test_seed_example_14_every_line(deployment: Deployment, answer: str) -> None:
    assert choose_layout(deployment).summary == answer


def test_choice_is_structured_for_callers() -> None:
    c = choose_layout(Deployment(141.2, 80))
    assert (c.gpus_needed, c.group_gpus, c.tp, c.pp, c.replicas, c.fits) == (3, 4, 4, 1, 2, True)
    multi = choose_layout(Deployment(405, 80, nodes=2))
    assert (multi.tp, multi.pp, multi.replicas) == (8, 2, 1)
    assert choose_layout(Deployment(405, 80)).fits is False


def test_smaller_kv_reserve_fits_405b_fp8_on_one_node() -> None:
    # 405 / (0.7 x 80) = 7.2 -> 8 GPUs, which one 8-GPU node holds
    c = choose_layout(Deployment(405, 80, kv_reserve=0.3))
    assert c.summary == "needs 8 GPU(s) -> TP=8"


def test_round_up_power_of_two() -> None:
    assert [round_up_power_of_two(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


@pytest.mark.parametrize("field", ["weights_gb", "gpu_memory_gb", "gpus_per_node", "nodes", "kv_reserve"])
def test_out_of_range_inputs_name_the_field(field: str) -> None:
    values = {"weights_gb": 10.0, "gpu_memory_gb": 80.0, field: 0 if field != "kv_reserve" else 1.0}
    with pytest.raises(ValueError, match=field):
        Deployment(**values)
