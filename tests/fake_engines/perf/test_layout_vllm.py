from __future__ import annotations

import pytest

from fake_engines.perf.layout_vllm import VllmLayout

SEED_EXAMPLE_13 = [
    # (moe, tp, pp, dp, ep, flags, gpus, engines, per engine, expert layers)
    (False, 8, 1, 1, False, "-tp 8", 8, 1, 8, "no expert layers"),
    (False, 4, 2, 1, False, "-tp 4 -pp 2", 8, 1, 8, "no expert layers"),
    (False, 1, 1, 8, False, "-tp 1 -dp 8", 8, 8, 1, "no expert layers"),
    (True, 8, 1, 1, False, "-tp 8", 8, 1, 8, "TP=8: every expert split 8 ways"),
    (True, 8, 1, 1, True, "-tp 8 --enable-expert-parallel", 8, 1, 8, "EP=8: each GPU holds 1/8 of the experts"),
    (True, 1, 1, 8, False, "-tp 1 -dp 8", 8, 8, 1, "TP=8: every expert split 8 ways"),
    (True, 1, 1, 8, True, "-tp 1 -dp 8 --enable-expert-parallel", 8, 8, 1, "EP=8: each GPU holds 1/8 of the experts"),
    (True, 2, 1, 4, True, "-tp 2 -dp 4 --enable-expert-parallel", 8, 4, 2, "EP=8: each GPU holds 1/8 of the experts"),
]


@pytest.mark.parametrize(("moe", "tp", "pp", "dp", "ep", "flags", "gpus", "engines", "per_engine", "experts"),
                         SEED_EXAMPLE_13)
def test_seed_example_13_every_row(moe, tp, pp, dp, ep, flags, gpus, engines, per_engine, experts) -> None:
    layout = VllmLayout(tp=tp, pp=pp, dp=dp, enable_expert_parallel=ep, moe=moe)
    assert (layout.flags(), layout.gpus, layout.engines, layout.world_size) == (flags, gpus, engines, per_engine)
    assert layout.expert_layers() == experts


def test_expert_parallel_on_one_gpu_is_plain_tp1() -> None:
    layout = VllmLayout(tp=1, enable_expert_parallel=True, moe=True)
    assert not layout.expert_parallel
    assert layout.expert_layers() == "TP=1: every expert split 1 ways"


def test_pipeline_stages_do_not_join_the_moe_group() -> None:
    layout = VllmLayout(tp=4, pp=2, dp=2, enable_expert_parallel=True, moe=True)
    assert (layout.gpus, layout.moe_group, layout.experts_per_gpu_fraction) == (16, 8, 1 / 8)


def test_engine_layout_carries_the_flags_to_the_step_time_model() -> None:
    engine = VllmLayout(tp=2, dp=4, enable_expert_parallel=True, moe=True).engine_layout("pcie4")
    assert (engine.tp, engine.pp, engine.dp, engine.ep, engine.link, engine.world_size) == (2, 1, 4, True, "pcie4", 2)
    assert VllmLayout(tp=2, enable_expert_parallel=True).engine_layout().ep is False


@pytest.mark.parametrize("name", ["tp", "pp", "dp"])
def test_sizes_below_one_name_the_field(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        VllmLayout(**{name: 0})
