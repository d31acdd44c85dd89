"""The workloads that cover vLLM's scheduler, and a seeded generator of more.

A prompt is a list of segments [seed, length]: the tokens of a segment are drawn from
random.Random(seed), so requests that share a first segment share a prefix, and a golden file
stays small. Settings are those of `vllm serve` (scheduler and cache flags)."""

from __future__ import annotations

import random
from typing import Any

DEFAULTS: dict[str, Any] = {
    "num_gpu_blocks": 256, "block_size": 16, "max_num_seqs": 16, "max_num_batched_tokens": 512,
    "max_model_len": 2048, "long_prefill_token_threshold": 0, "max_loras": 1,
    "scheduler_reserve_full_isl": True, "policy": "fcfs", "async_scheduling": False,
    "enable_prefix_caching": True, "seed": 0,
}
TOKEN_RANGE = (100, 30_000)


def prompt_tokens(segments: list[list[int]]) -> list[int]:
    """The token ids of a prompt given as [seed, length] segments."""
    tokens: list[int] = []
    for seed, length in segments:
        rng = random.Random(seed)
        tokens.extend(rng.randrange(*TOKEN_RANGE) for _ in range(length))
    return tokens


def _req(i: int, step: int, segments: list[list[int]], max_tokens: int, lora: str | None = None,
         priority: int = 0) -> dict[str, Any]:
    return {"id": f"r{i}", "arrival_step": step, "prompt": segments, "max_tokens": max_tokens,
            "lora": lora, "priority": priority}


def _workload(name: str, requests: list[dict[str, Any]], aborts: list[dict[str, Any]] | None = None,
              **settings: Any) -> dict[str, Any]:
    merged = {**DEFAULTS, **settings}
    # vLLM refuses to start when max_model_len exceeds what the cache holds
    merged["max_model_len"] = min(merged["max_model_len"], (merged["num_gpu_blocks"] - 1) * merged["block_size"])
    return {"name": name, "settings": merged, "requests": requests, "aborts": aborts or []}


def all_at_once() -> dict[str, Any]:
    rng = random.Random(1)
    reqs = [_req(i, 0, [[1000 + i, rng.randint(20, 300)]], rng.randint(5, 60)) for i in range(12)]
    return _workload("all_at_once", reqs)


def kv_pressure(reserve: bool) -> dict[str, Any]:
    rng = random.Random(2)
    reqs = [_req(i, rng.randint(0, 30), [[2000 + i, rng.randint(100, 700)]], rng.randint(20, 120))
            for i in range(24)]
    reqs.sort(key=lambda r: r["arrival_step"])
    return _workload(f"kv_pressure_{'reserve' if reserve else 'no_reserve'}", reqs,
                     num_gpu_blocks=120, max_num_batched_tokens=256, scheduler_reserve_full_isl=reserve)


def shared_prefixes() -> dict[str, Any]:
    """Few system prompts, many users; a small cache evicts (LRU), and requests admitted in one
    step compute the same prefix twice (duplicate blocks)."""
    rng = random.Random(3)
    reqs = []
    for i in range(40):
        system = rng.randrange(4)
        reqs.append(_req(i, (i // 3) * 4, [[3000 + system, 16 * rng.randint(4, 12) + rng.randrange(16)],
                                            [3100 + i, rng.randint(5, 80)]], rng.randint(4, 40)))
    return _workload("shared_prefixes_lru", reqs, num_gpu_blocks=90, max_num_seqs=8)


def duplicate_blocks() -> dict[str, Any]:
    """Requests that share a long prompt arrive while the first is still in chunked prefill: each
    hits the chunks cached so far and computes the rest itself, so the same blocks are cached
    twice or more; unrelated traffic then evicts some copies and late requests hit the others."""
    reqs = [_req(i, i, [[9000, 600], [9100 + i, 8]], 6) for i in range(4)]
    reqs += [_req(4 + i, 30 + 2 * i, [[9200 + i, 300]], 20) for i in range(6)]
    reqs += [_req(10 + i, 70 + i, [[9000, 600], [9300 + i, 8]], 6) for i in range(4)]
    return _workload("duplicate_blocks", reqs, num_gpu_blocks=110, max_num_batched_tokens=128, max_num_seqs=6)


def chunked_prefill(threshold: int) -> dict[str, Any]:
    rng = random.Random(4)
    reqs = [_req(0, 0, [[4000, 1500]], 30)]  # alone at first: the threshold does not apply
    reqs += [_req(i, 3 + 6 * i, [[4000 + i, rng.randint(300, 1200)]], rng.randint(10, 80)) for i in range(1, 10)]
    name = f"chunked_prefill_threshold_{threshold}" if threshold else "chunked_prefill_no_threshold"
    return _workload(name, reqs, num_gpu_blocks=400, max_num_batched_tokens=256,
                     long_prefill_token_threshold=threshold)


