"""Turn a run description (engine kind, model, GPU, layout, scheduler flags) into replicas and jobs.

Nothing here models behaviour: vLLM and llama.cpp replicas are the real engine cores with the
real perf model's step times; this module only wires them up.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import (
    LlamaCppScheduler,
    LlamaCppSchedulerConfig,
    VllmScheduler,
    VllmSchedulerConfig,
    encode,
)
from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import load_catalogue
from loadgen.prompts import PromptBuilder
from loadgen.trace import TraceRequest
from sim.fleet import JobFactory, ReplicaFactory
from sim.prompt_ids import prompt_token_ids
from sim.replicas import CoreReplica, FixedReplica, Listener, SimJob, stepwise_run_time

ENGINES = ("vllm", "llamacpp", "fixed")


@dataclass(frozen=True)
class EngineSpec:
    """One replica's engine, as `fake-vllm serve` / `fake-llama-server` flags describe it."""

    kind: str = "vllm"
    """`vllm`, `llamacpp` or `fixed` (one request at a time for the trace's service time)."""
    model: str = "llama-3.1-8b"
    """Catalogue model name."""
    gpu: str = "h100"
    """Catalogue GPU name."""
    layout: Layout = Layout()
    """Parallel layout of one replica."""
    scheduler: dict[str, Any] = field(default_factory=dict)
    """Scheduler flags by config field name (e.g. max_num_seqs, block_size, n_parallel)."""
    num_gpu_blocks_override: int | None = None
    """vLLM: KV blocks instead of the capacity model's figure."""
    gpu_memory_utilization: float = 0.9
    """vLLM: share of GPU memory the engine may use."""
    catalogue_files: tuple[str, ...] = ()
    """Extra catalogue YAML files."""
    quant: str | None = None
    """llama.cpp: the GGUF quantisation of `model` (Q4_K_M, Q8_0, F16, ...), sized and timed as
    fake-llama-server serves `<model>-<quant>.gguf`; None keeps the catalogue's 16-bit weights."""

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.kind!r}")
        if self.quant is not None and self.kind != "llamacpp":
            raise ValueError(f"a GGUF quantisation ({self.quant}) applies to the llamacpp engine only")

    @property
    def gguf_name(self) -> str:
        """The model file fake-llama-server would be given (`quant` set)."""
        return f"{self.model}-{self.quant}.gguf"


SIM_HASH_ALGO = "builtin"
"""The simulator's default `prefix_caching_hash_algo`: which blocks hit depends only on which
keys are equal, and a 64-bit key hashes about twice as fast as sha256."""


def replica_factory(spec: EngineSpec, seed: int = 0) -> ReplicaFactory:
    if spec.kind == "fixed":
        return FixedReplica
    if spec.quant is not None:
        return _gguf_replica_factory(spec, seed)
    from fake_engines.perf.step_time import decode_run_array_s, step_time_s

    cat = load_catalogue(spec.catalogue_files)
    model, gpu = cat.model(spec.model), cat.gpu(spec.gpu)
    link = cat.link(spec.layout.link)
    step_time = functools.partial(step_time_s, model, gpu, layout=spec.layout, link=link)
    run_time = functools.partial(decode_run_array_s, model, gpu, layout=spec.layout, link=link)

    def make(index: int, listener: Listener) -> CoreReplica:
        if spec.kind == "vllm":
            block_size = int(spec.scheduler.get("block_size", 16))
            blocks = spec.num_gpu_blocks_override or _kv_cache_blocks(
                model, gpu, spec.layout, gpu_memory_utilization=spec.gpu_memory_utilization,
                block_size=block_size)
            # every hash stays in this process, so the faster key changes nothing observable
            flags = {"prefix_caching_hash_algo": SIM_HASH_ALGO, **spec.scheduler}
            cfg = VllmSchedulerConfig(num_gpu_blocks=blocks, max_concurrent_batches=spec.layout.pp,
                                      seed=seed + index, **flags)
            core: Any = VllmScheduler(cfg)
        else:
            core = LlamaCppScheduler(LlamaCppSchedulerConfig(seed=seed + index, **spec.scheduler))
        # decode runs need the fleet's event queue, to land mid-run reads on the right instant
        return CoreReplica(index, core, step_time, listener, queue=getattr(listener, "queue", None),
                           decode_run_time=run_time)

    return make


