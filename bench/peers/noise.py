"""The noise guard: other jobs share this machine, so each phase measures how many cores were
busy with processes that are not the benchmark's own, and a noisy phase is run again."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from bench.peers.procs import machine_busy_s, tree_cpu_s

T = TypeVar("T")


@dataclass(frozen=True)
class GuardConfig:
    """When a phase counts as noisy and what to do about it."""

    max_other_cores: float = 0.2
    """A phase in which other processes used more cores than this on average is repeated."""
    attempts: int = 3
    """Tries per phase, the first included; the quietest try is kept."""
    quiet_wait_s: float = 1.0
    """Before each try, wait up to this long for the machine's busy share to drop below `quiet_below`."""
    quiet_below: float = 0.3

    def __post_init__(self) -> None:
        if self.max_other_cores < 0:
            raise ValueError(f"max_other_cores={self.max_other_cores}: must be >= 0")
        if self.attempts < 1:
            raise ValueError(f"attempts={self.attempts}: must be >= 1")


@dataclass(frozen=True)
class Guarded:
    """A phase's outcome and how much other work shared the machine while it ran."""

    value: object
    other_cores: float
    """Cores used on average by processes outside the benchmark's own tree during the phase."""
    attempts: int
    """Tries it took; a value at the limit with other_cores above the threshold is marked noisy."""
    wall_s: float


def own_cpu_s() -> float:
    """CPU of this process, its live descendants and its reaped children (wrk)."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return tree_cpu_s(os.getpid()) + reaped.ru_utime + reaped.ru_stime


def other_cores(busy_s: float, own_s: float, wall_s: float) -> float:
    """Average cores used by others over a phase: machine busy CPU minus our own, per second."""
    return max(0.0, busy_s - own_s) / wall_s if wall_s > 0 else 0.0


def busy_share(interval_s: float = 0.5) -> float:
    b0, t0 = machine_busy_s()
    time.sleep(interval_s)
    b1, t1 = machine_busy_s()
    return (b1 - b0) / max(1e-9, t1 - t0)


def wait_quiet(cfg: GuardConfig) -> None:
    deadline = time.monotonic() + cfg.quiet_wait_s
    while busy_share() >= cfg.quiet_below and time.monotonic() < deadline:
        pass


def guarded(run: Callable[[], T], cfg: GuardConfig) -> Guarded:
    """Run a phase, repeating it while others used more than `cfg.max_other_cores`; keep the quietest."""
    best: Guarded | None = None
    for attempt in range(1, cfg.attempts + 1):
        wait_quiet(cfg)
        busy0, own0, w0 = machine_busy_s()[0], own_cpu_s(), time.monotonic()
        value = run()
        wall = time.monotonic() - w0
        others = other_cores(machine_busy_s()[0] - busy0, own_cpu_s() - own0, wall)
        if best is None or others < best.other_cores:
            best = Guarded(value, others, attempt, wall)
        if others <= cfg.max_other_cores:
            break
    return Guarded(best.value, best.other_cores, attempt, best.wall_s)
