"""Stopping the subprocesses a test started: gracefully when the test asserts the exit, by force after."""

from __future__ import annotations

import asyncio
import signal


async def terminate(proc: asyncio.subprocess.Process, timeout_s: float = 30) -> int:
    """SIGTERM, then the exit status once the process has stopped by itself."""
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), timeout_s)


async def kill_if_running(proc: asyncio.subprocess.Process) -> None:
    """Leave nothing behind when a test failed before stopping its process."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
