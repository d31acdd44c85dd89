"""`flotilla proxy`: the OpenAI-compatible router in front of vLLM and llama-server replicas."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from flotilla.cli_errors import LOG_LEVELS, bind_error, fail, log_level, port_number

if TYPE_CHECKING:  # imported for real only when the command runs (aiohttp is not cheap)
    from collections.abc import Callable

    from aiohttp import web

    from proxy.autoscale.config import AutoscaleConfig
    from proxy.config import ProxyConfig
    from proxy.discovery import DiscoverSpec
    from proxy.workers import WorkerContext

HELP = "run the OpenAI-compatible streaming router in front of engine replicas"
DESCRIPTION = """\
Route OpenAI-style requests over a fleet of vLLM, llama-server or other OpenAI-compatible engines.

  flotilla proxy --backend vllm=http://127.0.0.1:8001 --backend llamacpp=http://127.0.0.1:8002
  flotilla proxy --config fleet.yaml --policy prefix-aware --port 8000
  flotilla proxy --discover vllm=k8s:vllm          # every pod of a Kubernetes Service
  flotilla proxy --workers auto --backend ...      # one process per core on the one port

Serves /v1/completions, /v1/chat/completions (forwarded), /v1/models (the union over backends),
/health, /ready, /metrics (flotilla_*), and with --admin-token
/admin/backends (GET, POST, DELETE). The fleet file is reloaded when it changes.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    from proxy.workers import DEFAULT_WORKERS, worker_count  # stays free of aiohttp

    parser.add_argument("--workers", type=worker_count, default=DEFAULT_WORKERS, metavar="N|auto",
                        help="processes serving the one address, sharing in-flight work, engine scrapes "
                             "and /metrics; auto: one per core (default %(default)s; docs/proxy.md#workers)")
    parser.add_argument("--policy", default=None,
                        help="routing policy NAME[:key=value,...] (default least-outstanding)")
    parser.add_argument("--backend", action="append", default=[], metavar="[FLAVOR=]URL",
                        help="a backend; FLAVOR is vllm, llamacpp or openai; repeat for more")
    parser.add_argument("--config", type=Path, help="fleet YAML with backends (and policy); watched")
    parser.add_argument("--prefill", action="append", default=[], metavar="URL",
                        help="disaggregated serving: a prefill replica (vLLM with --kv-transfer-config); "
                             "repeatable; requests run their prefill here, then decode on a --decode replica "
                             "(docs/pd.md)")
    parser.add_argument("--decode", action="append", default=[], metavar="URL",
                        help="disaggregated serving: a decode replica; repeatable")
    parser.add_argument("--prefill-policy", default="prefix-aware",
                        help="routing policy of the prefill replicas (default prefix-aware)")
    parser.add_argument("--decode-policy", default=None,
                        help="routing policy of the decode replicas (default least-load with --prefill, "
                             "else --policy)")
    from proxy.discovery import add_arguments as add_discovery_arguments  # stays free of aiohttp

    add_discovery_arguments(parser)
    parser.add_argument("--admin-token", default=os.environ.get("FLOTILLA_ADMIN_TOKEN"),
                        help="bearer token for /admin/*; default $FLOTILLA_ADMIN_TOKEN; unset disables it")
    parser.add_argument("--instance-id", default=os.environ.get("FLOTILLA_INSTANCE_ID"),
                        help="sent back in the x-flotilla-instance header of every response, so whoever "
                             "started this proxy (flotilla up) knows it reads this one; "
                             "default $FLOTILLA_INSTANCE_ID")
    parser.add_argument("--scrape-interval-s", type=float, default=0.25)
    parser.add_argument("--health-interval-s", type=float, default=1.0)
    parser.add_argument("--connect-timeout-s", type=float, default=5.0)
    parser.add_argument("--first-byte-timeout-s", type=float, default=300.0)
    parser.add_argument("--idle-timeout-s", type=float, default=60.0)
    parser.add_argument("--total-timeout-s", type=float, default=1800.0)
    parser.add_argument("--client-write-timeout-s", type=float, default=30.0,
                        help="drop a client that takes no response bytes for this long (default %(default)s)")
    parser.add_argument("--max-attempts", type=int, default=3, help="tries per request, the first included")
    parser.add_argument("--log-level", type=log_level, default="warning", help=", ".join(LOG_LEVELS))
    parser.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                        help="serve completions and chat through aiohttp's server too, not proxy/fastpath.py "
                             "(docs/benchmarks.md has the difference)")
    from proxy.limits import add_limit_arguments  # stays free of aiohttp

    add_limit_arguments(parser)
    from proxy.autoscale import add_arguments as add_autoscale_arguments  # stays free of aiohttp

    add_autoscale_arguments(parser)


def build_config(args: argparse.Namespace) -> ProxyConfig:
    from proxy.config import (
        BackendSpec,
        HealthConfig,
        ProxyConfig,
        RetryConfig,
        TimeoutConfig,
        load_fleet,
        parse_backend_arg,
    )
    from proxy.limits import limits_from_args

    backends: list[BackendSpec] = [parse_backend_arg(b) for b in args.backend]
    backends += [parse_backend_arg(_vllm_flavored(url)) for url in args.decode]
    prefill = [parse_backend_arg(_vllm_flavored(url)) for url in args.prefill]
    policy = args.decode_policy or args.policy or ("least-load" if prefill else None)
    if args.config is not None:
        fleet = load_fleet(args.config)
        backends += list(fleet.backends)
        policy = policy or fleet.policy
    return ProxyConfig(
        host=args.host, port=args.port, policy=policy or "least-outstanding", backends=backends,
        config_path=args.config, admin_token=args.admin_token or None, scrape_interval_s=args.scrape_interval_s,
        timeouts=TimeoutConfig(connect_s=args.connect_timeout_s, first_byte_s=args.first_byte_timeout_s,
                               idle_s=args.idle_timeout_s, total_s=args.total_timeout_s,
                               client_write_s=args.client_write_timeout_s),
        retry=RetryConfig(max_attempts=args.max_attempts),
        limits=limits_from_args(args),
        health=HealthConfig(interval_s=args.health_interval_s),
        prefill_backends=prefill, prefill_policy=args.prefill_policy, fast_path=args.fast_path,
    )


