"""vLLM 0.32's NixlConnector (pull mode) as the look-alike plays it: disaggregated prefill/decode.

A request's `kv_transfer_params` say which part an engine plays (vllm/distributed/kv_transfer/
kv_connector/v1/nixl/pull_scheduler.py):

- prefill (`do_remote_decode: true`): the request runs as usual (the proxy sends max_tokens 1);
  when it finishes its KV blocks stay allocated and the response's `kv_transfer_params` tell a
  decode engine where to read them (`request_finished`). The blocks are freed when the decode
  engine's read completes, or when the lease (`kv_lease_duration`, 30 s) runs out.
- decode (`do_remote_prefill: true` with `remote_block_ids`, `remote_engine_id`, ...): the engine
  pulls the prompt's blocks it does not hold (`get_num_new_matched_tokens`), the request waits
  in WAITING_FOR_REMOTE_KVS for the modelled transfer (fake_engines/perf/kv_transfer.py), then
  recomputes only the last prompt token and decodes.

NIXL's side channel (handshake and completion notifications, a ZMQ socket on
VLLM_NIXL_SIDE_CHANNEL_PORT in vLLM) is two HTTP routes on the look-alike's own port; the bytes
themselves do not move, their time is modelled. docs/pd.md lists what else differs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import Counter, Histogram

from fake_engines.core import EngineRequest
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.factory.vllm_config import KVTransferConfig
from fake_engines.factory.vllm_engine import kv_dtype_bytes_of
from fake_engines.perf.kv_transfer import KvTransfer, blocks_to_pull, kv_block_bytes_per_gpu, kv_transfer
from fake_engines.vllm.app import EngineUnit, VllmServer
from fake_engines.vllm.errors import VllmError
from fake_engines.vllm.metrics import ENGINE_LABELS, VllmMetrics

log = logging.getLogger("fake_engines.vllm.nixl")

READ_PATH = "/_nixl/read"
"""Side channel: a decode engine starts reading a request's blocks (404: not held)."""
DONE_PATH = "/_nixl/done"
"""Side channel: the read finished; the prefill engine frees the blocks."""
SIDE_CHANNEL_TIMEOUT_S = 5.0
REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


def wants_remote_decode(params: dict | None) -> bool:
    """Prefill side: the proxy asks this engine to compute the prompt for another to decode."""
    return bool(params) and bool(params.get("do_remote_decode"))  # type: ignore[union-attr]


def wants_remote_prefill(params: dict | None) -> bool:
    """Decode side: the prompt's KV is to be read from the engine the params name (vLLM ignores
    params without the remote fields, with a warning, and computes the prompt itself)."""
    return (bool(params) and bool(params.get("do_remote_prefill"))  # type: ignore[union-attr]
            and bool(params.get("remote_block_ids"))  # type: ignore[union-attr]
            and all(params.get(name) is not None for name in REMOTE_FIELDS))  # type: ignore[union-attr]


class NixlMetrics:
    """The vllm:nixl_* families vLLM 0.32 exports with the NixlConnector (nixl/stats.py), names,
    help and buckets as there."""

    def __init__(self, metrics: VllmMetrics) -> None:
        reg, labels = metrics.registry, list(ENGINE_LABELS)
        times = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds",
                                   "Histogram of transfer duration for NIXL KV Cache transfers.", labels,
                                   buckets=times, registry=reg)
        self.bytes_transferred = Histogram("vllm:nixl_bytes_transferred",
                                           "Histogram of bytes transferred per NIXL KV Cache transfers.", labels,
                                           buckets=[2 ** (10 + i) for i in range(1, 25, 2)], registry=reg)
        self.failed_transfers = Counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers, including handshake and notification failures. NOTE: KV "
            "expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.", labels, registry=reg)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs",
                               "Number of requests that had their KV expire. NOTE: This metric is tracked on the "
                               "P instance.", labels, registry=reg)
        for engine in metrics.engines:
            lab = {"model_name": metrics.model_name, "engine": engine}
            for family in (self.xfer_time, self.bytes_transferred, self.failed_transfers, self.expired):
                family.labels(**lab)
        self.model_name = metrics.model_name