def azure_like(is_async: bool = False, seed: int = 5) -> dict[str, Any]:
    """Poisson arrivals, long-tailed prompts (code-like: long inputs, short outputs) and outputs."""
    rng = random.Random(seed)
    reqs, step = [], 0
    for i in range(60):
        step += int(rng.expovariate(1 / 3))
        prompt = min(1800, int(rng.lognormvariate(5.5, 0.9)) + 1)
        out = min(200, int(rng.lognormvariate(3.0, 0.9)) + 1)
        reqs.append(_req(i, step, [[5000 + i, prompt]], out))
    return _workload("azure_like_async" if is_async else "azure_like", reqs, num_gpu_blocks=200,
                     max_num_batched_tokens=512, async_scheduling=is_async)


def lora() -> dict[str, Any]:
    rng = random.Random(6)
    reqs = [_req(i, i // 2, [[6000 + i, rng.randint(20, 200)]], rng.randint(5, 40),
                 lora=[None, "a", "b", "c"][i % 4]) for i in range(20)]
    return _workload("lora_max_loras_2", reqs, max_loras=2, max_num_seqs=8)


def lora_one_slot() -> dict[str, Any]:
    """max_loras 1 with two adapters: under async scheduling a request whose last step is in
    flight is not scheduled again, so its adapter does not count and the other may start."""
    reqs = [_req(i, 2 * (i // 2), [[6500 + i, 40 + 10 * i]], 3 + i % 3, lora="ab"[i % 2]) for i in range(12)]
    return _workload("lora_max_loras_1", reqs, max_loras=1, max_num_seqs=8)


def priority() -> dict[str, Any]:
    rng = random.Random(7)
    reqs = [_req(i, rng.randint(0, 20), [[7000 + i, rng.randint(50, 400)]], rng.randint(10, 60),
                 priority=rng.randint(0, 3)) for i in range(20)]
    reqs.sort(key=lambda r: r["arrival_step"])
    return _workload("priority", reqs, policy="priority", num_gpu_blocks=100, max_num_batched_tokens=256)


def aborts() -> dict[str, Any]:
    rng = random.Random(8)
    reqs = [_req(i, i, [[8000 + i, rng.randint(200, 900)]], rng.randint(20, 60)) for i in range(10)]
    cuts = [{"step": 2, "id": "r1"}, {"step": 4, "id": "r3"}, {"step": 12, "id": "r0"},
            {"step": 20, "id": "r5"}, {"step": 30, "id": "r9"}]
    return _workload("aborts", reqs, cuts, max_num_batched_tokens=128)


def random_workload(seed: int) -> dict[str, Any]:
    """A seeded mix of everything above, with random settings."""
    rng = random.Random(seed)
    settings = {
        "num_gpu_blocks": rng.choice([48, 80, 128, 256]), "block_size": rng.choice([8, 16]),
        "max_num_seqs": rng.choice([4, 8, 16]), "max_num_batched_tokens": rng.choice([64, 128, 256, 512]),
        "long_prefill_token_threshold": rng.choice([0, 0, 32, 100]), "max_loras": rng.choice([1, 2]),
        "scheduler_reserve_full_isl": rng.random() < 0.7, "async_scheduling": rng.random() < 0.5,
    }
    # vLLM refuses to start when max_model_len exceeds the cache; requests must fit max_model_len
    settings["max_model_len"] = min(512, (settings["num_gpu_blocks"] - 1) * settings["block_size"])
    systems = [[90_000 + seed * 10 + k, rng.randint(8, 120)] for k in range(3)]
    reqs, step = [], 0
    for i in range(rng.randint(5, 30)):
        step += rng.choice([0, 0, 1, 2, 5])
        segments = ([rng.choice(systems)] if rng.random() < 0.5 else []) + [[seed * 1000 + i, rng.randint(1, 250)]]
        n_prompt = sum(s[1] for s in segments)
        max_tokens = min(rng.randint(1, 80), settings["max_model_len"] - n_prompt)
        lora_name = rng.choice([None, None, "a", "b", "c"])
        if max_tokens < 1:
            continue
        reqs.append(_req(i, step, segments, max_tokens, lora=lora_name))
    cuts = [{"step": rng.randint(0, step + 20), "id": r["id"]} for r in reqs if rng.random() < 0.1]
    return _workload(f"random_{seed}", reqs, cuts, **settings)


def named() -> list[dict[str, Any]]:
    """The golden workloads, synchronous; `with_async` adds the async copies."""
    return [all_at_once(), kv_pressure(True), kv_pressure(False), shared_prefixes(), duplicate_blocks(),
            chunked_prefill(0), chunked_prefill(200), azure_like(), lora(), lora_one_slot(), priority(), aborts(),
            random_workload(1), random_workload(2), random_workload(3)]


def with_async(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each workload as given, then under async scheduling (name suffixed "_async")."""
    out = []
    for w in workloads:
        out.append({**w, "settings": {**w["settings"], "async_scheduling": False}})
        out.append({**w, "name": w["name"] + "_async", "settings": {**w["settings"], "async_scheduling": True}})
    return out
