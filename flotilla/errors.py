"""The one error for a setting that cannot be used, shared by every package of the project.

It lives here because `flotilla/__init__.py` imports nothing: `policies`, `fake_engines`, `sim`
and `proxy` can all import this module without a cycle. Catch `ConfigError` to catch any bad
setting: a policy parameter, an engine flag, a fleet-file value.
"""

from __future__ import annotations

__all__ = ["ConfigError", "FlagError"]


class ConfigError(ValueError):
    """A setting holds a value that cannot be used: `field` names it, `value` is what was given,
    `reason` says why, and `source` is the file it came from, if any.

    The message is `[SOURCE: ]FIELD=VALUE!r: REASON`, e.g. `bound='high': expected float/NoneType`.
    """

    def __init__(self, field: str, value: object, reason: str, source: str | None = None) -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason
        self.source = source

    def located(self, source: str) -> ConfigError:
        """The same error, said to come from `source` (a file path)."""
        return ConfigError(self.field, self.value, self.reason, source)


class FlagError(ConfigError):
    """A command-line flag the program cannot start with; the message is one line that names the
    flag, as the real program would print it (`-np must be >= 1 or -1 (auto), got 0`)."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.field = "flags"
        self.value = None
        self.reason = message
        self.source = None

    def located(self, source: str) -> ConfigError:
        return FlagError(f"{source}: {self.reason}")