@dataclass
class Held:
    """A finished prefill request's blocks, waiting for a read."""

    unit: EngineUnit
    """The data-parallel engine holding them."""
    lease: asyncio.TimerHandle
    """Frees them when it fires."""


@dataclass
class NixlConnector:
    """One look-alike engine's connector: its held blocks (prefill side) and its reads (decode side)."""

    server: VllmServer
    config: KVTransferConfig
    metrics: NixlMetrics
    held: dict[str, Held] = field(default_factory=dict)
    """Prefill side: request id -> its held blocks."""
    session: aiohttp.ClientSession | None = None

    # ---- prefill side -------------------------------------------------------------------
    def hold(self, unit: EngineUnit, request_id: str, port: int) -> dict | None:
        """A finished prefill request: start its lease and answer the params a decode engine
        needs (`request_finished`); None when it holds no blocks (it was aborted). `port`: the
        HTTP port the request came in on, which serves the side channel."""
        core = unit.driver.core
        block_ids = core.transfer_block_ids(request_id)  # type: ignore[attr-defined]
        if not block_ids:
            return None
        scale = self.server.config.time_scale
        lease = asyncio.get_running_loop().call_later(self.config.kv_lease_s * scale, self._expire, request_id)
        self.held[request_id] = Held(unit, lease)
        request_tokens = self._held_tokens(unit, request_id)
        config = self.server.config
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [block_ids],
                "remote_engine_id": self.config.engine_id, "remote_request_id": request_id,
                "remote_host": self.side_channel_host(), "remote_port": port,
                "tp_size": config.tensor_parallel_size, "dcp_size": 1, "pp_size": config.pipeline_parallel_size,
                "remote_num_tokens": request_tokens, "remote_blocks_expiry_time": None, "transfer_mode": "pull"}

    @staticmethod
    def _held_tokens(unit: EngineUnit, request_id: str) -> int:
        request = unit.driver.core.held_for_transfer[request_id]  # type: ignore[attr-defined]
        return int(request.num_computed_tokens)

    def side_channel_host(self) -> str:
        """VLLM_NIXL_SIDE_CHANNEL_HOST as vLLM reads it, else the address the look-alike binds."""
        host = self.server.config.host
        default = "localhost" if host in ("", "0.0.0.0", "::") else host
        return os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", default)

    def _expire(self, request_id: str) -> None:
        held = self.held.pop(request_id, None)
        if held is None:
            return
        held.unit.driver.core.release_transfer_hold(request_id)  # type: ignore[attr-defined]
        held.unit.telemetry.refresh()
        self.metrics.expired.labels(model_name=self.metrics.model_name, engine=held.unit.telemetry.engine).inc()
        log.warning("KV blocks of %s expired after %.0f s without a read", request_id, self.config.kv_lease_s)

    def start_read(self, request_id: str) -> bool:
        """A decode engine reads: the blocks stay until it says done, or another lease runs out
        (vLLM's decode engine heartbeats while it waits)."""
        held = self.held.get(request_id)
        if held is None:
            return False
        held.lease.cancel()
        scale = self.server.config.time_scale
        held.lease = asyncio.get_running_loop().call_later(self.config.kv_lease_s * scale, self._expire, request_id)
        return True

    def read_done(self, request_id: str) -> bool:
        """The read completed: free the blocks now."""
        held = self.held.pop(request_id, None)
        if held is None:
            return False
        held.lease.cancel()
        held.unit.driver.core.release_transfer_hold(request_id)  # type: ignore[attr-defined]
        held.unit.telemetry.refresh()
        return True

    def close(self) -> None:
        """Cancel every lease (the server stops)."""
        for held in self.held.values():
            held.lease.cancel()
        self.held.clear()

    # ---- decode side --------------------------------------------------------------------
    def transfer_of(self, unit: EngineUnit, request: EngineRequest) -> KvTransfer:
        """The modelled pull of `request`'s prompt blocks this engine does not hold."""
        config, spec = self.server.config, self.server.spec
        hits = unit.driver.core.num_local_hit_tokens(request)  # type: ignore[attr-defined]
        block = config.resolved_block_size
        link = catalogue_of(config.catalogue).link(config.kv_link)
        size = kv_block_bytes_per_gpu(spec.model, spec.layout, kv_dtype_bytes_of(config), block)
        return kv_transfer(blocks_to_pull(request.num_prompt_tokens, hits, block), size, link)

    async def pull(self, unit: EngineUnit, request: EngineRequest, params: dict) -> None:
        """Read `request`'s prompt KV from the prefill engine `params` name; the request was
        submitted waiting for it. A failed read follows kv_load_failure_policy: recompute the
        prompt here, or fail the request (VllmError)."""
        rid = request.request_id
        lab = {"model_name": self.metrics.model_name, "engine": unit.telemetry.engine}
        arrival_s = unit.driver.now_s()
        if not await self._side_channel(params, READ_PATH):
            self.metrics.failed_transfers.labels(**lab).inc()
            if self.config.kv_load_failure_policy == "fail":
                unit.driver.abort(rid)
                raise VllmError(500, f"KV transfer from engine {params.get('remote_engine_id')} failed for "
                                f"request {rid}", "InternalServerError")
            request.remote_prefill = False  # recompute: the prompt is computed here
            unit.driver.finish_remote_kv_load_after(rid, 0.0)
            return
        transfer = self.transfer_of(unit, request)
        self.metrics.xfer_time.labels(**lab).observe(transfer.seconds)
        self.metrics.bytes_transferred.labels(**lab).observe(transfer.bytes_per_gpu)
        remaining_s = arrival_s + transfer.seconds - unit.driver.now_s()
        def done() -> None:  # the read's completion notification to the prefill engine
            asyncio.ensure_future(self._side_channel(params, DONE_PATH))

        unit.driver.finish_remote_kv_load_after(rid, remaining_s, done)

    async def _side_channel(self, params: dict, path: str) -> bool:
        """POST the remote request id to the prefill engine's side channel; False when it is
        unreachable or no longer holds the blocks."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SIDE_CHANNEL_TIMEOUT_S))
        url = f"http://{params['remote_host']}:{params['remote_port']}{path}"
        body = {"engine_id": params["remote_engine_id"], "request_id": params["remote_request_id"]}
        try:
            async with self.session.post(url, json=body) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("NIXL side channel %s: %s", url, exc)
            return False


NIXL_KEY = web.AppKey("nixl_connector", NixlConnector)


def install(app: web.Application, server: VllmServer) -> NixlConnector | None:
    """With --kv-transfer-config naming a connector and role: the connector, its side channel
    routes and metrics; None otherwise (kv_transfer_params are then ignored, as vLLM does)."""
    config = server.config.kv_transfer_config
    if config is None or not config.is_kv_transfer_instance:
        return None
    connector = NixlConnector(server, config, NixlMetrics(server.metrics))
    app[NIXL_KEY] = connector
    app.router.add_post(READ_PATH, _read)
    app.router.add_post(DONE_PATH, _done)
    app.on_cleanup.append(_close)
    return connector


async def _close(app: web.Application) -> None:
    connector = app[NIXL_KEY]
    connector.close()
    if connector.session is not None:
        await connector.session.close()


async def _side_channel_request(request: web.Request) -> tuple[NixlConnector, str]:
    connector = request.app[NIXL_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest() from None
    if not isinstance(body, dict) or body.get("engine_id") != connector.config.engine_id:
        raise web.HTTPNotFound()
    return connector, str(body.get("request_id"))


async def _read(request: web.Request) -> web.Response:
    connector, rid = await _side_channel_request(request)
    return web.json_response({"ok": True}) if connector.start_read(rid) else web.json_response({"ok": False}, status=404)


async def _done(request: web.Request) -> web.Response:
    connector, rid = await _side_channel_request(request)
    return web.json_response({"ok": True}) if connector.read_done(rid) else web.json_response({"ok": False}, status=404)

