"""Sizing the fake llama-server: -ngl/-ts placement drives the step time; slots follow -np and -c."""

from __future__ import annotations

import pytest

from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError, parse_tensor_split
from fake_engines.llamacpp.engine import build_scheduler, size_engine, step_time_fn
from fake_engines.llamacpp.model import load_model
from fake_engines.perf.batch import StepBatch

MODEL = "llama-3.1-8b-Q4_K_M.gguf"
DECODE = StepBatch(decode_seqs=1, decode_context_tokens=512)


def _decode_s(**flags) -> float:
    config = LlamaServerConfig(**{"model": MODEL, **flags})
    return step_time_fn(size_engine(config, load_model(MODEL)))(DECODE)


def test_layers_left_on_the_cpu_slow_every_step():
    all_gpu, half, cpu_only = _decode_s(n_gpu_layers=-1), _decode_s(n_gpu_layers=16), _decode_s(n_gpu_layers=0)
    assert all_gpu < half < cpu_only


def test_tensor_split_places_layers_by_proportion():
    config = LlamaServerConfig(model=MODEL, tensor_split=parse_tensor_split("3,1"))
    spec = size_engine(config, load_model(MODEL))
    # 33 units (32 layers + output) cut at 0.75: il/33 < 0.75 for il <= 24, as llama.cpp splits
    assert spec.split.layers_per_gpu == (25, 7) and spec.split.cpu_layers == 0


def test_slots_split_the_context_unless_auto():
    model = load_model(MODEL)
    explicit = build_scheduler(LlamaServerConfig(model=MODEL, n_parallel=2, n_ctx=2048), model).stats().slots
    auto = build_scheduler(LlamaServerConfig(model=MODEL, n_ctx=2048), model).stats().slots
    assert [s.n_ctx for s in explicit] == [1024, 1024]
    assert [s.n_ctx for s in auto] == [2048] * 4


def test_bad_flags_name_the_flag():
    with pytest.raises(ServerConfigError, match="-sm"):
        LlamaServerConfig(model=MODEL, split_mode="diagonal")
    with pytest.raises(ServerConfigError, match="-np"):
        LlamaServerConfig(model=MODEL, n_parallel=0)
