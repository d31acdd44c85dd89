"""Engine /metrics text -> the load signals routing needs (pure).

Understands vLLM (current names and the legacy `gpu_cache_usage_perc`) and llama.cpp
(`llamacpp:requests_processing`, `requests_deferred`, the older `kv_cache_usage_ratio`).
With data parallelism vLLM exposes one series per `engine` label: counts are summed,
KV usage is averaged and cache capacity is summed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Prefixes of the engine families worth parsing; the rest (python_*, process_*, histogram
# buckets) is dropped before parsing because it is most of a vLLM page and none of the signal.
ENGINE_PREFIXES = ("vllm:", "llamacpp:")

RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio")
LORA_INFO = "vllm:lora_requests_info"
CACHE_CONFIG_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class LoadSample:
    """One scrape of one engine, reduced to routing signals."""

    num_requests_running: float | None = None
    """Requests the engine is computing (vLLM running, llama.cpp processing slots)."""
    num_requests_waiting: float | None = None
    """Requests queued inside the engine (vLLM waiting incl. preempted, llama.cpp deferred)."""
    kv_cache_usage: float | None = None
    """KV-cache usage in [0, 1]."""
    cache_capacity_tokens: int | None = None
    """KV capacity in tokens: num_gpu_blocks x block_size from cache_config_info."""
    lora_adapters: frozenset[str] = frozenset()
    """Adapters running or waiting, from the newest lora_requests_info series."""
    max_lora: int | None = None
    """Adapters the engine batches at once (lora_requests_info max_lora label)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Every other engine gauge or counter sample, summed over its label sets; by sample name."""


KEPT_TYPES = ("gauge", "counter", "untyped")
"""Histograms and summaries are no routing signal; skipping them halves a vLLM page's parse."""
KEPT_HISTOGRAMS = ("vllm:request_time_per_output_token_seconds",)
"""Histograms whose _sum and _count are kept (their buckets are not): the mean time per output
token a P/D decode pool scales on (proxy/autoscale/signals.py)."""


def _engine_lines(text: str) -> str:
    keep = []
    family, wanted = "", False
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            family = parts[2] if len(parts) >= 4 else ""
            wanted = family.startswith(ENGINE_PREFIXES) and parts[3] in KEPT_TYPES
            if wanted or family in KEPT_HISTOGRAMS:
                keep.append(line)
        elif line.startswith(ENGINE_PREFIXES):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            in_family = bool(family) and name.startswith(family)
            if (wanted or not in_family) and not name.endswith("_created"):
                keep.append(line)  # a sample with no TYPE line of its own is untyped: kept
            elif family in KEPT_HISTOGRAMS and name in (family + "_sum", family + "_count"):
                keep.append(line)
    return "\n".join(keep) + "\n"


def _split_adapters(value: str) -> set[str]:
    return {a.strip() for a in value.split(",") if a.strip()}


def _newest_lora(samples: Iterable[tuple[dict[str, str], float]]) -> tuple[frozenset[str], int | None]:
    # Each label combination is a series that never goes away; its value is the unix time it was
    # last written, so the newest series is the one with the largest value.
    newest = max(samples, key=lambda s: s[1], default=None)
    if newest is None:
        return frozenset(), None
    labels = newest[0]
    adapters = _split_adapters(labels.get("running_lora_adapters", ""))
    adapters |= _split_adapters(labels.get("waiting_lora_adapters", ""))
    max_lora = labels.get("max_lora", "")
    return frozenset(adapters), int(max_lora) if max_lora.isdigit() else None


def _capacity_tokens(samples: Iterable[tuple[dict[str, str], float]]) -> int | None:
    total = 0
    for labels, _ in samples:
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit():
            total += int(blocks) * int(size)
    return total or None


def _first(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def parse_engine_metrics(text: str) -> LoadSample:
    """Reduce a Prometheus text page from vLLM or llama-server to a LoadSample."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    lora: list[tuple[dict[str, str], float]] = []
    cache_config: list[tuple[dict[str, str], float]] = []
    for family in text_string_to_metric_families(_engine_lines(text)):
        for sample in family.samples:
            if sample.name == LORA_INFO:
                lora.append((sample.labels, sample.value))
            elif sample.name == CACHE_CONFIG_INFO:
                cache_config.append((sample.labels, sample.value))
            else:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                counts[sample.name] = counts.get(sample.name, 0) + 1
    adapters, max_lora = _newest_lora(lora)
    kv_name = next((n for n in KV_USAGE if n in sums), None)
    return LoadSample(
        num_requests_running=_first(sums, RUNNING),
        num_requests_waiting=_first(sums, WAITING),
        kv_cache_usage=sums[kv_name] / counts[kv_name] if kv_name else None,
        cache_capacity_tokens=_capacity_tokens(cache_config),
        lora_adapters=adapters,
        max_lora=max_lora,
        metrics=sums,
    )