def _vllm_flavored(url: str) -> str:
    """P/D replicas are vLLM engines (kv_transfer_params is vLLM's protocol): `vllm=URL`, unless given."""
    return url if "=" in url.split("://", 1)[0] else f"vllm={url}"


INSTANCE_HEADER = "x-flotilla-instance"


def listening_line(url: str, config: ProxyConfig, workers: int = 1) -> str:
    from proxy.build import describe

    each = f", {workers} workers" if workers > 1 else ""
    return (f"flotilla proxy listening on {url} ({len(config.backends)} backends, policy {config.policy}{each}, "
            f"{describe()})")


async def serve(config: ProxyConfig, autoscale: AutoscaleConfig | list[AutoscaleConfig] | None = None,
                instance_id: str | None = None, discover: list[DiscoverSpec] | None = None,
                worker: WorkerContext | None = None) -> None:
    from proxy.app import add_response_header, start_proxy
    from proxy.server import keep_freed_heap, raise_open_file_limit

    def extend(app: web.Application) -> None:
        if discover:
            from proxy.discovery import attach as attach_discovery

            attach_discovery(app, discover)
        if autoscale:
            from proxy.autoscale.setup import attach

            for each in autoscale if isinstance(autoscale, list) else [autoscale]:  # P/D: one per pool
                attach(app, each)
        if instance_id:
            add_response_header(app, INSTANCE_HEADER, instance_id)
        if worker is not None:
            from proxy.workers import attach as attach_worker

            attach_worker(app, worker)
    raise_open_file_limit()
    keep_freed_heap()
    if worker is None:
        running = await start_proxy(config, extend=extend)
        print(listening_line(running.url, config), flush=True)
    else:
        running = await start_proxy(config, extend=extend, sock=worker.listening_socket())
        worker.ready()
    # What startup made (modules, the app, the pool) lives as long as the process: out of the
    # collector's sight, its full collections scan only what requests leave behind. And a
    # request allocates a few hundred container objects, nearly all freed by reference counting
    # when it ends: a young-generation pass every 700 allocations (the default) mostly finds
    # nothing; every 20,000 cut wrk's CPU per request by a fifth here (docs/benchmarks.md).
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.close()


def autoscale_config(args: argparse.Namespace) -> list[AutoscaleConfig]:
    """The autoscalers --autoscale or the fleet file's `autoscaler:` section asks for (P/D: one
    per pool), or none."""
    from proxy.autoscale.config import configs_from_args

    return configs_from_args(args)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # uvloop is not built for every platform
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    import random

    from policies.routing import create_policy
    from proxy.config import ConfigError
    from proxy.discovery import specs_from_args
    from proxy.kube import KubeError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
        create_policy(config.policy, random.Random())  # a bad spec fails here, with the valid names
        create_policy(config.prefill_policy, random.Random())
        autoscale = autoscale_config(args)
        discover = specs_from_args(args)
    except (ConfigError, OSError, ValueError) as exc:
        return _fail(str(exc))
    if not config.backends and config.config_path is None and not autoscale and not discover:
        return _fail("give at least one --backend URL, --discover k8s:SERVICE, --config fleet.yaml "
                     "or --autoscale SPEC")
    if args.workers > 1:
        if any(each.role == "prefill" or each.actuator != "local" for each in autoscale):
            return _fail("--workers above 1 autoscales with the local actuator only, one pool: its engines "
                         "die with the worker that leads (containers and pods would outlive it), and a "
                         "prefill pool's autoscaler (role: prefill) runs with one worker for now")
        return run_workers(args.workers, config, args.instance_id, discover, autoscale)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(config, autoscale, args.instance_id, discover))
    except KubeError as exc:  # no cluster configuration for --discover (nothing listens yet)
        return _fail(str(exc))
    except OSError as exc:  # the port or --host cannot be bound (start_proxy has undone its startup)
        return _fail(bind_error(config.host, config.port, exc))
    return 0


def run_workers(workers: int, config: ProxyConfig, instance_id: str | None,
                discover: list[DiscoverSpec] | None, autoscale: list[AutoscaleConfig] | None = None) -> int:
    """`--workers N`: the parent binds and supervises; each forked worker serves (proxy/workers.py),
    and the leader among them runs the autoscaler."""
    from proxy.workers import Supervisor, use_multiprocess_metrics

    def start_worker(ctx: WorkerContext) -> int:
        use_multiprocess_metrics(ctx.metrics_dir)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(config, autoscale, instance_id, discover, worker=ctx))
        return 0

    try:
        supervisor = Supervisor(workers, config.host, config.port, start_worker)
    except OSError as exc:
        return _fail(bind_error(config.host, config.port, exc))
    return supervisor.run(lambda url: print(listening_line(url, config, workers), flush=True))


def _fail(message: str) -> int:
    return fail("flotilla proxy", message)
