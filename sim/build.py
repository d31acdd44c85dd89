"""Turn a fleet (a fleet file's, or one engine group from `flotilla sim`'s flags) into simulated
replicas and jobs.

Nothing here models behaviour: every engine replica is built by the engine factory
(fake_engines.factory) from its group's command line, as `flotilla up` would start it: the real
engine core with the real perf model's step times. This module only wires them up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import LlamaCppScheduler, VllmScheduler
from fake_engines.factory import BuiltEngine, build_engine
from fake_engines.llamacpp.vocab import BOS_ID
from fake_engines.perf.batch import Layout
from flotilla.fleet import EngineGroup, Fleet
from loadgen.prompts import PromptBuilder
from loadgen.trace import TraceRequest
from policies.scaling import ScalingPolicy
from sim.autoscale import SimAutoscaler
from sim.fleet import JobFactory, ReplicaFactory
from sim.prompt_ids import prompt_token_ids
from sim.replicas import CoreReplica, FixedReplica, Listener, SimJob, stepwise_run_time

ENGINES = ("vllm", "llamacpp", "fixed")
SIXTEEN_BIT_GGUF = "BF16"
"""The GGUF a llama.cpp group without a quantisation serves: the catalogue's 16-bit weights."""


@dataclass(frozen=True)
class EngineSpec:
    """One replica's engine, as `fake-vllm serve` / `fake-llama-server` flags describe it: a thin
    constructor of an engine group (`group()`), kept for `flotilla sim`'s flags and callers in Python."""

    kind: str = "vllm"
    """`vllm`, `llamacpp` or `fixed` (one request at a time for the trace's service time)."""
    model: str = "llama-3.1-8b"
    """Catalogue model name."""
    gpu: str = "h100"
    """Catalogue GPU name."""
    layout: Layout = Layout()
    """Parallel layout of one replica (llama.cpp: pp GPUs split by layers, or tp by rows)."""
    scheduler: dict[str, Any] = field(default_factory=dict)
    """Engine config fields by name (e.g. max_num_seqs, block_size, n_parallel), given to the
    engine as its flags."""
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
        """The model file fake-llama-server would be given."""
        return f"{self.model}-{self.quant or SIXTEEN_BIT_GGUF}.gguf"

    def group(self, replicas: int = 1, seed: int = 0) -> EngineGroup:
        """The engine group of `replicas` of this engine, every one started with `--seed seed`."""
        if self.kind == "fixed":
            raise ValueError("fixed replicas are no engine group")
        return EngineGroup(flavor=self.kind, model=self.model, gpu=self.gpu, name=self.kind,
                           quant=self.quant or SIXTEEN_BIT_GGUF, tensor_parallel=self.layout.tp,
                           pipeline_parallel=self.layout.pp, replicas=replicas, min_replicas=replicas,
                           max_replicas=replicas, args=tuple(self._flags(seed)))

    def _flags(self, seed: int) -> list[str]:
        from fake_engines.factory import option_flags

        options: dict[str, Any] = {"seed": seed, "catalogue": self.catalogue_files}
        if self.kind == "vllm":
            options.update(link=self.layout.link, gpu_memory_utilization=self.gpu_memory_utilization,
                           num_gpu_blocks_override=self.num_gpu_blocks_override)
        else:
            options.update(_llama_split(self.layout))
        return option_flags(self.kind, {**options, **self.scheduler})


def _llama_split(layout: Layout) -> dict[str, Any]:
    """-tp / -pp of `flotilla sim` as llama-server splits: rows over tp GPUs, layers over pp."""
    if layout.tp > 1 and layout.pp > 1:
        raise ValueError("llama.cpp splits one way: -tp (by rows) or -pp (by layers), not both")
    gpus = max(layout.tp, layout.pp)
    if gpus == 1:
        return {}
    return {"tensor_split": [1.0] * gpus, "split_mode": "row" if layout.tp > 1 else "layer"}