def _gguf_replica_factory(spec: EngineSpec, seed: int) -> ReplicaFactory:
    """llama.cpp replicas of a GGUF file, built as fake-llama-server builds them: the same
    layer placement, core and step-time model."""
    from fake_engines.llamacpp import engine
    from fake_engines.llamacpp.config import LlamaServerConfig
    from fake_engines.llamacpp.model import load_model

    model = load_model(spec.gguf_name)

    def make(index: int, listener: Listener) -> CoreReplica:
        config = LlamaServerConfig(model=spec.gguf_name, gpu=spec.gpu, seed=seed + index, **spec.scheduler)
        step_time = engine.step_time_fn(engine.size_engine(config, model))
        return CoreReplica(index, engine.build_scheduler(config, model), step_time, listener,
                           queue=getattr(listener, "queue", None), decode_run_time=stepwise_run_time(step_time))

    return make


def cold_start_s(spec: EngineSpec, startup_s: float = 20.0, warmup_s: float = 40.0,
                 load_gbps: float = 3.0) -> float:
    """Launch-to-ready seconds of one replica: the seed's Example 17 rule (startup, weights over
    the load bandwidth, warm-up) with its local-NVMe defaults; 60 s for fixed replicas."""
    if spec.kind == "fixed":
        return startup_s + warmup_s
    from fake_engines.perf.coldstart import cold_start_s as perf_cold_start_s

    if spec.quant is not None:
        from fake_engines.llamacpp.model import load_model
        weight_bytes = load_model(spec.gguf_name).size_bytes
    else:
        weight_bytes = load_catalogue(spec.catalogue_files).model(spec.model).weight_bytes(16)
    return float(perf_cold_start_s(weight_bytes, load_gbps, startup_s, warmup_s))


def _kv_cache_blocks(*args: Any, **kwargs: Any) -> int:
    from fake_engines.perf.kv_cache import kv_cache_blocks

    return int(kv_cache_blocks(*args, **kwargs))


def job_factory(spec: EngineSpec, builder: PromptBuilder | None = None) -> JobFactory:
    """SimJobs from trace requests; engine replicas get the prompt's real token ids."""
    builder = builder or PromptBuilder()

    def make(req: TraceRequest, index: int) -> SimJob:
        job = SimJob(index=index, arrival_s=req.timestamp_s, output_len=max(1, req.output_length),
                     service_time_s=req.service_time_s or 0.0, lora=req.lora)
        if spec.kind == "fixed":
            return job
        if type(builder) is PromptBuilder:  # the ids its text encodes to, without the text
            job.prompt_token_ids = prompt_token_ids(req, index, builder.namespace)
        else:
            job.prompt_token_ids = encode(builder.build(req, index))
        return job

    return make


@dataclass(frozen=True)
class FleetReplicas:
    """Unlike replicas in the order a proxy lists them, with their capacity weights."""

    make_replica: ReplicaFactory
    count: int
    weights: tuple[float, ...]
    """`BackendView.weight` of replica i."""


def up_fleet_replicas(fleet: Any, seed: int = 0) -> FleetReplicas:
    """The engines `flotilla up` starts for `fleet` (a proxy.fleetfile.UpFleet), each built from
    the very command line it would run: the fixed groups' replicas in file order, which the proxy
    lists first, then the `replicas` of the group its autoscaler owns (started with the proxy,
    listed after). The autoscaler itself is not simulated: the fleet stays this size."""
    from fake_engines.capacity import engine_config

    scaled = fleet.scaled_group()
    groups = [g for g in fleet.engines if g is not scaled] + ([scaled] if scaled is not None else [])
    members = [g for g in groups for _ in range(g.replicas)]
    configs = [engine_config(g.command(port=0, seed=seed + i)) for i, g in enumerate(members)]

    def make(index: int, listener: Listener) -> CoreReplica:
        return config_replica(configs[index], index, listener)

    return FleetReplicas(make, len(members), tuple(g.capacity_weight() for g in members))


def config_replica(config: Any, index: int, listener: Listener) -> CoreReplica:
    """A replica of one look-alike engine config (VllmServeConfig or LlamaServerConfig), built
    as the engine builds itself; vLLM keys its prefix blocks with SIM_HASH_ALGO."""
    from fake_engines.vllm.config import VllmServeConfig

    queue = getattr(listener, "queue", None)
    if isinstance(config, VllmServeConfig):
        from fake_engines.vllm import engine as vllm

        config = dataclasses.replace(config, prefix_caching_hash_algo=SIM_HASH_ALGO)
        sized = vllm.size_engine(config)
        step_time = vllm.step_time_fn(config, sized)
        core: Any = vllm.build_scheduler(config, sized)
    else:
        from fake_engines.llamacpp import engine as llama
        from fake_engines.llamacpp.model import load_model

        model = load_model(config.model)
        step_time = llama.step_time_fn(llama.size_engine(config, model))
        core = llama.build_scheduler(config, model)
    return CoreReplica(index, core, step_time, listener, queue=queue, decode_run_time=stepwise_run_time(step_time))
