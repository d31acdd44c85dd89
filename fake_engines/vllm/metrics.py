"""vLLM's /metrics families, letter for letter as a vLLM 0.32 API server exposes them.

Names, help strings, label sets and bucket boundaries are copied from the captures of a real
vLLM (see docs/fidelity.md). Values are functions of engine state only: the live driver feeds a
`StepRecord` after every engine step and a `FinishedRecord` per finished request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST as METRICS_CONTENT_TYPE  # noqa: F401 (re-export)
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from fake_engines.vllm.http_metrics import HttpMetrics

ENGINE_LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                             50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to and including max_value (vLLM's build_1_2_5_buckets)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True)
class StepRecord:
    """What one engine step changed, as vLLM's SchedulerStats + IterationStats report it."""

    iteration_tokens: int
    """Tokens in the forward pass (prefill chunk tokens + one per decoding request)."""
    prompt_tokens: int
    """Prompt tokens of requests that produced their first token in this step (cached included)."""
    generation_tokens: int
    """Output tokens produced in this step."""
    ttfts_s: list[float] = field(default_factory=list)
    """Time to first token (from arrival) of each request whose first token came in this step."""
    itls_s: list[float] = field(default_factory=list)
    """Gap since the previous token for each request that produced a later token in this step."""
    preemptions: int = 0
    """Requests preempted (recompute) in this step."""
    prefix_queries_tokens: int = 0
    """Prompt tokens looked up in the prefix cache in this step."""
    prefix_hits_tokens: int = 0
    """Prompt tokens found in the prefix cache in this step."""
    external_queries_tokens: int = 0
    """P/D decode side: prompt tokens of requests admitted with KV to load from a prefill engine."""
    external_hits_tokens: int = 0
    """Of those, tokens whose KV was loaded (not computed, not a local hit)."""
    num_running: int = 0
    """Requests in the running set after the step."""
    num_waiting: int = 0
    """Requests waiting (preempted included) after the step."""
    kv_cache_usage: float = 0.0
    """Fraction of KV blocks referenced by live requests, 0..1."""


@dataclass(frozen=True)
class FinishedRecord:
    """Per-request figures vLLM observes once a request finishes (not on abort)."""

    finished_reason: str
    """stop, length, abort, error or repetition."""
    prompt_tokens: int
    """Prompt length in tokens."""
    generation_tokens: int
    """Output tokens produced."""
    max_tokens_param: int | None
    """The request's max_tokens, None when the client did not set it."""
    max_num_generation_tokens: int
    """The output budget the engine applied (max_tokens or what the context leaves)."""
    n_param: int | None
    """The request's n on its first sample; None on the other samples (observed once per request)."""
    e2e_s: float
    """Arrival to finish."""
    queue_s: float
    """Arrival to first scheduling."""
    prefill_s: float
    """First scheduling to first token."""
    decode_s: float
    """First token to last token."""
    num_preemptions: int
    """Times this request was preempted."""
    prefill_computed_tokens: int
    """Prompt tokens computed, cached ones excluded."""

    @property
    def inference_s(self) -> float:
        """Time in the RUNNING phase: prefill plus decode."""
        return self.prefill_s + self.decode_s

    @property
    def time_per_output_token_s(self) -> float:
        """Mean gap between output tokens, 0 for a single-token response."""
        if self.generation_tokens <= 1:
            return 0.0
        return self.decode_s / (self.generation_tokens - 1)


