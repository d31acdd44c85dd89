"""Checks that policy configs call from `__post_init__`, each naming the offending field."""

from __future__ import annotations

from collections.abc import Iterable

from policies.routing.registry import ConfigError
from policies.routing.signals import SIGNALS, is_known_signal


def require_signal(field: str, value: str) -> None:
    if not is_known_signal(value):
        raise ConfigError(field, value, f"must be one of {', '.join(SIGNALS)} or an engine metric name")


def require_choice(field: str, value: str, choices: Iterable[str]) -> None:
    options = tuple(choices)
    if value not in options:
        raise ConfigError(field, value, f"must be one of {', '.join(options)}")


def require_positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, value, "must be > 0")


def require_non_negative(field: str, value: float) -> None:
    if not value >= 0:
        raise ConfigError(field, value, "must be >= 0")


def require_at_least(field: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(field, value, f"must be >= {low}")


def require_fraction(field: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(field, value, "must be in [0, 1]")
