"""What a test fleet is: engines, model, GPU, routing policy and time scale, from YAML or keywords.

A `FleetSpec` is a thin constructor of the fleet model (`flotilla.fleet.Fleet`, `spec.fleet()`):
one engine group of `engines` replicas whose flags carry the model, GPU, seed and
`engine_options`. The same fleet starts live (look-alike engines behind the proxy on loopback
ports) or simulated, so one test can run against either and compare the results. A fleet file
of `flotilla up` (`fleet="fleet.yaml"`, see `load_fleet`) runs the same way.

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

from flotilla.errors import ConfigError
from flotilla.fleet import Fleet, fleet_from_mapping, load_fleet_file

FLAVORS = ("vllm", "llamacpp")
FLEET_OVERRIDES = ("policy", "seed", "time_scale", "scrape_interval_s")
"""FleetSpec settings that also apply to a fleet file's fleet (`load_fleet`)."""


class FleetSpecError(ConfigError):
    """A test fleet's setting is invalid; `field` names it. The project's one `ConfigError`, under
    the name the pytest fixtures have always raised."""


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
    """Seeds the policy's random choices and every engine (`--seed`), as `flotilla up` seeds a group."""
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

    def fleet(self) -> Fleet:
        """This spec as the fleet model: one group of `engines` replicas, no autoscaler."""
        from flotilla.testing.engines import spec_fleet

        return spec_fleet(self)


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


def load_fleet(fleet: str | Path | Mapping[str, Any] | Fleet, **overrides: Any) -> Fleet:
    """A fleet from a `flotilla up` fleet file (path or YAML text), its parsed mapping or a
    `Fleet`, with `policy`, `seed`, `time_scale` (every group's) or `scrape_interval_s` laid over.
    The file is checked as `flotilla up` checks it (flotilla.errors.ConfigError)."""
    if isinstance(fleet, Fleet):
        base = fleet
    elif isinstance(fleet, Mapping):
        base = fleet_from_mapping(dict(fleet))
    elif _is_file(fleet):
        base = load_fleet_file(fleet)
    else:
        base = fleet_from_mapping(yaml.safe_load(str(fleet)) or {})
    if unknown := sorted(set(overrides) - set(FLEET_OVERRIDES)):
        raise FleetSpecError(unknown[0], overrides[unknown[0]],
                             f"set it in the fleet file; a fleet file takes only {', '.join(FLEET_OVERRIDES)}")
    if "time_scale" in overrides:
        if not overrides["time_scale"] > 0:
            raise FleetSpecError("time_scale", overrides["time_scale"], "must be > 0")
        engines = tuple(dataclasses.replace(g, time_scale=overrides["time_scale"]) for g in base.engines)
        base = dataclasses.replace(base, engines=engines)
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if k != "time_scale"})
