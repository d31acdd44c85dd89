"""`fake-llama-server -m MODEL.gguf [flags]`: a stand-in for llama.cpp's llama-server."""

from __future__ import annotations

import argparse
import asyncio
import sys

from fake_engines.driver.faults import FaultConfigError, FaultInjector, add_fault_arguments, faults_from_args
from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError, parse_tensor_split
from fake_engines.llamacpp.model import ModelFileError
from fake_engines.perf.catalogue import CatalogueError
from flotilla.cli_errors import USAGE_ERROR, CannotListen, OneLineParser, port_number


def build_parser() -> argparse.ArgumentParser:
    """llama-server's flags that shape what clients observe, plus the look-alike's own."""
    p = OneLineParser(prog="fake-llama-server", description="Look-alike of llama.cpp's llama-server.")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-np", "--parallel", type=int, default=-1)
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=-1)
    p.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row", "tensor"])
    p.add_argument("-ts", "--tensor-split", default=None)
    p.add_argument("-mg", "--main-gpu", type=int, default=0)
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("--lora", action="append", default=[], metavar="FNAME")
    p.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FNAME", "SCALE"))
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--no-slots", action="store_true")
    p.add_argument("--slot-prompt-similarity", "-sps", type=float, default=0.10)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8080)
    p.add_argument("--api-key", default=None)
    add_fault_arguments(p)
    look = p.add_argument_group("look-alike")
    look.add_argument("--gpu", default="h100", help="catalogue GPU name")
    look.add_argument("--time-scale", type=float, default=1.0, help="0.01 runs 100x faster than modelled")
    look.add_argument("--seed", type=int, default=0)
    look.add_argument("--load-gbps", type=float, default=5.0, help="weight loading bandwidth, GB/s")
    return p


def config_from_args(args: argparse.Namespace) -> LlamaServerConfig:
    """Flags to a validated LlamaServerConfig."""
    loras = [(path, 1.0) for path in args.lora] + [(path, _scale(scale)) for path, scale in args.lora_scaled]
    return LlamaServerConfig(
        model=args.model, alias=args.alias, n_ctx=args.ctx_size, n_parallel=args.parallel,
        n_gpu_layers=args.n_gpu_layers, split_mode=args.split_mode, tensor_split=parse_tensor_split(args.tensor_split),
        main_gpu=args.main_gpu, n_batch=args.batch_size, n_ubatch=args.ubatch_size, loras=loras,
        warmup=not args.no_warmup, metrics=args.metrics, slots=not args.no_slots,
        slot_prompt_similarity=args.slot_prompt_similarity, host=args.host, port=args.port, api_key=args.api_key,
        gpu=args.gpu, time_scale=args.time_scale, seed=args.seed, load_gbps=args.load_gbps)


def _scale(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ServerConfigError(f"--lora-scaled expects FNAME SCALE with a number for SCALE, got {text!r}") from None


async def _serve(config: LlamaServerConfig, faults: FaultInjector | None = None) -> None:
    from fake_engines.driver.serving import install_sigterm
    from fake_engines.llamacpp.server import start_llama

    try:
        running = await start_llama(config, faults=faults)
    except OSError as exc:  # the port is taken, or --host is no address of this machine
        raise CannotListen(config.host, config.port, exc) from None
    stop = asyncio.Event()
    install_sigterm(asyncio.get_running_loop(), stop.set)
    print(f"main: server is listening on http://{config.host}:{running.port} - starting the main loop", flush=True)
    await stop.wait()
    print("srv    operator(): operator(): cleaning up before exit...", flush=True)
    await running.drain_and_close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fake-llama-server`."""
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        faults = FaultInjector(faults_from_args(args), api_key=config.api_key, exit_process=True)
        asyncio.run(_serve(config, faults))
    except (FaultConfigError, ServerConfigError, ModelFileError, CatalogueError, CannotListen) as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line naming the flag or file, no traceback
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
