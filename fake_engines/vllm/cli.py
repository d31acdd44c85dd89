"""`fake-vllm serve MODEL [flags]`: a stand-in for `vllm serve`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from fake_engines.core import HASH_ALGOS
from fake_engines.driver.faults import FaultConfigError, FaultInjector, add_fault_arguments, faults_from_args
from fake_engines.perf.catalogue import CatalogueError
from fake_engines.vllm.config import ServeConfigError, VllmServeConfig, parse_lora_modules
from fake_engines.vllm.engine import ModelDoesNotFit
from flotilla.cli_errors import USAGE_ERROR, CannotListen, OneLineParser, port_number


def build_parser() -> argparse.ArgumentParser:
    """vLLM's serve flags (those a router or autoscaler can observe) plus the look-alike's own."""
    parser = OneLineParser(prog="fake-vllm", description="Look-alike of `vllm serve`.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI API")
    serve.add_argument("model", help="catalogue model name, or a path whose last part names one")
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port_number, default=8000)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    serve.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    serve.add_argument("-dp", "--data-parallel-size", type=int, default=1)
    serve.add_argument("--enable-expert-parallel", action="store_true")
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--max-model-len", type=int, default=8192)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--block-size", type=int, default=None)
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--prefix-caching-hash-algo", choices=tuple(HASH_ALGOS), default="sha256")
    serve.add_argument("--num-gpu-blocks-override", type=int, default=None)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-loras", type=int, default=1)
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH")
    serve.add_argument("--enable-prompt-tokens-details", action="store_true")
    add_fault_arguments(serve)
    look = serve.add_argument_group("look-alike")
    look.add_argument("--gpu", default="h100", help="catalogue GPU name")
    look.add_argument("--dtype", default="bfloat16")
    look.add_argument("--time-scale", type=float, default=1.0, help="0.01 runs 100x faster than modelled")
    look.add_argument("--seed", type=int, default=0)
    look.add_argument("--load-gbps", type=float, default=5.0, help="weight loading bandwidth, GB/s")
    look.add_argument("--startup-seconds", type=float, default=5.0)
    look.add_argument("--warmup-seconds", type=float, default=10.0)
    shape = serve.add_argument_group("explicit model shape (instead of a catalogue model)")
    shape.add_argument("--params", type=float, help="parameters, all experts included, e.g. 8.03e9")
    shape.add_argument("--layers", type=int)
    shape.add_argument("--kv-heads", type=int)
    shape.add_argument("--head-dim", type=int)
    shape.add_argument("--hidden", type=int)
    shape.add_argument("--heads", type=int)
    shape.add_argument("--intermediate", type=int)
    shape.add_argument("--vocab", type=int)
    return parser


SHAPE_FLAGS = ("params", "layers", "kv_heads", "head_dim", "hidden", "heads", "intermediate", "vocab")


def _shape(args: argparse.Namespace) -> dict[str, float] | None:
    shape = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) is not None}
    return shape or None


def config_from_args(args: argparse.Namespace) -> VllmServeConfig:
    """Flags to a validated VllmServeConfig."""
    return VllmServeConfig(
        model=args.model, model_shape=_shape(args), served_model_name=args.served_model_name[0] if args.served_model_name else None,
        host=args.host, port=args.port, api_key=args.api_key, tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size, data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo, num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_lora=args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
        lora_modules=parse_lora_modules(args.lora_modules),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details, gpu=args.gpu, dtype=args.dtype,
        time_scale=args.time_scale, seed=args.seed, load_gbps=args.load_gbps, startup_s=args.startup_seconds,
        warmup_s=args.warmup_seconds)


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
