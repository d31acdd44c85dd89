"""`fake-vllm serve MODEL [flags]`: a stand-in for `vllm serve`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from fake_engines.driver.faults import FaultConfigError, FaultInjector, faults_from_args
from fake_engines.factory import build_engine
from fake_engines.factory import vllm_config as flags
from fake_engines.factory.vllm_config import SHAPE_FLAGS, config_from_args
from fake_engines.perf.catalogue import CatalogueError
from fake_engines.vllm.config import VLLM_VERSION, ServeConfigError, VllmServeConfig
from fake_engines.vllm.engine import ModelDoesNotFit
from flotilla.cli_errors import USAGE_ERROR, CannotListen

__all__ = ["SHAPE_FLAGS", "build_parser", "config_from_args", "main", "print_config"]


def _command_line_only(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--print-config", action="store_true",
                       help="print the resolved engine config as JSON (the defaults vLLM fills for this "
                            "model and GPU, the KV blocks) and exit, without serving")


def build_parser() -> argparse.ArgumentParser:
    """vLLM's serve flags (those a router or autoscaler can observe) plus the look-alike's own
    (the engine factory's parser) and --print-config."""
    parser = flags.build_parser(extra=_command_line_only)
    # `vllm --version` prints the release alone (importlib.metadata.version("vllm"))
    parser.add_argument("--version", action="version", version=VLLM_VERSION,
                        help="print the vLLM version the look-alike imitates and exit")
    return parser


def print_config(config: VllmServeConfig) -> None:
    """The resolved config as JSON on stdout (ModelDoesNotFit propagates, as a start would fail)."""
    print(json.dumps(build_engine(config).describe(), indent=1))


async def _serve(config: VllmServeConfig, faults: FaultInjector | None = None) -> None:
    from fake_engines.driver.serving import install_sigterm
    from fake_engines.vllm.server import start_vllm

    try:
        running = await start_vllm(config, faults=faults)
    except OSError as exc:  # the port is taken, or --host is no address of this machine
        raise CannotListen(config.host, config.port, exc) from None
    stop = asyncio.Event()
    install_sigterm(asyncio.get_running_loop(), stop.set)
    print(f"INFO:     fake vLLM bound to http://{config.host}:{running.port}", flush=True)
    ready = asyncio.create_task(running.wait_ready())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({ready, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        print(f"INFO:     Uvicorn running on http://{config.host}:{running.port} (Press CTRL+C to quit)", flush=True)
        await stopping
    ready.cancel()
    print("INFO:     Shutting down", flush=True)
    await running.drain_and_close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fake-vllm`."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        if args.print_config:
            print_config(config)
            return 0
        faults = FaultInjector(faults_from_args(args), api_key=config.api_key, exit_process=True)
        asyncio.run(_serve(config, faults))
    except ModelDoesNotFit as exc:  # vLLM's own failure to start: CUDA out of memory, exit status 1
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    except (FaultConfigError, ServeConfigError, CatalogueError, CannotListen) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)  # one line naming the flag, no traceback
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