def engine_replica(engine: BuiltEngine, index: int, listener: Listener) -> CoreReplica:
    """A simulated replica of a built engine: a fresh core, the engine's step times; decode runs
    need the fleet's event queue, to land mid-run reads on the right instant. A vLLM core
    publishes KV cache events to the listener's `on_kv_events` when the listener keeps a KV
    index (`kv_index`, FleetSim's for a policy that reads one); llama.cpp publishes none."""
    run_time = engine.decode_run_time or stepwise_run_time(engine.step_time)
    core = engine.new_core()
    sink = getattr(listener, "on_kv_events", None) if getattr(listener, "kv_index", None) is not None else None
    if sink is not None and isinstance(core, VllmScheduler):
        if not core.config.enable_kv_cache_events:
            core = VllmScheduler(dataclasses.replace(core.config, enable_kv_cache_events=True))
    else:
        sink = None
    # the loadgen sends text, before which llama-server puts BOS (fake_engines/llamacpp/vocab.py): the
    # simulated replica counts it too, so live and simulated prompt_tokens agree
    text_prefix = (BOS_ID,) if isinstance(core, LlamaCppScheduler) else ()
    return CoreReplica(index, core, engine.step_time, listener, queue=getattr(listener, "queue", None),
                       decode_run_time=run_time, kv_events=sink, text_prefix=text_prefix)


def describe(group: EngineGroup, engine: BuiltEngine) -> dict[str, Any]:
    """A replica as `meta.engines` lists it: its group, flavor and resolved engine config."""
    return {"group": group.name, "flavor": group.flavor, "config": engine.describe()}


@dataclass(frozen=True)
class FleetReplicas:
    """The replicas of a simulated fleet, in the order a proxy lists them, with their capacity
    weights; replicas an autoscaler adds past `count` are copies of the scaled group."""

    make_replica: ReplicaFactory
    count: int
    """Replicas at the start."""
    weights: tuple[float, ...]
    """`BackendView.weight` of replica i < count."""
    describe: Callable[[int], dict[str, Any]] = lambda index: {}
    """Replica i's `meta.engines` entry."""
    fleet: Fleet | None = None
    """The fleet they come from, for its autoscaler."""
    scaled_weight: float = 1.0
    """Weight of a replica added by scaling."""
    scaled_cold_start_s: float | None = None
    """Launch to ready of a replica added by scaling, as its engine models it."""
    gpus: Callable[[int], int] = lambda index: 1
    """GPUs replica i holds (tensor x pipeline parallel), for GPU-seconds."""

    def scaling_policy(self, spec: str | None) -> ScalingPolicy:
        """The scaling policy `spec` (None: the fleet file's) with the fleet file's autoscaler
        settings (interval_s, ...), bounded by the scaled group's min and max."""
        if self.fleet is None:
            raise ValueError("a scaling policy needs a fleet")
        section, group = self.fleet.autoscaled()
        return section.scaling_policy(group, spec)

    @property
    def first_scaled(self) -> int:
        """Index of the first replica of the scaled group: the ones before belong to fixed groups."""
        return self.count - self.fleet.autoscaled()[1].replicas if self.fleet is not None else 0


def fleet_replicas(fleet: Fleet) -> FleetReplicas:
    """The engines of `fleet` as `flotilla up` starts them (Fleet.started: the fixed groups'
    replicas in file order, then the scaled group's), each built by the engine factory from its
    group's command line, so a replica's config is what that engine prints with --print-config."""
    members = fleet.started()
    engines = {g.name: build_engine(g.engine_config()) for g in fleet.engines}
    scaled = fleet.autoscaled()[1]

    def group_of(index: int) -> EngineGroup:
        return members[index] if index < len(members) else scaled

    def make(index: int, listener: Listener) -> CoreReplica:
        return engine_replica(engines[group_of(index).name], index, listener)

    return FleetReplicas(make, len(members), tuple(g.capacity_weight() for g in members),
                         lambda index: describe(group_of(index), engines[group_of(index).name]), fleet,
                         scaled.capacity_weight(), engines[scaled.name].spec.cold_start_s,
                         lambda index: group_of(index).tensor_parallel * group_of(index).pipeline_parallel)


up_fleet_replicas = fleet_replicas
"""The name `flotilla sim --fleet` used before the fleet model; kept for callers."""


def replica_factory(spec: EngineSpec, seed: int = 0) -> ReplicaFactory:
    """Replicas of `spec` (every one the same engine, `--seed seed`); fixed replicas for `fixed`."""
    if spec.kind == "fixed":
        return FixedReplica
    return fleet_replicas(Fleet(engines=(spec.group(seed=seed),))).make_replica


