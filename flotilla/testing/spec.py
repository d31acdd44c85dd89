"""What a test fleet is: engines, model, GPU, routing policy and time scale, from YAML or keywords.

The same `FleetSpec` starts a live fleet (look-alike engines behind the proxy on loopback ports)
or a simulated one, so one test can run against either and compare the results.

    engines: 4
    flavor: vllm            # vllm | llamacpp
    model: llama-3.1-8b
    gpu: h100
    policy: prefix-aware    # routing policy spec NAME[:key=value,...]
    time_scale: 0.05        # live only: wall seconds per modelled second
    engine_options:         # extra `fake-vllm serve` / `fake-llama-server` config fields
      max_num_seqs: 64
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FLAVORS = ("vllm", "llamacpp")


class FleetSpecError(ValueError):
    """A fleet setting is invalid; `field` names it."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        super().__init__(f"{field_name}={value!r}: {reason}")
        self.field = field_name


@dataclass(frozen=True)
class FleetSpec:
    """One fleet for a test, live or simulated."""

    engines: int = 2
    """Engine replicas behind the router."""
    flavor: str = "vllm"
    """Engine kind: `vllm` or `llamacpp`."""
    model: str = "llama-3.1-8b"
    """Catalogue model; llamacpp serves `<model>-<quant>.gguf` under this name."""
    gpu: str = "h100"
    """Catalogue GPU every engine pretends to run on."""
    policy: str = "round-robin"
    """Routing policy spec NAME[:key=value,...]."""
    time_scale: float = 0.05
    """Live only: wall seconds per modelled second (0.05 runs 20x faster than real time)."""
    seed: int = 0
    """Seeds the policy's random choices and each engine (engine i gets seed + i)."""
    scrape_interval_s: float | None = None
    """Modelled seconds between engine-metric scrapes; None: the simulator's policies see exact
    engine state and the live proxy scrapes every `LIVE_SCRAPE_WALL_S`."""
    quant: str = "Q4_K_M"
    """llamacpp only: the GGUF quantization of the served model."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra engine config fields by name (VllmServeConfig or LlamaServerConfig), e.g. max_num_seqs."""

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise FleetSpecError("engines", self.engines, "must be >= 1")
        if self.flavor not in FLAVORS:
            raise FleetSpecError("flavor", self.flavor, f"must be one of {', '.join(FLAVORS)}")
        if not self.time_scale > 0:
            raise FleetSpecError("time_scale", self.time_scale, "must be > 0")
        if self.scrape_interval_s is not None and not self.scrape_interval_s > 0:
            raise FleetSpecError("scrape_interval_s", self.scrape_interval_s, "must be > 0 or None")
        if not self.policy.strip():
            raise FleetSpecError("policy", self.policy, "must name a routing policy")
        if not isinstance(self.engine_options, Mapping):
            raise FleetSpecError("engine_options", self.engine_options, "must be a mapping")

    def with_options(self, **overrides: Any) -> FleetSpec:
        """A copy with some fields replaced; unknown names are refused by name."""
        known = {f.name for f in dataclasses.fields(self)}
        if unknown := sorted(set(overrides) - known):
            raise FleetSpecError(unknown[0], overrides[unknown[0]], f"unknown fleet setting; known: {sorted(known)}")
        return dataclasses.replace(self, **overrides)

    @property
    def served_model(self) -> str:
        """The model name clients send and /v1/models lists."""
        return self.model


def load_fleet_spec(source: str | Path | Mapping[str, Any] | FleetSpec | None = None,
                    **overrides: Any) -> FleetSpec:
    """A spec from a YAML file, YAML text, a mapping or a spec, with keyword overrides on top.

    A YAML document may hold the settings at the top level or under `fleet:`."""
    if isinstance(source, FleetSpec):
        base = source
    elif source is None:
        base = FleetSpec()
    else:
        base = FleetSpec().with_options(**_mapping(source))
    return base.with_options(**overrides) if overrides else base


def _mapping(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        text = Path(source).read_text() if _is_file(source) else str(source)
        data = yaml.safe_load(text) or {}
    if isinstance(data, dict) and isinstance(data.get("fleet"), dict):
        data = data["fleet"]
    if not isinstance(data, dict):
        raise FleetSpecError("fleet", type(data).__name__, "must be a mapping of fleet settings")
    return data


def _is_file(source: str | Path) -> bool:
    if isinstance(source, Path):
        return True
    one_line = "\n" not in source
    return one_line and (source.endswith((".yaml", ".yml")) or Path(source).is_file())
