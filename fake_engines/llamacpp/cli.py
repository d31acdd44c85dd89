"""`fake-llama-server -m MODEL.gguf [flags]`: a stand-in for llama.cpp's llama-server."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from fake_engines.driver.faults import FaultConfigError, FaultInjector, faults_from_args
from fake_engines.factory import build_engine
from fake_engines.factory import llamacpp_config as flags
from fake_engines.factory.llamacpp_config import config_from_args
from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.gcp import gcp_port
from fake_engines.llamacpp.model import ModelFileError
from fake_engines.llamacpp.model_sources import PresetError
from fake_engines.llamacpp.router_mode import RouterSettings, settings_from_args
from fake_engines.perf.catalogue import CatalogueError
from flotilla.cli_errors import USAGE_ERROR, CannotListen

__all__ = ["build_parser", "config_from_args", "dashed_flags", "main", "print_config"]


VERSION_LINES = "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
"""What the captured build's `llama-server --version` prints, on stderr (BUILD_INFO is its b1-0c1e570)."""


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show version and build info (of the llama.cpp build the look-alike imitates)")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stderr.write(VERSION_LINES)
        parser.exit(0)


def _command_line_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved engine config as JSON (slots, context per slot) and exit, "
                             "without serving")
    parser.add_argument("--version", action=_VersionAction)
    from fake_engines.llamacpp.router_mode import add_router_flags

    add_router_flags(parser)


def build_parser() -> argparse.ArgumentParser:
    """llama-server's flags that shape what clients observe, plus the look-alike's own (the engine
    factory's parser), --print-config and --version."""
    return flags.build_parser(extra=_command_line_only)


def print_config(config: LlamaServerConfig) -> None:
    """The resolved config as JSON on stdout."""
    print(json.dumps(build_engine(config).describe(), indent=1))


async def _serve(config: LlamaServerConfig, faults: FaultInjector | None = None,
                 router: RouterSettings | None = None) -> None:
    from fake_engines.driver.serving import install_sigterm
    from fake_engines.llamacpp.router_mode import start_router
    from fake_engines.llamacpp.server import start_llama

    try:
        running = await (start_router(config, router) if router is not None else start_llama(config, faults=faults))
    except OSError as exc:  # the port is taken, or --host is no address of this machine
        raise CannotListen(config.host, config.port, exc) from None
    stop = asyncio.Event()
    install_sigterm(asyncio.get_running_loop(), stop.set)
    print(f"main: server is listening on http://{config.host}:{running.port} - starting the main loop", flush=True)
    await stop.wait()
    print("srv    operator(): operator(): cleaning up before exit...", flush=True)
    await running.drain_and_close()


def dashed_flags(argv: list[str]) -> list[str]:
    """llama.cpp's parser reads `_` as `-` in a `--` flag (common/arg.cpp), so `--backend_sampling` is
    `--backend-sampling`; values are left alone (a `--` token with `=` is taken for one)."""
    return [a.replace("_", "-") if a.startswith("--") and "=" not in a else a for a in argv]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fake-llama-server`."""
    argv = dashed_flags(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    router = None
    try:
        if args.model is None:  # no model: llama-server's router mode; its own app runs the child model
            router = settings_from_args(args, argv)
            args.model, args.sleep_idle_seconds = router.child_model, -1  # the instances sleep, not the router
        config = gcp_port(config_from_args(args), os.environ)
        if args.print_config:
            print_config(config)
            return 0
        faults = FaultInjector(faults_from_args(args), api_key=config.api_key, exit_process=True)
        asyncio.run(_serve(config, faults, router))
    except (FaultConfigError, ServerConfigError, ModelFileError, CatalogueError, CannotListen, PresetError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line naming the flag or file, no traceback
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