def engine_replicas(spec: EngineSpec, replicas: int, seed: int = 0) -> FleetReplicas:
    """`replicas` copies of `spec`'s engine, a one-group fleet (fixed replicas for `fixed`)."""
    if spec.kind == "fixed":
        return FleetReplicas(FixedReplica, replicas, (), lambda index: {"group": "fixed", "flavor": "fixed",
                                                                         "config": {}},
                             gpus=lambda index: spec.layout.tp * spec.layout.pp)
    return dataclasses.replace(fleet_replicas(Fleet(engines=(spec.group(replicas, seed),))), fleet=None)


def cold_start_s(spec: EngineSpec, startup_s: float = 20.0, warmup_s: float = 40.0,
                 load_gbps: float = 3.0) -> float:
    """Launch-to-ready seconds of one replica: the seed's Example 17 rule (startup, weights over
    the load bandwidth, warm-up) with its local-NVMe defaults; 60 s for fixed replicas."""
    if spec.kind == "fixed":
        return startup_s + warmup_s
    from fake_engines.factory.catalogue import catalogue_of
    from fake_engines.factory.gguf import load_model
    from fake_engines.perf.coldstart import cold_start_s as perf_cold_start_s

    if spec.quant is not None:
        weight_bytes = float(load_model(spec.gguf_name, spec.catalogue_files).size_bytes)
    else:
        weight_bytes = catalogue_of(spec.catalogue_files).model(spec.model).weight_bytes(16)
    return float(perf_cold_start_s(weight_bytes, load_gbps, startup_s, warmup_s))


def simulated_autoscaler(replicas: FleetReplicas, policy: str, cold_start: float | None,
                         spec: EngineSpec) -> SimAutoscaler:
    """The autoscaler of a simulated run: the scaling policy `policy`, new replicas ready
    `cold_start` seconds after launch (default: the engine's own modelled cold start for a fleet
    file, the seed's Example 17 rule otherwise); only the scaled group's replicas are its own."""
    from policies.scaling import create_policy

    if replicas.fleet is None:
        start_s = cold_start if cold_start is not None else cold_start_s(spec)
        capacity = None if spec.kind == "fixed" else replica_capacity(spec.group().engine_config())
        return SimAutoscaler(create_policy(policy), cold_start_s=start_s, capacity_rps=capacity)
    start_s = cold_start if cold_start is not None else replicas.scaled_cold_start_s or 0.0
    return SimAutoscaler(replicas.scaling_policy(policy), cold_start_s=start_s, first_index=replicas.first_scaled,
                         capacity_rps=replica_capacity(replicas.fleet.autoscaled()[1].engine_config()))


def replica_capacity(config: Any) -> Callable[[int, int], float]:
    """Requests per second a replica of `config` completes at (prompt, output) tokens, as the
    capacity model counts them; lengths are rounded to 64 tokens (8 for outputs) and remembered."""
    import functools

    from fake_engines.capacity import capacity_rps

    @functools.lru_cache(maxsize=4096)
    def rounded(prompt: int, output: int) -> float:
        return capacity_rps(config, max(64, prompt), max(8, output))

    return lambda prompt, output: rounded(64 * round(prompt / 64), 8 * round(output / 8))


def job_factory(spec: EngineSpec | None = None, builder: PromptBuilder | None = None,
                fixed: bool = False) -> JobFactory:
    """SimJobs from trace requests; engine replicas get the prompt's real token ids."""
    builder = builder or PromptBuilder()
    fixed = fixed or (spec is not None and spec.kind == "fixed")

    def make(req: TraceRequest, index: int) -> SimJob:
        job = SimJob(index=index, arrival_s=req.timestamp_s, output_len=max(1, req.output_length),
                     service_time_s=req.service_time_s or 0.0, lora=req.lora)
        if fixed:
            return job
        if type(builder) is PromptBuilder:  # the ids its text encodes to, without the text
            job.prompt_token_ids = prompt_token_ids(req, index, builder.namespace)
        else:
            from fake_engines.core import encode

            job.prompt_token_ids = encode(builder.build(req, index))
        return job

    return make
