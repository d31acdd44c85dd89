"""The backend pool: each backend's declared spec, live state, load signals and accounting.

The pool is plain state; the scraper, the health checker, the admin API and the request path
update it, and `views()` turns it into the snapshot a routing policy decides on. Router-side
in-flight accounting is added to every scraped load signal, so a burst picked between two
scrapes is seen by every decision that follows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from policies.routing.base import BackendState, BackendView
from proxy.breaker import CircuitBreaker, CircuitState, Outcome
from proxy.config import BackendSpec, BreakerConfig, redact_url
from proxy.engine_metrics import LoadSample
from proxy.records import Reservation

if TYPE_CHECKING:
    from proxy.shared_load import SharedLoad

AGE_RESOLUTION_S = 0.01
"""Metrics ages in cached views are exact to this; policies judge staleness in tenths of seconds."""

# Python 3.11's EnumType has a __getattr__, which sends every read of `BackendState.READY` through
# a slow lookup (about 75 ns, against 9 for a module name): the request path reads these.
_READY, _EJECTED, _DRAINING = BackendState.READY, BackendState.EJECTED, BackendState.DRAINING


@dataclass(eq=False)
class Backend:
    spec: BackendSpec
    breaker: CircuitBreaker
    source: str = "static"
    """static (command line), file (fleet file), admin (added through the admin API), autoscaler
    or k8s:SERVICE (a pod found through its Service, proxy/discovery.py)."""
    state: BackendState = BackendState.STARTING
    ever_ready: bool = False
    discovered_models: frozenset[str] = frozenset()
    adapters: frozenset[str] = frozenset()
    """LoRA adapters listed by the backend's /v1/models (cards with a parent)."""
    model_cards: tuple[dict, ...] = ()
    """The backend's /v1/models cards, for the union the proxy serves."""
    in_flight: int = 0
    in_flight_tokens: int = 0
    unseen: dict[int, list[int]] = field(default_factory=dict)
    """scrape epoch -> [requests, tokens] outstanding and picked in that epoch, for every epoch
    no scrape has answered since: the engine's own counters do not include them yet."""
    prefill_tokens: float = 0.0
    """Prompt tokens minus cached tokens of every request this backend answered."""
    sample: LoadSample | None = None
    sample_time_s: float | None = None
    scrape_epoch: int = 0
    """Bumped when a scrape is sent; requests picked later carry the new epoch."""
    shared: SharedLoad | None = None
    """With `flotilla proxy --workers N`: the other workers' in-flight work (proxy/workers.py)."""
    shared_slot: int = -1
    _models_key: tuple = field(default=(), repr=False)
    _models: frozenset[str] = field(default=frozenset(), repr=False)
    _view_key: tuple = field(default=(), repr=False)
    _view: BackendView | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def auth_headers(self) -> dict[str, str]:
        """Headers carrying the backend's own credentials, for probes and scrapes (empty without)."""
        authorization = self.spec.authorization
        return {"Authorization": authorization} if authorization is not None else {}

    def unseen_work(self) -> tuple[int, int]:
        """Requests and reserved tokens picked since the last scrape was sent (one pass for both:
        a view is built per request)."""
        requests = tokens = 0
        for r, t in self.unseen.values():
            requests += r
            tokens += t
        return requests, tokens

    @property
    def unseen_requests(self) -> int:
        return self.unseen_work()[0]

    @property
    def unseen_tokens(self) -> int:
        return self.unseen_work()[1]

    @property
    def models(self) -> frozenset[str]:
        key = (self.spec.models, self.discovered_models, self.adapters)
        if key != self._models_key:  # identity-cheap: the parts are replaced, never mutated
            self._models_key, self._models = key, frozenset(self.spec.models) | self.discovered_models | self.adapters
        return self._models

    def is_routable(self, now_s: float) -> bool:
        if self.state is _READY:
            return True
        return self.state is _EJECTED and self.breaker.allows_request(now_s)

    def total_in_flight(self) -> tuple[int, int]:
        """Requests and reserved tokens in flight to this backend from every worker (this one
        alone without --workers)."""
        if self.shared is None:
            return self.in_flight, self.in_flight_tokens
        requests, tokens = self.shared.peers(self.shared_slot)
        return self.in_flight + requests, self.in_flight_tokens + tokens

    def publish_in_flight(self) -> None:
        if self.shared is not None:
            self.shared.publish(self.shared_slot, self.in_flight, self.in_flight_tokens)

    def view(self, index: int, now_s: float, models: frozenset[str] | None = None) -> BackendView:
        """This backend as policies see it. A view is rebuilt only when something in it changed
        (metrics age counts in AGE_RESOLUTION_S steps): a request changes one backend, not all."""
        unseen_requests, unseen_tokens = self.unseen_work()
        in_flight, in_flight_tokens = self.total_in_flight()
        models = self.models if models is None else models  # `models`: the caller's reading of it
        key = (index, self.state, self.spec, models, in_flight, in_flight_tokens, self.prefill_tokens,
               unseen_requests, unseen_tokens, self.sample, self.sample_time_s, int(now_s / AGE_RESOLUTION_S))
        view = self._view
        if key != self._view_key or view is None:
            view = self._build_view(index, now_s, models, unseen_requests, unseen_tokens, in_flight,
                                    in_flight_tokens)
            self._view_key, self._view = key, view
        return view

    def _build_view(self, index: int, now_s: float, models: frozenset[str], unseen_requests: int,
                    unseen_tokens: int, in_flight: int, in_flight_tokens: int) -> BackendView:
        s = self.sample
        capacity = s.cache_capacity_tokens if s else None
        kv = s.kv_cache_usage if s else None
        if kv is not None and capacity:
            kv = min(1.0, kv + unseen_tokens / capacity)
        return BackendView(
            index=index, url=self.url, state=self.state, weight=self.spec.weight, models=models,
            in_flight=in_flight, in_flight_tokens=in_flight_tokens,
            prefill_tokens=self.prefill_tokens,
            num_requests_running=s.num_requests_running if s else None,
            num_requests_waiting=(s.num_requests_waiting or 0.0) + unseen_requests
            if s and s.num_requests_waiting is not None else None,
            kv_cache_usage=kv, cache_capacity_tokens=capacity,
            lora_adapters=s.lora_adapters if s else frozenset(),
            metrics=s.metrics if s else {},
            metrics_age_s=now_s - self.sample_time_s if self.sample_time_s is not None else None,
        )


