"""`flotilla up`: a local fleet (engines, proxy, autoscaler) in one command, with live status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
import tempfile
import time
from pathlib import Path

from flotilla.cli_errors import fail

HELP = "start a local fleet of look-alike engines behind the proxy and show its live status"
DESCRIPTION = """\
Start the engines, the proxy and the autoscaler of a fleet file as child processes, wait until
they are ready, print the endpoints and a status table refreshed every second. Ctrl-C, SIGTERM or
SIGHUP (a closed terminal) stops everything; on Linux even a SIGKILL leaves no process behind.
A taken port, an engine or proxy that exits while starting, a bad fleet file: one line on stderr
naming the cause, exit status non-zero, nothing left running.

  flotilla up                          # the packaged default fleet, proxy on 127.0.0.1:8000
  flotilla up fleet.yaml --port 9000
  flotilla up --demo                   # replay the bundled trace slice, print the summary, stop

The fleet file is described in docs/fleet-file.md.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `flotilla up`."""
    parser.add_argument("fleet", nargs="?", type=Path, help="fleet YAML (default: the packaged default fleet)")
    parser.add_argument("--port", type=int, default=None,
                        help="proxy port on 127.0.0.1 (default: the fleet file's, 8000; 0 picks a free one)")
    parser.add_argument("--demo", action="store_true",
                        help="replay the demo trace through the fleet, print the loadgen summary, then stop")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="run every engine this much of modelled time (0.05: 20x faster)")
    parser.add_argument("--ready-timeout-s", type=float, default=120.0, help="give up starting after this long")
    parser.add_argument("--refresh-s", type=float, default=1.0, help="seconds between status refreshes")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where each process logs (default: a new temporary directory)")


def _fail(message: str, status: int = 2) -> int:
    """One line on stderr; status 2 for a bad command or fleet file, 1 for a fleet that failed."""
    return fail("flotilla up", message, status)


def _load(args: argparse.Namespace):  # -> flotilla.fleet.Fleet, imported lazily
    from flotilla.fleet import load_fleet_file
    from proxy.config import ConfigError

    fleet = load_fleet_file(args.fleet)
    if args.time_scale is not None:
        if not args.time_scale > 0:
            raise ConfigError("--time-scale", args.time_scale, "must be > 0")
        engines = tuple(dataclasses.replace(g, time_scale=args.time_scale) for g in fleet.engines)
        fleet = dataclasses.replace(fleet, engines=engines)
    if args.port is not None and not 0 <= args.port <= 65535:
        raise ConfigError("--port", args.port, "must be in [0, 65535]")
    return fleet


def run(args: argparse.Namespace) -> int:
    """Entry point of `flotilla up`; returns the exit status."""
    from proxy.config import ConfigError
    from proxy.supervisor import FleetError, check_port_free

    try:
        fleet = _load(args)
    except (ConfigError, OSError) as exc:
        return _fail(str(exc))
    port = fleet.port if args.port is None else args.port
    try:
        if port:  # fail before starting anything; the proxy's own bind is checked too
            check_port_free(port)
    except FleetError as exc:  # a setting that cannot be used, like `flotilla proxy`'s: exit 2
        return _fail(str(exc))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="flotilla-up-"))
    return asyncio.run(_up(fleet, args, log_dir))


def _say(line: str) -> None:
    # A closed terminal must not stop the fleet from being stopped.
    with contextlib.suppress(OSError):
        print(line, flush=True)


async def _up(spec, args: argparse.Namespace, log_dir: Path) -> int:
    import aiohttp

    from proxy.supervisor import Fleet, FleetError, become_subreaper

    become_subreaper()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
        loop.add_signal_handler(sig, stop.set)
    fleet = Fleet(spec=spec, log_dir=log_dir)
    try:
        async with aiohttp.ClientSession() as session:
            await fleet.start(spec.port if args.port is None else args.port)
            return await _until_stopped(_serve(fleet, session, args), stop)
    except FleetError as exc:
        return _fail(str(exc), status=1)
    finally:
        if fleet.members:
            _say("stopping the fleet ...")
        await fleet.stop()
        if fleet.members:
            _say("stopped")


async def _until_stopped(work, stop: asyncio.Event) -> int:
    """Run `work` until it ends or a signal arrives (0 then: a requested stop is a clean exit)."""
    task, stopping = asyncio.create_task(work), asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not task.done():
        task.cancel()
        return 0
    return task.result()


async def _serve(fleet, session, args: argparse.Namespace) -> int:
    from proxy.supervisor import wait_ready

    started = time.monotonic()
    scaled = fleet.spec.scaled_group()
    extra = f" (its autoscaler starts {scaled.min_replicas} {scaled.name})" if scaled is not None else ""
    _say(f"starting {len(fleet.engines)} engine(s) and the proxy{extra}; logs in {fleet.log_dir}")
    await wait_ready(fleet, session, args.ready_timeout_s, _say)  # its own proxy, every process alive
    _say(f"fleet ready in {time.monotonic() - started:.1f} s")
    _print_endpoints(fleet)
    if args.demo:
        return await _demo(fleet)
    await _status_loop(fleet, session, args.refresh_s)
    return 0


def _print_endpoints(fleet) -> None:
    _say(f"  proxy     {fleet.proxy_url}/v1   (metrics {fleet.proxy_url}/metrics)")
    for m in fleet.engines:
        _say(f"  {m.name:<9} {m.handle.url}   ({m.actuator.flavor}, pid {m.handle.pid})")
    scaled = fleet.spec.scaled_group()
    if scaled is not None:
        _say(f"  {scaled.name + '/*':<9} started by the proxy's autoscaler "
             f"({scaled.flavor}, {scaled.min_replicas} to {scaled.max_replicas} replicas)")
    _say(f"  try: curl {fleet.proxy_url}/v1/completions -H 'Content-Type: application/json' "
         f"-d '{{\"model\": \"{fleet.spec.engines[0].model}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'")


async def _status_loop(fleet, session, refresh_s: float) -> None:
    from proxy.status import format_line, format_table
    from proxy.supervisor import exits_since, poll_status

    tty, before, drawn = sys.stdout.isatty(), None, 0
    shown: tuple[tuple[str, str], ...] = ()  # in a log: the replicas and states the last table showed
    reported: set[str] = set()
    while True:
        for line in await exits_since(fleet, reported):  # FleetError when the proxy exited
            _say(f"warning: {line}")
            drawn = 0
        status = await poll_status(session, fleet.proxy_url, fleet.instance)
        shape = () if status is None else tuple((b.url, b.state) for b in status.backends)
        if status is not None and not tty and shape == shown:  # a log: one line per refresh...
            _say(f"{time.strftime('%H:%M:%S')} {format_line(status, before)}")
            before = status
        elif status is not None and not tty:  # ...and the table when a replica comes, goes or changes state
            _say("\n" + format_table(status, before))
            before, shown = status, shape
        elif status is not None:  # a terminal: the table redraws in place
            table = format_table(status, before)
            clear = f"\x1b[{drawn}F\x1b[J" if drawn else ""
            _say(clear + "\n" + table)
            drawn, before = table.count("\n") + 2, status
        await asyncio.sleep(refresh_s)


async def _demo(fleet) -> int:
    from loadgen.readers import read_trace
    from loadgen.report import summary_table
    from loadgen.runner import OpenLoopRunner, RunnerConfig
    from loadgen.timebase import SEEN_KEY, in_time_base, time_base

    demo = fleet.spec.demo
    trace = demo.trace_path()
    _say(f"demo: replaying {trace.name} at {demo.speedup:g}x through {fleet.proxy_url}")
    cfg = RunnerConfig(target_url=fleet.proxy_url, speedup=demo.speedup, max_requests=demo.max_requests,
                       replicas_url=fleet.proxy_url + "/metrics", show_progress=sys.stderr.isatty(),
                       meta={"label": "demo", "trace": str(trace)})
    wall = await OpenLoopRunner(cfg).run(read_trace(trace))
    # the time base `flotilla loadgen` uses: the scale the engines name on their responses
    base = time_base(wall.meta.get(SEEN_KEY, {}))
    result = in_time_base(wall, base)
    _say(base.note)
    if base.scale is not None and base.scale < 1:
        _say(f"  (the engines run {1 / base.scale:g}x faster than modelled: tokens this close together often "
             "share one read, which shortens ITL; TPOT is the steadier per-token figure)")
    _say(summary_table(result))
    return 0 if result.summary.num_ok else 1
