"""One look-alike vLLM per test module, the shape the captures were taken from: `tiny-llama`
served at 100x speed with a 2,048-token context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from tests.fake_engines.engine_thread import EngineThread


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineThread]:
    config = VllmServeConfig(model="llama-3.1-8b", served_model_name="tiny-llama", port=0, time_scale=0.01,
                             max_model_len=2048)
    with EngineThread(lambda: start_vllm(config, cold_start=False)) as running:
        yield running
