"""llama-server's router mode: started without -m, it lists models and runs one instance per model.

What clients observe follows llama.cpp's server_models / server_models_routes
(tools/server/server-models.cpp of the imitated build): GET /models with each model's status,
POST /models/load and /models/unload, autoload on a request naming a model (unless
--no-models-autoload), --models-max with least-recently-used eviction and a FIFO queue of
requests waiting for a slot, /props with role "router", requests proxied to the model's instance.

The real router spawns a child llama-server per model; the look-alike starts each instance in
process, as a fake llama-server on its own ephemeral port built through the engine factory like
any other (`start_llama`), and proxies over HTTP to it, so the router's own routes, statuses and
timings are what a client sees. Every model runs as the catalogue model of --router-child-model
(nothing is downloaded). LLAMA_SERVER_DEBUG_FAKE_TIMING (set by llama.cpp's tests) adds the real
router's 2 s pause before each load and before each proxied request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
from aiohttp import web

from fake_engines.driver.serving import json_body
from fake_engines.llamacpp import model_sources, sleep, stream_sessions
from fake_engines.llamacpp.config import BUILD_INFO
from fake_engines.llamacpp.errors import LlamaError, parse_json
from fake_engines.llamacpp.model_sources import ModelSource

if TYPE_CHECKING:
    from fake_engines.llamacpp.server import RunningLlama

DEFAULT_CHILD_MODEL = "llama-3.2-1b-Q8_0.gguf"
DEFAULT_STOP_TIMEOUT_S = 10.0
FAKE_TIMING_S = 2.0
WAIT_POLL_S = 0.2
STREAM_LOOKUP_TIMEOUT_S = 2.0
RUNNING = ("loading", "loaded", "sleeping")
ROUTER_VALUE_FLAGS = ("--models-dir", "--models-preset", "--models-max", "--router-child-model", "--port",
                      "--host", "--api-key", "--api-key-file", "--alias", "-a", "--tags")
ROUTER_BARE_FLAGS = ("--models-autoload", "--no-models-autoload")
"""Flags of the router itself: not passed on to the instances (unset_reserved_args, update_args)."""

PROXY_POST = frozenset({
    "/props", "/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
    "/v1/chat/completions/control", "/v1/responses", "/responses", "/v1/audio/transcriptions",
    "/audio/transcriptions", "/v1/messages", "/v1/messages/count_tokens", "/infill", "/embedding", "/embeddings",
    "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/tokenize", "/detokenize",
    "/apply-template", "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/responses/input_tokens", "/v1/responses/input_tokens", "/lora-adapters"})
"""POST routes the router forwards to the instance the body's `model` names (server.cpp)."""
PROXY_GET = frozenset({"/metrics", "/lora-adapters", "/slots"})
"""GET routes forwarded to the instance the `model` query parameter names."""
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
                         "host", "server", "access-control-allow-origin", "upgrade"})


def add_router_flags(parser: argparse.ArgumentParser) -> None:
    """The router's own flags (llama-server's spellings) and the look-alike's choice of child model."""
    group = parser.add_argument_group("router mode (no -m)")
    group.add_argument("--models-dir", default=None, help="directory containing models for the router server")
    group.add_argument("--models-preset", default=None, help="path to INI file containing model presets")
    group.add_argument("--models-max", type=int, default=4,
                       help="for router server, maximum number of models to load simultaneously (0 = unlimited)")
    group.add_argument("--models-autoload", dest="models_autoload", action="store_true", default=True,
                       help="for router server, automatically load models (default)")
    group.add_argument("--no-models-autoload", dest="models_autoload", action="store_false",
                       help="for router server, do not load a model a request names")
    group.add_argument("--router-child-model", default=DEFAULT_CHILD_MODEL, metavar="FNAME",
                       help="look-alike: the catalogue model every router instance runs")


@dataclass
class RouterSettings:
    """How the router was started."""

    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int = 4
    autoload: bool = True
    child_argv: list[str] = field(default_factory=list)
    """Flags every instance gets (the router's own, less ROUTER_*_FLAGS)."""
    child_model: str = DEFAULT_CHILD_MODEL
    fake_timing: bool = False
    """LLAMA_SERVER_DEBUG_FAKE_TIMING: 2 s before each load and each proxied request."""


