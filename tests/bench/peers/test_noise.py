"""The noise guard: others' cores from machine and own CPU, config validation, repeats."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.peers import noise
from bench.peers.noise import GuardConfig, guarded, other_cores


def test_other_cores_is_machine_busy_minus_own_per_second() -> None:
    assert other_cores(busy_s=6.0, own_s=2.0, wall_s=4.0) == 1.0
    assert other_cores(busy_s=1.0, own_s=1.5, wall_s=2.0) == 0.0  # clock-tick rounding never goes negative
    assert other_cores(busy_s=1.0, own_s=0.0, wall_s=0.0) == 0.0


@pytest.mark.parametrize(("field", "kwargs"), [("max_other_cores", {"max_other_cores": -0.1}),
                                               ("attempts", {"attempts": 0})])
def test_bad_guard_config_names_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        GuardConfig(**kwargs)


def _scripted_machine(monkeypatch: pytest.MonkeyPatch, others_per_try: list[float]) -> Callable[[], None]:
    """Each try sees `others` busy CPU seconds from other processes over a 1 s phase."""
    clock = {"busy": 0.0, "mono": 0.0}
    tries = iter(others_per_try)
    monkeypatch.setattr(noise, "wait_quiet", lambda cfg: None)
    monkeypatch.setattr(noise, "own_cpu_s", lambda: 0.0)
    monkeypatch.setattr(noise, "machine_busy_s", lambda: (clock["busy"], 0.0))
    monkeypatch.setattr(noise.time, "monotonic", lambda: clock["mono"])

    def advance() -> None:
        clock["busy"] += next(tries)
        clock["mono"] += 1.0
    return advance


def test_noisy_phase_is_repeated_and_the_quietest_try_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    advance = _scripted_machine(monkeypatch, [1.5, 0.6, 0.9])
    calls = []

    def run() -> int:
        calls.append(1)
        advance()
        return len(calls)
    g = guarded(run, GuardConfig(max_other_cores=0.2, attempts=3))
    assert (g.value, g.attempts) == (2, 3)
    assert g.other_cores == pytest.approx(0.6)


def test_quiet_phase_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    advance = _scripted_machine(monkeypatch, [0.1, 5.0])
    g = guarded(lambda: advance() or "ok", GuardConfig(max_other_cores=0.2, attempts=3))
    assert (g.value, g.attempts, g.other_cores) == ("ok", 1, pytest.approx(0.1))
