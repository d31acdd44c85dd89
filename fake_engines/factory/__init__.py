"""One engine factory: flags -> resolved engine config -> sized engine core.

`fake-vllm serve`, `fake-llama-server`, the simulator and the pytest fixtures build their engines
only here, so the same flags give the same engine everywhere:

    config = parse_command(["fake-vllm", "serve", "llama-3.1-8b", "--gpu", "h100"])
    engine = build_engine(config)          # sized: KV blocks, batch limits, step time, cold start
    engine.describe()                      # what `--print-config` prints
    core = engine.new_core()               # the clock-free scheduler, run live or simulated

Defaults the real engines fill at start from the GPU and the model (vLLM's max_num_seqs,
max_num_batched_tokens and max_model_len) are filled here, once (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from fake_engines.core import LlamaCppScheduler, VllmScheduler
from fake_engines.factory import llamacpp_config, llamacpp_engine, vllm_config, vllm_engine
from fake_engines.factory.gguf import GgufModel, ModelFileError, load_model
from fake_engines.factory.llamacpp_config import LlamaServerConfig, ServerConfigError
from fake_engines.factory.vllm_config import ServeConfigError, VllmServeConfig
from fake_engines.factory.vllm_engine import ModelDoesNotFit
from fake_engines.perf.batch import StepBatch
from fake_engines.perf.catalogue import CatalogueError

__all__ = [
    "FLAVORS",
    "BuiltEngine",
    "EngineConfig",
    "EngineConfigError",
    "LlamaServerConfig",
    "ModelDoesNotFit",
    "VllmServeConfig",
    "build_engine",
    "engine_command",
    "flavor_of",
    "option_flags",
    "parse_command",
    "parse_flags",
]

EngineConfig = VllmServeConfig | LlamaServerConfig
FLAVORS = ("vllm", "llamacpp")
MODULES = {"vllm": "fake_engines.vllm.cli", "llamacpp": "fake_engines.llamacpp.cli"}
"""The module each flavor's command line runs (`python -m MODULE ...`)."""
PROGRAMS = {"fake-vllm": "vllm", "fake-llama-server": "llamacpp"}
LISTENER_FIELDS = frozenset({"host", "port", "api_key"})
"""Where an engine listens and the key it wants: not part of the engine, left out of its description."""
EngineConfigError = (ServeConfigError, ServerConfigError, ModelFileError, CatalogueError)
"""Flags an engine refuses to start with (exit status 2); ModelDoesNotFit is vLLM's own failure (exit 1)."""


class EngineFlagError(ServeConfigError):
    """A command line the engine's parser refuses (an unknown flag, a value of the wrong type)."""


class _RaisingParser(argparse.ArgumentParser):
    # the command-line programs print one line and exit; a fleet file or the simulator wants an error
    def error(self, message: str) -> NoReturn:
        raise EngineFlagError(f"{self.prog}: {message}")


def flavor_of(config: EngineConfig) -> str:
    """`vllm` or `llamacpp`."""
    return "vllm" if isinstance(config, VllmServeConfig) else "llamacpp"


def parse_flags(flavor: str, flags: Sequence[str]) -> EngineConfig:
    """The config `fake-vllm FLAGS` (FLAGS starting with `serve`) or `fake-llama-server FLAGS`
    starts with, read by that engine's own parser; EngineFlagError or the config's own error."""
    if flavor == "vllm":
        return vllm_config.config_from_args(vllm_config.build_parser(_RaisingParser).parse_args(list(flags)))
    if flavor == "llamacpp":
        return llamacpp_config.config_from_args(llamacpp_config.build_parser(_RaisingParser).parse_args(list(flags)))
    raise ValueError(f"engine flavor must be one of {', '.join(FLAVORS)}, got {flavor!r}")


def parse_command(argv: Sequence[str]) -> EngineConfig:
    """The config of the engine `argv` starts: `python -m fake_engines.vllm.cli serve ...`,
    `python -m fake_engines.llamacpp.cli ...`, `fake-vllm serve ...` or `fake-llama-server ...`."""
    if len(argv) > 2 and argv[1] == "-m" and argv[2] in MODULES.values():
        flavor = next(f for f, module in MODULES.items() if module == argv[2])
        return parse_flags(flavor, argv[3:])
    if argv and PurePath(argv[0]).name in PROGRAMS:
        return parse_flags(PROGRAMS[PurePath(argv[0]).name], argv[1:])
    raise ValueError(f"not a look-alike engine command: {' '.join(argv[:4])}")


def engine_command(flavor: str, flags: Sequence[str]) -> list[str]:
    """`python -m MODULE FLAGS`: the engine's command line with this interpreter."""
    return [sys.executable, "-m", MODULES[flavor], *flags]