def settings_from_args(args: argparse.Namespace, argv: list[str]) -> RouterSettings:
    """Router settings from the parsed flags and the raw command line (for the instances' flags)."""
    return RouterSettings(models_dir=args.models_dir, models_preset=args.models_preset, models_max=args.models_max,
                          autoload=args.models_autoload, child_argv=child_flags(argv),
                          child_model=args.router_child_model,
                          fake_timing=bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")))


def child_flags(argv: list[str]) -> list[str]:
    """argv without the router-only flags (both `--flag value` and `--flag=value`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ROUTER_BARE_FLAGS or (name in ROUTER_VALUE_FLAGS and "=" in arg):
            continue
        if name in ROUTER_VALUE_FLAGS:
            skip = True
            continue
        out.append(arg)
    return out


PRESET_ONLY = frozenset({"model", "m", "hf-repo", "hf", "hfr", "hf-file", "hff", "alias", "a", "tags",
                         "load-on-startup", "dedup-cache-models", "stop-timeout", "spec-draft-hf", "hf-repo-draft",
                         "host", "port"})
"""Preset keys that name the model or steer the router, not flags of the instance."""


def preset_flags(options: dict[str, str], parser: argparse.ArgumentParser) -> list[str]:
    """A preset's options as command-line flags (`ctx-size = 256` is `--ctx-size 256`, `jinja = true`
    is `--jinja`); keys that are no flag of the server are left out."""
    known = parser._option_string_actions  # argparse has no public view of its spellings
    out: list[str] = []
    for key, value in options.items():
        if key in PRESET_ONLY:
            continue
        flag = next((f for f in (f"--{key}", f"-{key}") if f in known), None)
        if flag is None:
            continue
        if known[flag].nargs == 0:
            if value.strip().lower() in ("1", "true", "on", "yes", "enabled", ""):
                out.append(flag)
        else:
            out += [flag, value]
    return out


@dataclass
class Instance:
    """One model's state in the router (server_model_meta plus its instance)."""

    source: ModelSource
    status: str = "unloaded"
    running: RunningLlama | None = None
    """The in-process fake llama-server while loading or loaded."""
    last_used: float = 0.0
    req_count: int = 0
    stopping: bool = False
    exit_code: int = 0
    task: asyncio.Task | None = None
    loaded_info: dict = field(default_factory=dict)
    """The instance's own /v1/models card once loaded (the child's get_model_info), merged into GET /models."""

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def is_running(self) -> bool:
        return self.status in RUNNING

    @property
    def port(self) -> int:
        return self.running.port if self.running is not None else 0


@dataclass
class QueueEntry:
    """Requests waiting for a model that has no slot yet (server_lru_sched::entry_t)."""

    model: str
    waiters: int = 1
    loading: bool = False