class VllmMetrics:
    """The vllm:* families on a private registry, after the process_* and python_* families."""

    def __init__(self, model_name: str, max_model_len: int, cache_config: dict[str, str],
                 max_loras: int | None = None, engines: tuple[str, ...] = ("0",)) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # vLLM's scrape starts with prometheus_client's default process and python families.
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        ProcessCollector(registry=self.registry)
        self.model_name = model_name
        self.engines = engines
        self.max_loras = max_loras
        self._build_engine_families()
        self._build_request_families(max_model_len)
        self._build_info_families(cache_config)
        self._precreate_series()
        self.http = HttpMetrics(self.registry)  # the instrumentator's families come last in vLLM's scrape

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, [*ENGINE_LABELS, *extra], registry=self.registry)

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, [*ENGINE_LABELS, *extra], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets) -> Histogram:
        return Histogram(name, doc, list(ENGINE_LABELS), buckets=buckets, registry=self.registry)

    def _build_engine_families(self) -> None:
        mfu = "(for Model Flops Utilization calculations)."
        self.flops = self._counter("vllm:estimated_flops_per_gpu",
                                   f"Estimated number of floating point operations per GPU {mfu}")
        self.read_bytes = self._counter("vllm:estimated_read_bytes_per_gpu",
                                        f"Estimated number of bytes read from memory per GPU {mfu}")
        self.write_bytes = self._counter("vllm:estimated_write_bytes_per_gpu",
                                         f"Estimated number of bytes written to memory per GPU {mfu}")
        self.running = self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = self._gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.", ("reason",))
        self.sleep_state = self._gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", ("sleep_state",))
        self.kv_usage = self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = self._counter("vllm:prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = self._counter("vllm:prefix_cache_hits",
                                         "Prefix cache hits, in terms of number of cached tokens.")
        cross = "from KV connector cross-instance cache sharing, in terms of number of"
        self.ext_queries = self._counter("vllm:external_prefix_cache_queries",
                                         f"External prefix cache queries {cross} queried tokens.")
        self.ext_hits = self._counter("vllm:external_prefix_cache_hits",
                                      f"External prefix cache hits {cross} cached tokens.")
        self.mm_queries = self._counter("vllm:mm_cache_queries",
                                        "Multi-modal cache queries, in terms of number of queried items.")
        self.mm_hits = self._counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = self._counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                              ("source",))
        self.prompt_cached = self._counter("vllm:prompt_tokens_cached",
                                           "Number of cached prompt tokens (local + external).")
        self.cached_by_source = self._counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", ("source",))
        self.generation_tokens = self._counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = self._counter("vllm:request_success", "Count of successfully processed requests.",
                                             ("finished_reason",))
        self.admission_rejections = Counter(
            "vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"], registry=self.registry)

    def _build_request_families(self, max_model_len: int) -> None:
        tokens = build_1_2_5_buckets(max_model_len)
        h = self._histogram
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.req_generation = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.iteration_tokens = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  ITERATION_TOKEN_BUCKETS)
        self.req_max_gen = h("vllm:request_max_num_generation_tokens",
                             "Histogram of maximum number of requested generation tokens.", tokens)
        self.req_n = h("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.req_max_tokens = h("vllm:request_params_max_tokens",
                                "Histogram of the max_tokens request parameter.", tokens)
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      TTFT_BUCKETS_S)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     ITL_BUCKETS_S)
        self.tpot = h("vllm:request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS_S)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     REQUEST_LATENCY_BUCKETS_S)
        phase = "Histogram of time spent in {} phase for request."
        self.queue = h("vllm:request_queue_time_seconds", phase.format("WAITING"), REQUEST_LATENCY_BUCKETS_S)
        self.inference = h("vllm:request_inference_time_seconds", phase.format("RUNNING"), REQUEST_LATENCY_BUCKETS_S)
        self.prefill = h("vllm:request_prefill_time_seconds", phase.format("PREFILL"), REQUEST_LATENCY_BUCKETS_S)
        self.decode = h("vllm:request_decode_time_seconds", phase.format("DECODE"), REQUEST_LATENCY_BUCKETS_S)
        self.req_preemptions = h("vllm:request_num_preemptions",
                                 "Histogram of the number of times a request was preempted.", PREEMPTION_BUCKETS)
        self.req_kv_computed = h("vllm:request_prefill_kv_computed_tokens",
                                 "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                 tokens)

    def _build_info_families(self, cache_config: dict[str, str]) -> None:
        names = sorted({*cache_config, "engine"})
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", names,
                     registry=self.registry)
        for engine in self.engines:
            info.labels(**{**cache_config, "engine": engine}).set(1)
        self.lora_info = None
        if self.max_loras is not None:
            self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                                   ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                                   registry=self.registry)

    def _lab(self, engine: str) -> dict[str, str]:
        return {"model_name": self.model_name, "engine": engine}

    def _precreate_series(self) -> None:
        # vLLM creates every labelled child at start-up, so scrapes show zeros before any traffic.
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            self.admission_rejections.labels(model_name=self.model_name, reason=reason)
        for engine in self.engines:
            self._precreate_engine(self._lab(engine))

    def _precreate_engine(self, lab: dict[str, str]) -> None:
        for family in (self.flops, self.read_bytes, self.write_bytes, self.running, self.waiting, self.kv_usage,
                       self.prefix_queries, self.prefix_hits, self.ext_queries, self.ext_hits, self.mm_queries,
                       self.mm_hits, self.preemptions, self.prompt_tokens, self.prompt_cached,
                       self.generation_tokens):
            family.labels(**lab)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**lab, reason=reason)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            self.sleep_state.labels(**lab, sleep_state=state).set(value)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_by_source.labels(**lab, source=source)
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            self.cached_by_source.labels(**lab, source=source)
        for reason in FINISHED_REASONS:
            self.request_success.labels(**lab, finished_reason=reason)
        for histogram in (self.req_prompt, self.req_generation, self.iteration_tokens, self.req_max_gen, self.req_n,
                          self.req_max_tokens, self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.inference,
                          self.prefill, self.decode, self.req_preemptions, self.req_kv_computed):
            histogram.labels(**lab)

    def record_step(self, step: StepRecord, engine: str = "0") -> None:
        """Apply one engine step: gauges are set, counters and per-step histograms advance."""
        lab = self._lab(engine)
        self.running.labels(**lab).set(step.num_running)
        self.waiting.labels(**lab).set(step.num_waiting)
        self.waiting_by_reason.labels(**lab, reason="capacity").set(step.num_waiting)
        self.kv_usage.labels(**lab).set(step.kv_cache_usage)
        if step.iteration_tokens > 0:
            self.iteration_tokens.labels(**lab).observe(step.iteration_tokens)
        self.prompt_tokens.labels(**lab).inc(step.prompt_tokens)
        self.generation_tokens.labels(**lab).inc(step.generation_tokens)
        self.preemptions.labels(**lab).inc(step.preemptions)
        self._record_prefix(lab, step.prefix_queries_tokens, step.prefix_hits_tokens, step.external_hits_tokens)
        if step.external_queries_tokens:  # the KV connector's lookups (vLLM's connector_prefix_cache_stats)
            self._record_external(lab, step.external_queries_tokens, step.external_hits_tokens)
        for ttft_s in step.ttfts_s:
            self.ttft.labels(**lab).observe(ttft_s)
        for itl_s in step.itls_s:
            self.itl.labels(**lab).observe(itl_s)

    def _record_prefix(self, lab: dict[str, str], queries: int, hits: int, external: int = 0) -> None:
        self.prefix_queries.labels(**lab).inc(queries)
        self.prefix_hits.labels(**lab).inc(hits)
        self.prompt_cached.labels(**lab).inc(hits)
        self.cached_by_source.labels(**lab, source="device").inc(hits)
        self.prompt_by_source.labels(**lab, source="local_cache_hit").inc(hits)
        self.prompt_by_source.labels(**lab, source="local_compute").inc(queries - hits - external)

    def _record_external(self, lab: dict[str, str], queries: int, hits: int) -> None:
        """Loaded tokens: external_kv_transfer (not local_compute) and cached (local + external)."""
        self.ext_queries.labels(**lab).inc(queries)
        self.ext_hits.labels(**lab).inc(hits)
        self.prompt_cached.labels(**lab).inc(hits)
        self.prompt_by_source.labels(**lab, source="external_kv_transfer").inc(hits)

    def record_finished(self, done: FinishedRecord, engine: str = "0") -> None:
        """Per-request histograms and request_success, observed once per finished request."""
        lab = self._lab(engine)
        self.request_success.labels(**lab, finished_reason=done.finished_reason).inc()
        self.req_prompt.labels(**lab).observe(done.prompt_tokens)
        self.req_generation.labels(**lab).observe(done.generation_tokens)
        if done.n_param is not None:
            self.req_max_gen.labels(**lab).observe(done.max_num_generation_tokens)
            self.req_n.labels(**lab).observe(done.n_param)
        if done.max_tokens_param is not None:
            self.req_max_tokens.labels(**lab).observe(done.max_tokens_param)
        self.tpot.labels(**lab).observe(done.time_per_output_token_s)
        self.e2e.labels(**lab).observe(done.e2e_s)
        self.queue.labels(**lab).observe(done.queue_s)
        self.inference.labels(**lab).observe(done.inference_s)
        self.prefill.labels(**lab).observe(done.prefill_s)
        self.decode.labels(**lab).observe(done.decode_s)
        self.req_preemptions.labels(**lab).observe(done.num_preemptions)
        self.req_kv_computed.labels(**lab).observe(done.prefill_computed_tokens)

    def record_lora(self, running: list[str], waiting: list[str], now_unix_s: float) -> None:
        """Stamp the series for this running/waiting adapter combination; old series stay (as in vLLM)."""
        if self.lora_info is None:
            return
        self.lora_info.labels(max_lora=str(self.max_loras), waiting_lora_adapters=",".join(waiting),
                              running_lora_adapters=",".join(running)).set(now_unix_s)

    def render(self) -> bytes:
        """The text exposition served on /metrics."""
        return generate_latest(self.registry)