@dataclass
class BackendPool:
    breaker_config: BreakerConfig = field(default_factory=BreakerConfig)
    backends: list[Backend] = field(default_factory=list)
    shared: SharedLoad | None = None
    """With `flotilla proxy --workers N`: where each backend's in-flight work is shared."""
    generation: int = 0
    """Bumped whenever a backend leaves, so policies indexed by position can reset."""

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.backends)

    def __len__(self) -> int:
        return len(self.backends)

    def find(self, url: str) -> Backend | None:
        url = redact_url(url).rstrip("/")  # backends are named without their credentials
        return next((b for b in self.backends if b.url == url), None)

    def add(self, spec: BackendSpec, source: str = "static") -> Backend:
        existing = self.find(spec.url)
        if existing is not None:
            existing.spec, existing.source = spec, source
            if existing.state is BackendState.DRAINING:
                existing.state = BackendState.READY if existing.ever_ready else BackendState.STARTING
            return existing
        backend = Backend(spec=spec, breaker=CircuitBreaker(self.breaker_config), source=source)
        if self.shared is not None:
            backend.shared, backend.shared_slot = self.shared, self.shared.slot_of(backend.url)
        self.backends.append(backend)
        return backend

    def share(self, shared: SharedLoad) -> None:
        """Count in-flight work in `shared` too, and read the other workers' there."""
        self.shared = shared
        for b in self.backends:
            b.shared, b.shared_slot = shared, shared.slot_of(b.url)
            b.publish_in_flight()

    def drain(self, url: str) -> Backend | None:
        """Stop routing to `url`; it leaves the pool once its last request finished."""
        backend = self.find(url)
        if backend is not None:
            backend.state = BackendState.DRAINING
            self.remove_drained()
        return backend

    def remove_drained(self) -> None:
        keep = [b for b in self.backends if not (b.state is BackendState.DRAINING and b.in_flight == 0)]
        if len(keep) != len(self.backends):
            self.backends = keep
            self.generation += 1

    def views(self, now_s: float, model: str | None = None) -> list[BackendView]:
        """Routable backends that serve `model` (or have not said what they serve), as policies see them."""
        views = []
        for i, b in enumerate(self.backends):
            serves = b.models
            if b.is_routable(now_s) and (model is None or not serves or model in serves):
                views.append(b.view(i, now_s, serves))
        return views

    def is_unknown_model(self, model: str) -> bool:
        """True when every backend has said what it serves and none serves `model`."""
        any_live = False
        for b in self.backends:
            if b.state is _DRAINING:
                continue
            serves = b.models
            if not serves or model in serves:
                return False
            any_live = True
        return any_live

    def has_adapter(self, name: str) -> bool:
        """Some backend lists `name` as a LoRA adapter."""
        for b in self.backends:  # a loop, not any(): no generator made per request
            if name in b.adapters:
                return True
        return False

    def model_label(self, model: str | None) -> str:
        """`model` as a metric label: names no backend declares become "other", so clients
        cannot grow the label set without bound."""
        if not model:
            return ""
        for b in self.backends:  # a loop, not any(): no generator made per request
            if model in b.models:
                return model
        return "other"

    def reserve(self, backend: Backend, tokens: int) -> Reservation:
        backend.in_flight += 1
        backend.in_flight_tokens += tokens
        bucket = backend.unseen.setdefault(backend.scrape_epoch, [0, 0])
        bucket[0] += 1
        bucket[1] += tokens
        backend.publish_in_flight()
        if backend.state is _EJECTED:
            backend.breaker.start_probe()
        return Reservation(backend=backend, tokens=tokens, scrape_epoch=backend.scrape_epoch)

    def release(self, r: Reservation) -> None:
        if r.released:
            return
        r.released = True
        b = r.backend
        b.in_flight -= 1
        b.in_flight_tokens -= r.tokens
        b.publish_in_flight()
        bucket = b.unseen.get(r.scrape_epoch)
        if bucket is not None:
            bucket[0] -= 1
            bucket[1] -= r.tokens
            if bucket[0] == 0 and r.scrape_epoch != b.scrape_epoch:
                del b.unseen[r.scrape_epoch]
        if b.state is _DRAINING and b.in_flight == 0:
            self.remove_drained()

    def begin_scrape(self, backend: Backend) -> int:
        """A scrape is being sent; returns its epoch for `record_scrape`."""
        backend.scrape_epoch += 1
        return backend.scrape_epoch

    def record_scrape(self, backend: Backend, sample: LoadSample | None, epoch: int, sent_at_s: float) -> None:
        """The scrape of `epoch`, sent at `sent_at_s`, came back (`sample` None when it failed)."""
        if sample is None:
            return
        backend.sample, backend.sample_time_s = sample, sent_at_s
        # Requests picked before the scrape was sent are in the engine's counters now.
        for old in [e for e in backend.unseen if e < epoch]:
            del backend.unseen[old]

    def record_success(self, backend: Backend) -> bool:
        """A request or probe succeeded; True when this closed the backend's circuit."""
        closed = backend.breaker.record_success()
        if closed and backend.state is _EJECTED:
            backend.state = BackendState.READY
        return closed

    def record(self, backend: Backend, outcome: Outcome, now_s: float) -> bool:
        """Count one request's outcome; True when it ejected the backend."""
        if outcome is Outcome.FAILURE:
            return self.record_failure(backend, now_s)
        if outcome is Outcome.SUCCESS:
            self.record_success(backend)
        else:
            backend.breaker.record_neutral()
        return False

    def record_failure(self, backend: Backend, now_s: float) -> bool:
        """A request or probe failed; True when this ejected the backend."""
        opened = backend.breaker.record_failure(now_s)
        if backend.breaker.state is CircuitState.OPEN and backend.state is BackendState.READY:
            backend.state = BackendState.EJECTED
        return opened