class Router:
    """The models, their instances and the queue for --models-max slots."""

    def __init__(self, settings: RouterSettings, sources: list[ModelSource]) -> None:
        self.settings = settings
        self.instances: dict[str, Instance] = {}
        self.queue: list[QueueEntry] = []
        self.subscribers: set[asyncio.Queue] = set()
        self.conv_models: dict[str, tuple[str, int]] = {}
        self.next_ticket = 0
        self._changed = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._add(sources)

    # --- the model list -------------------------------------------------------------------------

    def _add(self, sources: list[ModelSource]) -> None:
        for source in sources:
            self.instances[source.name] = Instance(source)

    def find(self, name: str) -> Instance | None:
        """By name or alias."""
        if name in self.instances:
            return self.instances[name]
        return next((i for i in self.instances.values() if name in i.source.aliases), None)

    async def reload(self) -> None:
        """GET /models?reload=1: read the sources again; models removed or changed are unloaded."""
        fresh = {s.name: s for s in self.read_sources(self.settings)}
        for inst in list(self.instances.values()):
            new = fresh.get(inst.name)
            if inst.is_running and (new is None or new.options != inst.source.options):
                await self.unload(inst.name)
                await self.wait_for(inst.name, lambda i: not i.is_running)
        for name in [n for n in self.instances if n not in fresh and not self.instances[n].is_running]:
            del self.instances[name]
        for name, source in fresh.items():
            if name in self.instances:
                self.instances[name].source = source
                self.instances[name].exit_code = 0
            else:
                self.instances[name] = Instance(source)
        self.notify_sse("models_reload", "*")

    @staticmethod
    def read_sources(settings: RouterSettings) -> list[ModelSource]:
        return model_sources.load_all(settings.models_dir, settings.models_preset)

    def remember_conv(self, conv_id: str, name: str) -> int:
        """Which model serves a conversation (X-Conversation-Id), with a ticket a stop invalidates."""
        self.next_ticket += 1
        self.conv_models[conv_id] = (name, self.next_ticket)
        return self.next_ticket

    # --- events -----------------------------------------------------------------------------------

    def changed(self) -> None:
        """Wake everything waiting on a status (the C++ condition variable's notify_all)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float = WAIT_POLL_S) -> None:
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    async def wait_for(self, name: str, predicate) -> None:
        while (inst := self.instances.get(name)) is not None and not predicate(inst):
            await self.wait_change()

    def notify_sse(self, event: str, model: str, data: dict | None = None) -> None:
        payload: dict = {"model": model, "event": event}
        if data is not None:
            payload["data"] = data
        for queue in self.subscribers:
            queue.put_nowait(payload)

    def set_status(self, inst: Instance, status: str) -> None:
        inst.status = status
        if status == "unloaded":
            inst.stopping = False
        self.notify_sse("model_status", inst.name, {"status": status})
        self.changed()

    # --- capacity and the queue (server_lru_sched) --------------------------------------------------

    def count_running(self) -> int:
        return sum(i.is_running for i in self.instances.values())

    def has_capacity(self) -> bool:
        return self.settings.models_max <= 0 or self.count_running() < self.settings.models_max

    def _queued(self, name: str) -> QueueEntry | None:
        return next((e for e in self.queue if e.model == name), None)

    def pick_victim(self) -> str | None:
        """The least recently used idle model nobody waits for."""
        idle = [i for i in self.instances.values()
                if i.req_count == 0 and i.status in ("loaded", "sleeping") and not i.stopping
                and self._queued(i.name) is None]
        return min(idle, key=lambda i: i.last_used).name if idle else None

    def join(self, name: str) -> None:
        entry = self._queued(name)
        if entry is not None:
            entry.waiters += 1
        else:
            self.queue.append(QueueEntry(name))

    def leave(self, name: str) -> None:
        entry = self._queued(name)
        if entry is not None:
            entry.waiters -= 1
            if entry.waiters <= 0:
                self.queue.remove(entry)

    def try_claim(self, name: str) -> bool:
        if not self.queue or self.queue[0].model != name or self.queue[0].loading or not self.has_capacity():
            return False
        self.queue[0].loading = True
        return True

    def claim_done(self, name: str, ok: bool) -> None:
        entry = self._queued(name)
        if entry is not None and not ok:
            entry.loading = False

    def tick(self) -> None:
        """Stop idle models until the queue's models have slots (server_lru_sched::tick)."""
        if self.settings.models_max <= 0 or not self.queue:
            return
        running = [i for i in self.instances.values() if i.is_running]
        n_stopping = sum(i.stopping for i in running)
        n_needed = sum(not e.loading for e in self.queue)
        n_claimed = sum(e.loading and e.model in self.instances and not self.instances[e.model].is_running
                        for e in self.queue)
        n_free = self.settings.models_max - len(running) + n_stopping - n_claimed
        while n_free < n_needed:
            victim = self.pick_victim()
            if victim is None:
                return  # every remaining model is busy: a request ending calls tick again
            self.request_stop(victim)
            n_free += 1

    # --- instances ----------------------------------------------------------------------------------

    async def unload_lru(self) -> None:
        if self.settings.models_max <= 0 or self.has_capacity():
            return
        victim = self.pick_victim()
        if victim is not None:
            await self.unload(victim)
            await self.wait_for(victim, lambda i: i.status == "unloaded")

    async def load(self, name: str) -> None:
        """Start the instance of `name` (returns once it is loading, not loaded)."""
        if self.settings.fake_timing:
            await asyncio.sleep(FAKE_TIMING_S)
        if name not in self.instances:
            raise LlamaError(500, f"model name={name} is not found")
        await self.unload_lru()
        inst = self.instances[name]
        if inst.status != "unloaded":
            return
        if self.settings.models_max > 0 and self.count_running() >= self.settings.models_max:
            raise LlamaError(500, "model limit reached, try again later")
        inst.last_used = time.monotonic()
        inst.exit_code = 0
        self.set_status(inst, "loading")
        inst.task = asyncio.get_running_loop().create_task(self._run(inst))

    def instance_config(self, inst: Instance):
        """The instance's flags: the model's preset options, the router's own flags over them (as the
        real router merges its command line into every preset), then its file and name (update_args)."""
        from fake_engines.llamacpp.cli import build_parser, config_from_args

        parser = build_parser()
        argv = [*preset_flags(inst.source.options, parser), *self.settings.child_argv, "-m", self.settings.child_model,
                "--alias", inst.name, "--host", "127.0.0.1", "--port", "0"]
        return config_from_args(parser.parse_args(argv))

    async def _run(self, inst: Instance) -> None:
        from fake_engines.llamacpp.server import start_llama

        try:
            running = await start_llama(self.instance_config(inst))
            inst.running = running
            await running.ready.wait()
        except asyncio.CancelledError:
            raise
        except Exception:  # the instance failed to start: its model shows failed, as an exited child
            inst.running = None
            inst.exit_code = 1
            self.set_status(inst, "unloaded")
            return
        if inst.status == "loading":
            inst.loaded_info = await self._model_info(running.port)
            self.set_status(inst, "loaded")

    async def _model_info(self, port: int) -> dict:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
            async with self.session().get(f"http://127.0.0.1:{port}/v1/models",
                                          timeout=aiohttp.ClientTimeout(total=STREAM_LOOKUP_TIMEOUT_S)) as resp:
                return dict((await resp.json())["data"][0])
        return {}

    def request_stop(self, name: str) -> None:
        inst = self.instances.get(name)
        if inst is None or inst.stopping:
            return
        inst.stopping = True
        self.changed()
        asyncio.get_running_loop().create_task(self._stop(inst))

    async def _stop(self, inst: Instance) -> None:
        running, task = inst.running, inst.task
        if task is not None and not task.done():
            task.cancel()  # still loading: force-killed, as the real router does
        if running is not None:
            try:
                await asyncio.wait_for(running.drain_and_close(), DEFAULT_STOP_TIMEOUT_S)
            except TimeoutError:
                await running.close()
        inst.running, inst.task, inst.loaded_info = None, None, {}
        self.set_status(inst, "unloaded")
        self.tick()

    async def unload(self, name: str) -> None:
        inst = self.instances.get(name)
        if inst is not None and inst.is_running:
            self.request_stop(name)

    async def unload_all(self) -> None:
        """Shutdown: SSE listeners are let go, every instance stopped."""
        for queue in self.subscribers:
            queue.put_nowait(None)
        for inst in self.instances.values():
            if inst.is_running:
                self.request_stop(inst.name)
        while any(i.is_running for i in self.instances.values()):
            await self.wait_change()
        if self._session is not None:
            await self._session.close()

    async def ensure_ready(self, name: str) -> bool:
        """Wait until `name` serves, loading it when its turn in the queue comes; True when it waited.

        A client leaving cancels this coroutine: it leaves the queue and the slot goes to the next."""
        inst = self.instances[name]
        if not inst.stopping and inst.status in ("loaded", "sleeping"):
            return False
        queued = did_load = saw_loading = False
        if inst.status == "unloaded":
            self.join(name)
            self.tick()
            queued = True
        try:
            while (current := self.instances.get(name)) is not None:
                if current.stopping:
                    if not queued:
                        self.join(name)
                        self.tick()
                        queued = True
                    await self.wait_change()
                    continue
                if current.status in ("loaded", "sleeping"):
                    break
                if current.status == "loading":
                    saw_loading = True
                elif current.status == "unloaded":
                    if did_load or saw_loading:
                        if current.exit_code:
                            raise LlamaError(500, f"model name={name} failed to load")
                        break
                    if not queued:
                        break
                if current.status == "unloaded" and self.try_claim(name):
                    ok = True
                    try:
                        await asyncio.shield(self.load(name))
                        did_load = True
                    except LlamaError:
                        ok = False  # lost a race for the slot: stay in line
                    self.claim_done(name, ok)
                    self.tick()
                    continue
                await self.wait_change()
        except BaseException:
            if queued:
                self.leave(name)
            self.tick()
            raise
        if queued:
            self.leave(name)
        return True

    # --- proxying ---------------------------------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                                  auto_decompress=False)
        return self._session

    async def proxy(self, request: web.Request, name: str, body: bytes, update_last_used: bool,
                    path: str | None = None) -> web.StreamResponse:
        """Forward the request to the instance and stream its answer back."""
        inst = self.instances.get(name)
        if inst is None:
            raise LlamaError(500, f"model name={name} is not found")
        if not inst.is_running or inst.running is None:
            raise LlamaError(400, f"model name={name} is not running")
        if update_last_used:
            inst.last_used = time.monotonic()
        inst.req_count += 1
        try:
            if self.settings.fake_timing:
                await asyncio.sleep(FAKE_TIMING_S)  # after req_count++: the model counts as busy meanwhile
            return await self.forward(request, inst, body, path or request.path_qs)
        finally:
            inst.req_count -= 1
            if inst.req_count == 0:
                self.tick()
            self.changed()

    async def forward(self, request: web.Request, inst: Instance, body: bytes, path: str) -> web.StreamResponse:
        """Send the request to the instance and stream its answer back; a client leaving closes the
        connection to the instance (a stream session there goes on without it)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = f"http://127.0.0.1:{inst.port}{path}"
        try:
            async with self.session().request(request.method, url, data=body or None, headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
                with contextlib.suppress(ConnectionResetError):
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            raise LlamaError(500, f"failed to forward the request to model {inst.name}: {exc}") from None


ROUTER_KEY = web.AppKey("llama_router", Router)


# --- handlers -------------------------------------------------------------------------------------

def validate_model(router: Router, name: str, autoload: bool) -> str:
    """The canonical name of the model a request names (router_validate_model)."""
    if not name:
        raise LlamaError(400, "model name is missing from the request")
    inst = router.find(name)
    if inst is None:
        raise LlamaError(400, f"model '{name}' not found")
    if not autoload and not inst.is_running:
        raise LlamaError(400, "model is not loaded")
    return inst.name


def _model_field(body: dict) -> str:
    value = body.get("model")
    return value if isinstance(value, str) else ""


def is_autoload(router: Router, request: web.Request) -> bool:
    value = request.query.get("autoload", "")
    return router.settings.autoload if not value else value in ("true", "1")


async def proxy_get(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    autoload = is_autoload(router, request)
    name = validate_model(router, request.query.get("model", ""), autoload)
    if autoload:
        await router.ensure_ready(name)
    return await router.proxy(request, name, b"", update_last_used=False)


async def proxy_post(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    raw = await request.read()
    body = parse_json(raw)
    autoload = is_autoload(router, request)
    name = validate_model(router, _model_field(body), autoload)
    conv_id = request.headers.get(stream_sessions.HEADER, "")
    if not conv_id:
        if autoload:
            await router.ensure_ready(name)  # a client leaving cancels the wait and its place in the queue
        return await router.proxy(request, name, raw, update_last_used=True)
    # remembered before the load wait, so a stop while the model loads cancels this request; a
    # session request outlives its client (only a stop ends it), so it runs shielded
    ticket = router.remember_conv(conv_id, name)
    task = asyncio.get_running_loop().create_task(_session_post(request, router, name, raw, autoload, conv_id, ticket))
    return await asyncio.shield(task)


async def _session_post(request: web.Request, router: Router, name: str, raw: bytes, autoload: bool,
                        conv_id: str, ticket: int) -> web.StreamResponse:
    if autoload:
        await router.ensure_ready(name)
    if router.conv_models.get(conv_id, ("", 0))[1] != ticket:
        raise LlamaError(400, "request cancelled by a stop while the model was loading")
    return await router.proxy(request, name, raw, update_last_used=True)


def _stream_owner(router: Router, conv_id: str) -> Instance | None:
    """The loaded instance that serves a conversation (resolve_child_for_conv)."""
    tracked = router.conv_models.get(conv_id)
    inst = router.instances.get(tracked[0]) if tracked else None
    return inst if inst is not None and inst.status == "loaded" and inst.running is not None else None


async def stream_get(request: web.Request) -> web.StreamResponse:
    """GET /v1/stream through the router: to the instance that owns the conversation."""
    router = request.app[ROUTER_KEY]
    conv_id = stream_sessions.conv_id_of(request)
    owner = _stream_owner(router, conv_id)
    if owner is None:
        tracked = router.conv_models.get(conv_id)
        inst = router.instances.get(tracked[0]) if tracked else None
        if inst is not None and inst.status in ("loading", "downloading", "downloaded"):
            raise LlamaError(503, "Stream owner model is loading, retry later")
        raise LlamaError(404, "Stream not found or expired")
    path = f"/v1/stream?conv_id={quote(conv_id, safe='')}"
    if request.query.get("from"):
        path += f"&from={request.query['from']}"
    return await router.forward(request, owner, b"", path)


async def stream_delete(request: web.Request) -> web.Response:
    """DELETE /v1/stream through the router: the owner stops it; a request still waiting for the load is cancelled."""
    router = request.app[ROUTER_KEY]
    conv_id = stream_sessions.conv_id_of(request)
    owner = _stream_owner(router, conv_id)
    if owner is not None:
        url = f"http://127.0.0.1:{owner.port}/v1/stream?conv_id={quote(conv_id, safe='')}"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with router.session().delete(url, timeout=aiohttp.ClientTimeout(total=STREAM_LOOKUP_TIMEOUT_S)):
                pass
    router.conv_models.pop(conv_id, None)
    router.changed()
    return web.Response(status=204, content_type="application/json")


async def stream_lookup(request: web.Request) -> web.Response:
    """POST /v1/streams/lookup through the router: asks only the instances that own the ids."""
    router = request.app[ROUTER_KEY]
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        return json_body([])
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    per_port: dict[int, list[str]] = {}
    for cid in ids if isinstance(ids, list) else []:
        owner = _stream_owner(router, cid) if isinstance(cid, str) and cid else None
        if owner is not None:
            per_port.setdefault(owner.port, []).append(cid)
    rows: list = []
    for port, wanted in per_port.items():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with router.session().post(f"http://127.0.0.1:{port}/v1/streams/lookup",
                                             json={"conversation_ids": wanted},
                                             timeout=aiohttp.ClientTimeout(total=STREAM_LOOKUP_TIMEOUT_S)) as resp:
                found = await resp.json(content_type=None) if resp.status == 200 else []
                rows += [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []
    return json_body(rows)


async def router_props(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    if request.query.get("model"):
        return await proxy_get(request)
    return json_body({
        "role": "router", "max_instances": router.settings.models_max,
        "models_autoload": router.settings.autoload, "model_alias": "llama-server", "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0}, "ui_settings": {}, "build_info": BUILD_INFO,
        "cors_proxy_enabled": False})


def _status_value(inst: Instance) -> str:
    """The status GET /models reports: a loaded instance asleep (--sleep-idle-seconds) is `sleeping`."""
    if inst.status == "loaded" and inst.running is not None and sleep.is_sleeping(inst.running.app):
        return "sleeping"
    return inst.status


def _model_card(inst: Instance, created: int) -> dict:
    status: dict = {"value": _status_value(inst), "args": _instance_args(inst)}
    if inst.source.source == model_sources.SOURCE_PRESET:
        status["preset"] = inst.source.to_ini()
    if inst.exit_code:
        status.update(exit_code=inst.exit_code, failed=True)
    card = {"id": inst.name, "aliases": inst.source.aliases, "tags": inst.source.tags, "object": "model",
            "owned_by": "llamacpp", "created": created, "status": status,
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": inst.source.source, "can_remove": inst.source.source == model_sources.SOURCE_CACHE}
    extra = inst.loaded_info if inst.is_running else {}
    return {**card, **{k: v for k, v in extra.items() if k not in card}}


def _instance_args(inst: Instance) -> list[str]:
    return ["fake-llama-server", "--host", "127.0.0.1", "--port", str(inst.port), "--alias", inst.name]


async def router_models(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    if request.query.get("reload"):
        try:
            await router.reload()
        except model_sources.PresetError as exc:
            raise LlamaError(500, str(exc)) from None
    created = int(time.time())
    data = [_model_card(i, created) for i in router.instances.values() if not i.source.hidden]
    return json_body({"data": data, "object": "list"})


async def models_load(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    body = parse_json(await request.read())
    inst = router.find(_model_field(body))
    if inst is None:
        raise LlamaError(404, "model is not found")
    if inst.is_running:
        raise LlamaError(400, "model is already running")
    await router.load(inst.name)
    return json_body({"success": True})


async def models_unload(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    body = parse_json(await request.read())
    inst = router.find(_model_field(body))
    if inst is None:
        raise LlamaError(400, "model is not found")
    if not inst.is_running:
        raise LlamaError(400, "model is not running")
    await router.unload(inst.name)
    return json_body({"success": True})


async def models_download(request: web.Request) -> web.Response:
    body = parse_json(await request.read())
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise LlamaError(400, "model must be a non-empty string")
    # the real router fetches the repo's metadata from the hub first; there is no hub here
    raise LlamaError(500, f"failed to fetch metadata of '{name}': the look-alike cannot download models")


async def models_delete(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    name = request.query.get("model", "")
    if not name:
        raise LlamaError(400, "model must be a non-empty string")
    inst = router.instances.get(name)
    if inst is None:
        raise LlamaError(500, f"model name={name} is not found")
    if inst.source.source != model_sources.SOURCE_CACHE:
        raise LlamaError(500, f"model name={name} is not removable (not from cache)")
    await router.unload(name)
    await router.wait_for(name, lambda i: i.status == "unloaded")
    model_sources.remove_download(name)
    router.instances.pop(name, None)
    router.notify_sse("model_remove", name, {})
    return json_body({"success": True})


async def models_sse(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    queue: asyncio.Queue = asyncio.Queue()
    router.subscribers.add(queue)
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    try:
        await response.prepare(request)
        while (event := await queue.get()) is not None:
            await response.write(f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode())
    except ConnectionResetError:
        pass
    finally:
        router.subscribers.discard(queue)
    return response


def _route(request: web.Request):
    """The router's handler for a request, or None when the single-model app's handler serves it."""
    path, method = request.path, request.method
    if method == "GET":
        if path == "/props":
            return router_props
        if path in ("/models", "/v1/models"):
            return router_models
        if path == "/models/sse":
            return models_sse
        if path in PROXY_GET:
            return proxy_get
    if method == "POST":
        special = {"/models": models_download, "/models/load": models_load, "/models/unload": models_unload}
        if path in special:
            return special[path]
        if path in PROXY_POST or path.startswith("/slots/"):
            return proxy_post
    if method == "DELETE" and path == "/models":
        return models_delete
    return {("GET", "/v1/stream"): stream_get, ("DELETE", "/v1/stream"): stream_delete,
            ("POST", "/v1/streams/lookup"): stream_lookup}.get((method, path))


@web.middleware
async def dispatch(request: web.Request, handler):
    """Innermost middleware of a router-mode app: the router's routes take over the model routes."""
    own = _route(request)
    return await (own(request) if own is not None else handler(request))


def install(app: web.Application, router: Router) -> None:
    """Make a fake llama-server app a router (its health, error and key middlewares stay)."""
    app[ROUTER_KEY] = router
    if stream_sessions.keep_sessions in app.middlewares:  # the router keeps no streams: its instances do
        app.middlewares.remove(stream_sessions.keep_sessions)
    app.middlewares.append(dispatch)

    async def stop_instances(app: web.Application) -> None:
        await router.unload_all()

    app.on_shutdown.append(stop_instances)



async def start_router(config, settings: RouterSettings):
    """Listen at once as a router: /health answers, models load on demand."""
    from fake_engines.llamacpp.server import start_llama

    sources = Router.read_sources(settings)
    startup = [s.name for s in sources if model_sources.load_on_startup(s)]
    if settings.models_max > 0 and len(startup) > settings.models_max:
        raise model_sources.PresetError(f"number of models to load on startup ({len(startup)}) exceeds "
                                        f"models_max ({settings.models_max})")
    router = Router(settings, sources)
    running = await start_llama(config, cold_start=False, setup=lambda app: install(app, router))
    for name in startup:
        await router.load(name)
    return running
