"""Colocated against disaggregated prefill/decode, analytically: the model behind `flotilla plan pd`.

Every figure comes from the engine's own sizing and step-time model (the engine factory), for
one request shape (prompt and output tokens) and two SLOs (TTFT, TPOT); pure and clock-free.

- A prefill replica computes prompts back to back, as many per step as the token budget holds.
  Its arrivals queue (M/D/1: mean wait rho S / 2(1 - rho)); it takes the load at which the
  mean TTFT (queue + prefill + KV transfer + the first decode step) meets the TTFT SLO.
- A decode replica runs the largest batch whose step meets the TPOT SLO and whose KV fits;
  a request holds a batch slot for its output tokens. Its KV link caps the pulls it can take
  (bytes per request over the link's bandwidth, at most 90% busy).
- A colocated replica shares its time: prefill takes rho_p = rate x prefill seconds per
  request, so decode steps come 1 / (1 - rho_p) times apart (DistServe's interference) and the
  batch is what Little's law gives at that TPOT.

The fleet of `gpus` splits into p prefill and d decode replicas; its goodput is the smaller
of the pools' (DistServe's and Splitwise's provisioning rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fake_engines.factory import BuiltEngine
from fake_engines.factory.vllm_engine import VllmEngineSpec, kv_dtype_bytes_of
from fake_engines.perf.batch import StepBatch
from fake_engines.perf.catalogue import LinkSpec
from fake_engines.perf.kv_transfer import blocks_to_pull, kv_block_bytes_per_gpu, kv_transfer
from fake_engines.perf.step_time import decode_batch

LINK_BUSY_MAX = 0.9
"""Most of a decode replica's KV link the pulls may use (the rest absorbs bursts)."""


@dataclass(frozen=True)
class RequestShape:
    """The request and SLOs a plan is for."""

    input_len: int
    output_len: int
    ttft_slo_s: float
    tpot_slo_s: float


@dataclass(frozen=True)
class ReplicaRates:
    """What one replica sustains within the SLOs, requests per second, and the figures behind it."""

    prefill_s: float
    """One prefill step of `prefill_batch` prompts (seconds)."""
    prefill_batch: int
    transfer_s: float
    """One request's KV pull, alone on the link."""
    decode_batch: int
    """Largest decode batch within the TPOT SLO and the KV cache."""
    decode_step_s: float
    prefill_rps: float
    """A prefill replica at the TTFT SLO."""
    decode_rps: float
    """A decode replica at the TPOT SLO and its link's limit."""
    link_rps: float
    """Pulls a decode replica's link carries, at LINK_BUSY_MAX."""
    colocated_rps: float
    """A colocated replica within both SLOs."""


@dataclass(frozen=True)
class Split:
    """One prefill:decode ratio of the fleet and its predicted goodput."""

    prefill: int
    decode: int
    goodput_rps: float
    bound: str
    """The pool that limits it: prefill, decode or link."""


