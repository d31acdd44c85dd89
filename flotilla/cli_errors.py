"""One-line errors for every program of the distribution: `flotilla`, `fake-vllm`, `fake-llama-server`.

A usage mistake or a setting a program cannot start with prints one line on stderr naming what is
wrong and where, and exits with status 2: no usage dump, no traceback. Standard library only, so
the engines' command lines can use it without pulling in the rest of Flotilla.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import socket
import sys
from typing import NoReturn

USAGE_ERROR = 2
"""Exit status of every command-line and configuration error (argparse's own)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def fail(prog: str, message: str, status: int = USAGE_ERROR) -> int:
    """Print `PROG: error: MESSAGE` as one line on stderr and return the exit status to use."""
    with contextlib.suppress(OSError):  # a closed terminal must not turn the error into a traceback
        print(f"{prog}: error: {message}", file=sys.stderr)
    return status


class OneLineParser(argparse.ArgumentParser):
    """argparse, with errors as one line (`PROG: error: WHAT (see PROG --help)`), exit status 2.

    Subparsers made by `add_subparsers` are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def port_number(text: str) -> int:
    """argparse type of a TCP port: 0 to 65535 (0 picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: must be an integer in [0, 65535]") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: must be in [0, 65535]")
    return port


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {value}: must be >= 1")
    return value


def log_level(text: str) -> str:
    """argparse type of --log-level: a logging level name, any case."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"invalid level {text!r}: choose from {', '.join(LOG_LEVELS)}")
    return text.lower()


def bind_error(host: str, port: int, exc: OSError) -> str:
    """What went wrong binding `host`:`port`, in one line that names the flag to change."""
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {host}: no such host name (--host)"
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: not an address of this machine (--host)"
    if exc.errno == errno.EACCES:
        return f"port {port} on {host}: permission denied (ports below 1024 need privileges)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


class CannotListen(Exception):
    """The listening socket could not be bound; the message is `bind_error`'s one line."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        super().__init__(bind_error(host, port, exc))
