"""Synthetic workloads from a one-line spec, seeded so they replay exactly.

    poisson:rate=5,duration=60,input=512,output=128
    gamma:rate=2@0/10@30,burstiness=0.5,duration=60,input=lognormal:1000:0.8,lora=a:0.3/b:0.2
    agents:sessions=6,turns=5,system=2000,growth=2400/600/600/600/2400/600,think=2,stagger=0.1
    diurnal:peak=8,trough=1,duration=1800,bursts=4,burst=3,burst_s=30,input=lognormal:1000:0.8

`diurnal` follows a day's curve compressed into `duration` seconds: the rate is `trough` at
`peak_hour` - 12 and rises along a cosine to `peak` at `peak_hour` (default 14, so the quietest
moment is 2 am), held constant over each of `slots` equal parts of the day (default 96: 15
minutes of the day each). `bursts` times, at seeded moments, the rate is multiplied by `burst`
for `burst_s` seconds.

Lengths are `N`, `uniform:LO:HI`, `exp:MEAN` or `lognormal:MEDIAN:SIGMA`. `lora=NAME:SHARE/...`
sends that share of requests to each adapter and the rest to the base model. `system=N` starts
every prompt with the same N-token system prompt.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from loadgen.agents import AgentSessions
from loadgen.arrivals import RateProfile, arrival_times
from loadgen.trace import TraceRequest

__all__ = ["DiurnalWorkload", "LengthDist", "LoraMix", "parse_spec", "synthetic_requests"]


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


@dataclass(frozen=True)
class DiurnalWorkload:
    """Open arrivals whose rate follows a day, compressed, with seeded bursts on top."""

    peak: float = 8.0
    """Requests per second at `peak_hour`."""
    trough: float = 1.0
    """Requests per second twelve hours from the peak."""
    duration_s: float = 1800.0
    """Seconds one whole day is compressed into."""
    peak_hour: float = 14.0
    """Hour of the day with the most traffic."""
    start_hour: float = 0.0
    """Hour of the day at time 0."""
    slots: int = 96
    """Parts of the day the rate is constant over."""
    bursts: int = 0
    """Bursts over the run, each at a seeded moment."""
    burst: float = 3.0
    """Rate multiplier during a burst."""
    burst_s: float = 30.0
    """Seconds a burst lasts."""
    shape: OpenWorkload = OpenWorkload(RateProfile(((0.0, 1.0),)))
    """Lengths, system prompt and adapters (its profile and duration are not used)."""

    def __post_init__(self) -> None:
        if not 0 <= self.trough <= self.peak or self.peak <= 0:
            raise ValueError(f"need 0 <= trough <= peak and peak > 0, got trough={self.trough} peak={self.peak}")
        if self.duration_s <= 0 or self.slots < 1 or self.bursts < 0 or self.burst <= 0 or self.burst_s <= 0:
            raise ValueError("duration, burst and burst_s must be > 0, slots >= 1 and bursts >= 0")

    def day_rate(self, t_s: float) -> float:
        """The curve's rate at `t_s`, before bursts, constant within a slot."""
        slot_s = self.duration_s / self.slots
        hour = (self.start_hour + 24.0 * (t_s // slot_s) * slot_s / self.duration_s) % 24.0
        return self.trough + (self.peak - self.trough) * (1 + math.cos(2 * math.pi * (hour - self.peak_hour) / 24)) / 2

    def profile(self, rng: random.Random) -> RateProfile:
        """The piecewise-constant rate: the day's slots, bursts (drawn from `rng`) multiplied in."""
        starts = [rng.uniform(0.0, max(0.0, self.duration_s - self.burst_s)) for _ in range(self.bursts)]
        slot_s = self.duration_s / self.slots
        bounds = sorted({*(i * slot_s for i in range(self.slots)), *starts,
                         *(min(self.duration_s, b + self.burst_s) for b in starts)} - {self.duration_s})

        def rate(t: float) -> float:
            bursting = sum(1 for b in starts if b <= t < b + self.burst_s)
            return self.day_rate(t) * self.burst ** bursting

        return RateProfile(tuple((t, rate(t)) for t in bounds))

    def requests(self, rng: random.Random) -> Iterator[TraceRequest]:
        return dataclasses.replace(self.shape, profile=self.profile(rng), duration_s=self.duration_s).requests(rng)

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> DiurnalWorkload:
        numbers = {"peak": "peak", "trough": "trough", "duration": "duration_s", "peak_hour": "peak_hour",
                   "start_hour": "start_hour", "burst": "burst", "burst_s": "burst_s"}
        counts = {"slots", "bursts"}
        shape_keys = {"input", "output", "system", "lora"}
        if unknown := sorted(set(opts) - set(numbers) - counts - shape_keys):
            raise ValueError(f"unknown diurnal option(s) {unknown}; known: {sorted({*numbers, *counts, *shape_keys})}")
        shape = _open_workload("poisson", {k: v for k, v in opts.items() if k in shape_keys})
        values: dict[str, float | int] = {numbers[k]: float(v) for k, v in opts.items() if k in numbers}
        values.update({k: int(v) for k, v in opts.items() if k in counts})
        return cls(**values, shape=shape)  # type: ignore[arg-type]  # keys are the fields named above


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


def parse_spec(spec: str) -> OpenWorkload | AgentSessions | DiurnalWorkload:
    """A workload from `KIND:KEY=VALUE,...` (see the module docstring); a bad option is a
    ValueError quoting the spec."""
    kind, _, body = spec.partition(":")
    if kind not in ("agents", "poisson", "gamma", "diurnal"):
        raise ValueError(f"unknown synthetic workload {kind!r}; use poisson, gamma, diurnal or agents")
    try:
        opts = _fields(body)
        if kind == "diurnal":
            return DiurnalWorkload.from_options(opts)
        return AgentSessions.from_options(opts) if kind == "agents" else _open_workload(kind, opts)
    except (ValueError, TypeError) as exc:  # e.g. int('x'): say which spec it came from
        raise ValueError(f"synthetic workload {spec!r}: {exc}") from None


def synthetic_requests(spec: str, seed: int = 0) -> Iterator[TraceRequest]:
    """The requests of `spec`, in arrival order, drawn from `random.Random(seed)`."""
    return parse_spec(spec).requests(random.Random(seed))