def _prefill_step(step: Callable[[StepBatch], float], prompts: int, tokens: int, budget: int) -> float:
    """Seconds to prefill `prompts` prompts of `tokens` each, in chunks of the token budget."""
    total, done = 0.0, 0
    while done < tokens:
        n = min(budget // prompts if prompts > 1 else budget, tokens - done)
        total += step(StepBatch(prefill_tokens=prompts * n, prefill_attended_tokens=prompts * (n * done + n * (n + 1) // 2)))
        done += n
    return total


def _max_rate_mdl(service_s: float, per_request_s: float, slack_s: float) -> float:
    """Arrival rate at which an M/D/1 queue's mean wait is `slack_s` (service `service_s` a batch,
    `per_request_s` of busy time a request)."""
    if slack_s <= 0:
        return 0.0
    rho = 2 * slack_s / (service_s + 2 * slack_s)
    return rho / per_request_s


def _decode_batch(step: Callable[[StepBatch], float], shape: RequestShape, max_seqs: int, kv_tokens: int) -> int:
    context = shape.input_len + shape.output_len // 2
    fits = min(max_seqs, kv_tokens // (shape.input_len + shape.output_len))
    lo, hi = 0, fits
    while lo < hi:  # step time grows with the batch: the largest batch within the TPOT SLO
        mid = (lo + hi + 1) // 2
        if step(decode_batch(mid, context)) <= shape.tpot_slo_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def replica_rates(engine: BuiltEngine, link: LinkSpec, shape: RequestShape) -> ReplicaRates:
    """Per-replica capacities of `engine` (a vLLM engine) for `shape`, pulls over `link`."""
    spec = engine.spec
    assert isinstance(spec, VllmEngineSpec), "P/D planning models vLLM engines"
    step, budget = engine.step_time, spec.max_num_batched_tokens
    block = engine.config.resolved_block_size  # type: ignore[union-attr]
    batch = max(1, min(spec.max_num_seqs, budget // max(1, shape.input_len)))
    prefill_s = _prefill_step(step, batch, shape.input_len, budget)
    size = kv_block_bytes_per_gpu(spec.model, spec.layout, kv_dtype_bytes_of(engine.config), block)  # type: ignore[arg-type]
    transfer = kv_transfer(blocks_to_pull(shape.input_len, 0, block), size, link)
    b = _decode_batch(step, shape, spec.max_num_seqs, spec.num_gpu_blocks * block)
    context = shape.input_len + shape.output_len // 2
    t_b = step(decode_batch(max(1, b), context))
    slack = shape.ttft_slo_s - prefill_s - transfer.seconds - t_b
    prefill_rps = _max_rate_mdl(prefill_s, prefill_s / batch, slack)
    link_rps = LINK_BUSY_MAX * link.bytes_s / transfer.bytes_per_gpu if transfer.bytes_per_gpu else math.inf
    decode_rps = min(b / (shape.output_len * t_b), link_rps) if b else 0.0
    return ReplicaRates(prefill_s, batch, transfer.seconds, b, t_b, prefill_rps, decode_rps, link_rps,
                        _colocated_rps(step, shape, prefill_s, batch, spec.max_num_seqs, spec.num_gpu_blocks * block))


def _colocated_rps(step: Callable[[StepBatch], float], shape: RequestShape, prefill_s: float, batch: int,
                   max_seqs: int, kv_tokens: int) -> float:
    """The largest rate a colocated replica serves within both SLOs (bisection)."""
    per_request = prefill_s / batch
    context = shape.input_len + shape.output_len // 2
    fits = min(max_seqs, kv_tokens // (shape.input_len + shape.output_len))

    def meets(rate: float) -> bool:
        rho = rate * per_request
        if rho >= 1:
            return False
        seqs, tpot = 1.0, 0.0
        for _ in range(30):  # Little's law and the interleaved step time, to a fixed point
            tpot = step(decode_batch(max(1, round(seqs)), context)) / (1 - rho)
            seqs = min(max(1.0, rate * shape.output_len * tpot), fits + 1.0)  # past fits: refused anyway
        wait = rho * prefill_s / (2 * (1 - rho)) + tpot / 2  # queued prompts, then the decode step under way
        return seqs <= fits and tpot <= shape.tpot_slo_s and prefill_s + wait + tpot <= shape.ttft_slo_s

    lo, hi = 0.0, 1 / per_request
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


def splits(rates: ReplicaRates, replicas: int) -> list[Split]:
    """Every prefill:decode split of `replicas`, best predicted goodput first."""
    out = []
    for p in range(1, replicas):
        d = replicas - p
        prefill, decode = p * rates.prefill_rps, d * rates.decode_rps
        bound = "prefill" if prefill <= decode else ("link" if rates.decode_rps >= rates.link_rps else "decode")
        out.append(Split(p, d, min(prefill, decode), bound))
    return sorted(out, key=lambda s: (-s.goodput_rps, s.prefill))