def option_flags(flavor: str, options: Mapping[str, Any]) -> list[str]:
    """Engine config fields by name (`{"max_num_seqs": 64, "n_parallel": 2}`) as that engine's
    flags, so settings given in Python reach the engine by the same parser as a command line.
    An unknown field is an EngineFlagError naming it and the known ones."""
    module = vllm_config if flavor == "vllm" else llamacpp_config
    config_cls = VllmServeConfig if flavor == "vllm" else LlamaServerConfig
    known = {f.name for f in dataclasses.fields(config_cls)}
    words: list[str] = []
    for name, value in options.items():
        if name not in known:
            raise EngineFlagError(f"{name}: not a {config_cls.__name__} field; known: {sorted(known)}")
        words += _flag_words(module.OPTION_FLAGS.get(name, "--" + name.replace("_", "-")), name, value)
    return words


def _flag_words(flag: str, name: str, value: Any) -> list[str]:
    if isinstance(value, bool):  # store_true flags, their --no- forms, and llama-server's --no-X
        if name in ("warmup", "slots"):
            return [] if value else [f"--no-{name}"]
        return [flag] if value else ([f"--no-{flag[2:]}"] if name in ("enable_prefix_caching", "async_scheduling")
                                     else [])
    if value is None:
        return []
    if name == "model_shape":
        return [w for key, v in value.items() for w in (f"--{key.replace('_', '-')}", f"{v:g}")]
    if name == "lora_modules":
        return [flag, *(f"{k}={v}" for k, v in value.items())] if value else []
    if name == "loras":
        return [w for path, scale in value for w in ("--lora-scaled", str(path), f"{scale:g}")]
    if name == "tensor_split":
        return [flag, ",".join(f"{v:g}" for v in value)] if value else []
    if name == "catalogue":
        return [w for path in value for w in (flag, str(path))]
    if name == "kv_events_config":
        return [flag, vllm_config.kv_events_config_of(value).to_json() if isinstance(value, dict) else value.to_json()]
    if name == "kv_transfer_config":
        config = vllm_config.kv_transfer_config_of(value) if isinstance(value, dict) else value
        return [flag, config.to_json()]
    return [flag, f"{value:g}" if isinstance(value, float) else str(value)]


@dataclass(frozen=True)
class BuiltEngine:
    """One engine sized from its flags: the resolved config, the sizing and the step-time model;
    `new_core()` gives the clock-free scheduler (one per data-parallel rank)."""

    config: EngineConfig
    """The flags' config with every default the engine fills at start filled in."""
    spec: vllm_engine.VllmEngineSpec | llamacpp_engine.LlamaEngineSpec
    """KV blocks, layout, cold start: what sizing found."""
    step_time: Callable[[StepBatch], float]
    """Modelled seconds of one step."""
    decode_run_time: Callable[[StepBatch, int, int], Sequence[float] | npt.NDArray[np.float64]] | None = None
    """Step times of a run of identical decode steps, vectorised; None: ask `step_time` per step."""
    gguf: GgufModel | None = None
    """llama.cpp: what -m loaded."""

    @property
    def flavor(self) -> str:
        return flavor_of(self.config)

    def new_core(self) -> VllmScheduler | LlamaCppScheduler:
        """A fresh scheduler for this engine (empty queues, empty KV cache)."""
        if isinstance(self.config, VllmServeConfig):
            assert isinstance(self.spec, vllm_engine.VllmEngineSpec)
            return vllm_engine.build_scheduler(self.config, self.spec)
        assert self.gguf is not None
        return llamacpp_engine.build_scheduler(self.config, self.gguf)

    def describe(self) -> dict[str, Any]:
        """The resolved config as `--print-config` prints it and `flotilla sim --json` reports it
        in `meta.engines`: every config field but the listener's (host, port, api_key), plus what
        sizing decided. JSON-safe."""
        fields = {k: v for k, v in dataclasses.asdict(self.config).items() if k not in LISTENER_FIELDS}
        sized: dict[str, float]
        if isinstance(self.config, VllmServeConfig):
            assert isinstance(self.spec, vllm_engine.VllmEngineSpec)
            fields["block_size"] = self.config.resolved_block_size
            sized = {"num_gpu_blocks": self.spec.num_gpu_blocks,
                     "kv_cache_size_tokens": self.spec.num_gpu_blocks * self.config.resolved_block_size}
        else:
            assert self.gguf is not None
            slots = llamacpp_engine.scheduler_config(self.config, self.gguf)
            sized = {"num_slots": slots.num_slots, "slot_n_ctx": slots.slot_n_ctx, "n_ctx_train": self.gguf.n_ctx_train}
        sized["cold_start_s"] = round(self.spec.cold_start_s, 6)
        return _json_safe({**fields, **sized})


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def build_engine(config: EngineConfig) -> BuiltEngine:
    """Size the engine `config` describes, filling the defaults the real engine fills; raises
    ModelDoesNotFit (vLLM's refusal to start) or the config's own error naming the flag."""
    if isinstance(config, VllmServeConfig):
        spec = vllm_engine.size_engine(config)
        return BuiltEngine(vllm_engine.resolved_config(config, spec), spec, vllm_engine.step_time_fn(config, spec),
                           vllm_engine.decode_run_time_fn(config, spec))
    model = load_model(config.model, config.catalogue)
    llama = llamacpp_engine.size_engine(config, model)
    return BuiltEngine(config, llama, llamacpp_engine.step_time_fn(llama), gguf=model)
