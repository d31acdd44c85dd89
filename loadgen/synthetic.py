"""Synthetic workloads from a one-line spec, seeded so they replay exactly.

    poisson:rate=5,duration=60,input=512,output=128
    gamma:rate=2@0/10@30,burstiness=0.5,duration=60,input=lognormal:1000:0.8,lora=a:0.3/b:0.2
    agents:sessions=6,turns=5,system=2000,growth=2400/600/600/600/2400/600,think=2,stagger=0.1

Lengths are `N`, `uniform:LO:HI`, `exp:MEAN` or `lognormal:MEDIAN:SIGMA`. `lora=NAME:SHARE/...`
sends that share of requests to each adapter and the rest to the base model. `system=N` starts
every prompt with the same N-token system prompt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from loadgen.agents import AgentSessions
from loadgen.arrivals import RateProfile, arrival_times
from loadgen.trace import TraceRequest

__all__ = ["LengthDist", "LoraMix", "parse_spec", "synthetic_requests"]


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution; samples are integers >= 1."""

    kind: str
    """fixed, uniform, exp or lognormal."""
    a: float
    """fixed: the length; uniform: low; exp: mean; lognormal: median."""
    b: float = 0.0
    """uniform: high; lognormal: sigma of the log; unused otherwise."""

    @classmethod
    def parse(cls, spec: str) -> LengthDist:
        """`512`, `uniform:100:1000`, `exp:300` or `lognormal:1000:0.8`."""
        kind, *args = spec.split(":")
        if not args:
            return cls("fixed", float(kind))
        if kind not in ("uniform", "exp", "lognormal"):
            raise ValueError(f"unknown length distribution {kind!r}; use N, uniform:, exp: or lognormal:")
        return cls(kind, *(float(x) for x in args))

    def sample(self, rng: random.Random) -> int:
        """One length."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "exp":
            value = rng.expovariate(1.0 / self.a)
        else:
            value = rng.lognormvariate(math.log(self.a), self.b)
        return max(1, round(value))


@dataclass(frozen=True)
class LoraMix:
    """Share of requests per LoRA adapter; the remainder goes to the base model."""

    shares: tuple[tuple[str, float], ...] = ()
    """(adapter name, share in [0, 1]); the shares sum to at most 1."""

    def __post_init__(self) -> None:
        total = sum(share for _, share in self.shares)
        if any(share < 0 for _, share in self.shares) or total > 1 + 1e-9:
            raise ValueError(f"lora shares must be >= 0 and sum to <= 1, got {total}")

    @classmethod
    def parse(cls, spec: str) -> LoraMix:
        """`a:0.5/b:0.3`."""
        pairs = (part.split(":") for part in spec.split("/") if part)
        return cls(tuple((name, float(share)) for name, share in pairs))

    def pick(self, rng: random.Random) -> str | None:
        """An adapter name, or None for the base model."""
        draw = rng.random()
        for name, share in self.shares:
            if draw < share:
                return name
            draw -= share
        return None


@dataclass(frozen=True)
class OpenWorkload:
    """Independent requests with Poisson or gamma arrivals."""

    profile: RateProfile
    """Arrival rate over time."""
    duration_s: float = 60.0
    """Arrivals are generated in [0, duration_s)."""
    burstiness: float = 1.0
    """Gamma shape of the gaps; 1 is Poisson."""
    input: LengthDist = LengthDist("fixed", 512)
    """Prompt tokens after the system prompt."""
    output: LengthDist = LengthDist("fixed", 128)
    """Tokens to generate."""
    system_tokens: int = 0
    """Shared system-prompt tokens at the start of every prompt (one hash block)."""
    lora: LoraMix = LoraMix()
    """Adapter mix."""

    def requests(self, rng: random.Random) -> Iterator[TraceRequest]:
        for at in arrival_times(rng, self.profile, self.duration_s, self.burstiness):
            shared = (0,) if self.system_tokens else ()
            yield TraceRequest(timestamp_s=at, input_length=self.system_tokens + self.input.sample(rng),
                               output_length=self.output.sample(rng), hash_ids=shared,
                               block_tokens=self.system_tokens or 512, lora=self.lora.pick(rng))


def _fields(body: str) -> dict[str, str]:
    out = {}
    for part in filter(None, body.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"bad synthetic option {part!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _open_workload(kind: str, opts: dict[str, str]) -> OpenWorkload:
    known = {"rate", "duration", "burstiness", "input", "output", "system", "lora"}
    if unknown := sorted(set(opts) - known):
        raise ValueError(f"unknown {kind} option(s) {unknown}; known: {sorted(known)}")
    if kind == "poisson" and "burstiness" in opts:
        raise ValueError("poisson has burstiness 1; use gamma:...,burstiness=B")
    return OpenWorkload(
        profile=RateProfile.parse(opts.get("rate", "1")),
        duration_s=float(opts.get("duration", 60)),
        burstiness=float(opts.get("burstiness", 1.0)),
        input=LengthDist.parse(opts.get("input", "512")),
        output=LengthDist.parse(opts.get("output", "128")),
        system_tokens=int(opts.get("system", 0)),
        lora=LoraMix.parse(opts.get("lora", "")),
    )


def parse_spec(spec: str) -> OpenWorkload | AgentSessions:
    """A workload from `KIND:KEY=VALUE,...` (see the module docstring); a bad option is a
    ValueError quoting the spec."""
    kind, _, body = spec.partition(":")
    if kind not in ("agents", "poisson", "gamma"):
        raise ValueError(f"unknown synthetic workload {kind!r}; use poisson, gamma or agents")
    try:
        opts = _fields(body)
        return AgentSessions.from_options(opts) if kind == "agents" else _open_workload(kind, opts)
    except (ValueError, TypeError) as exc:  # e.g. int('x'): say which spec it came from
        raise ValueError(f"synthetic workload {spec!r}: {exc}") from None


def synthetic_requests(spec: str, seed: int = 0) -> Iterator[TraceRequest]:
    """The requests of `spec`, in arrival order, drawn from `random.Random(seed)`."""
    return parse_spec(spec).requests(random.Random(seed))
