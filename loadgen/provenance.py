"""Where a result came from: the date, Flotilla's version, the command line and the trace's
checksum, kept in `RunResult.meta` so a result file found later says how to make it again."""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def flotilla_version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flotilla")
    except PackageNotFoundError:  # run from a checkout without installing
        from flotilla import __version__

        return __version__


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed: `flotilla loadgen --target ...`, shell-quoted."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["flotilla", *args])


def run_meta(trace: str | Path | None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`started_at` (ISO 8601, UTC), `flotilla_version`, `command` and `trace_sha256` (None
    for a synthetic workload: its spec and seed are in meta already)."""
    return {"started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "flotilla_version": flotilla_version(), "command": command_line(argv),
            "trace_sha256": file_sha256(trace) if trace else None}
