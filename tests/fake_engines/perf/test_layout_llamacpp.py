from __future__ import annotations

import pytest

from fake_engines.perf.layout_llamacpp import assign_layers, assign_layers_single_gpu, resolve_proportions

GB = 1e9


@pytest.mark.parametrize(
    ("ngl", "proportions", "line"),
    [
        (99, [1, 1], "GPU0 layers 0-16 (17), GPU1 layers 17-31 (15), output on GPU1"),
        (99, [3, 1], "GPU0 layers 0-24 (25), GPU1 layers 25-31 (7), output on GPU1"),
        (99, [22 * GB, 10 * GB], "GPU0 layers 0-22 (23), GPU1 layers 23-31 (9), output on GPU1"),
        (20, [1, 1], "CPU layers 0-12 (13), GPU0 layers 13-22 (10), GPU1 layers 23-31 (9), output on GPU1"),
        (99, [1, 1, 1], "GPU0 layers 0-10 (11), GPU1 layers 11-21 (11), GPU2 layers 22-31 (10), output on GPU2"),
    ],
)
def test_seed_example_11_every_line(ngl: int, proportions: list[float], line: str) -> None:
    assert assign_layers(32, ngl, proportions).describe() == line


def test_three_equal_gpus_need_float32_upper_bound_to_put_layer_11_on_gpu1() -> None:
    # 11/33 equals the float32 split point 1/3 exactly; in double it would fall below it (GPU0)
    split = assign_layers(32, 99, [1, 1, 1])
    assert split.devices[10:12] == ("GPU0", "GPU1")
    assert split.split_points[0] == pytest.approx(1 / 3)


def test_partial_offload_reports_per_gpu_layers_and_gpu_fraction() -> None:
    split = assign_layers(32, 20, [1, 1])
    assert split.layers_per_gpu == (10, 9)
    assert split.cpu_layers == 13
    assert split.gpu_layer_fraction == 19 / 32
    assert split.output_device == "GPU1"


def test_one_gpu_layer_offloads_only_the_output_layer() -> None:
    split = assign_layers(32, 1, [1, 1])
    assert split.describe() == "CPU layers 0-31 (32), output on GPU0"
    assert split.gpu_layer_fraction == 0.0


def test_zero_gpu_layers_or_no_gpus_keep_everything_on_the_cpu() -> None:
    assert assign_layers(32, 0, [1, 1]).describe() == "CPU layers 0-31 (32), output on CPU"
    assert assign_layers(32, 99, []).layers_per_gpu == ()
    assert assign_layers(32, 99, []).output_device == "CPU"


def test_negative_ngl_offloads_every_layer() -> None:
    assert assign_layers(32, -1, [1]).describe() == "GPU0 layers 0-31 (32), output on GPU0"


def test_zero_share_gpu_gets_no_layers() -> None:
    assert assign_layers(8, 99, [1, 0, 1]).layers_per_gpu == (5, 0, 3)


def test_tensor_split_wins_over_free_memory_unless_all_zero() -> None:
    assert resolve_proportions([3, 1], [22 * GB, 10 * GB]) == (3.0, 1.0)
    # free bytes are stored into a C++ float: 22e9 becomes the nearest float32, 22000001024
    assert resolve_proportions([0, 0], [22 * GB, 10 * GB]) == (22000001024.0, 10e9)
    assert resolve_proportions(None, [22 * GB, 10 * GB]) == (22000001024.0, 10e9)
    with pytest.raises(ValueError, match="free_bytes"):
        resolve_proportions(None, None)


def test_bad_proportions_are_rejected_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="proportions"):
        assign_layers(32, 99, [0, 0])
    with pytest.raises(ValueError, match="proportions"):
        assign_layers(32, 99, [1, -1])
    with pytest.raises(ValueError, match="n_layer"):
        assign_layers(0, 99, [1])


def test_engine_layout_has_a_stage_per_gpu_used_and_the_gpu_share() -> None:
    partial = assign_layers(32, 20, [1, 1]).engine_layout()
    assert (partial.tp, partial.pp, partial.gpu_layer_fraction, partial.link) == (1, 2, 19 / 32, "pcie4")
    only_output = assign_layers(32, 1, [1, 1])
    assert only_output.gpus_used == 1
    assert only_output.engine_layout("nvlink").pp == 1
    cpu_only = assign_layers(32, 0, [1, 1]).engine_layout()
    assert (cpu_only.pp, cpu_only.gpu_layer_fraction) == (1, 0.0)


def test_split_mode_none_puts_every_gpu_layer_on_the_main_gpu() -> None:
    split = assign_layers_single_gpu(32, 99, main_gpu=1, gpus=2)
    assert split.describe() == "GPU1 layers 0-31 (32), output on GPU1"
    assert split.layers_per_gpu == (0, 32)
    partial = assign_layers_single_gpu(32, 10, main_gpu=0, gpus=2)
    assert partial.describe() == "CPU layers 0-22 (23), GPU0 layers 23-31 (9), output on GPU0"
    with pytest.raises(ValueError, match="main_gpu"):
        assign_layers_single_gpu(32, 99, main_gpu=2, gpus=2)
