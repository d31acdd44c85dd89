"""The real vLLM 0.32 V1 scheduler behind the driver's `Core` (import only in the vLLM venv).

No model runs: a tiny Llama `config.json` (skip_tokenizer_init) and a one-group
`FullAttentionSpec` KV config are all `Scheduler` needs. Each step's `ModelRunnerOutput` samples
one token for every scheduled request that is not in a partial prefill; the token ids are the
fake's own per-request stream, so both sides hash the same output blocks."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from bench.vllm_equivalence.driver import kind
from bench.vllm_equivalence.workloads import prompt_tokens
from fake_engines.core._generator import next_token_id, token_stream

_MODEL_DIR: str | None = None


def _model_dir() -> str:
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.mkdtemp(prefix="vllm-equivalence-")
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                  "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "num_hidden_layers": 2, "vocab_size": 2_000_000, "max_position_embeddings": 65536,
                  "torch_dtype": "float32", "rms_norm_eps": 1e-5}
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as f:
            json.dump(config, f)
    return _MODEL_DIR


def settings_used(settings: dict[str, Any]) -> dict[str, Any]:
    """The vLLM settings a golden file records (everything else is vLLM's default)."""
    return {k: settings[k] for k in sorted(settings) if k != "seed"}


class VllmCore:
    """vLLM's `Scheduler` (or `AsyncScheduler`) driven step by step."""

    def __init__(self, settings: dict[str, Any]) -> None:
        s = settings
        model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=s["max_model_len"],
                            dtype="float32")
        sched = SchedulerConfig(max_num_seqs=s["max_num_seqs"], max_num_batched_tokens=s["max_num_batched_tokens"],
                                max_model_len=s["max_model_len"], is_encoder_decoder=False,
                                enable_chunked_prefill=True,
                                long_prefill_token_threshold=s["long_prefill_token_threshold"],
                                scheduler_reserve_full_isl=s["scheduler_reserve_full_isl"], policy=s["policy"],
                                async_scheduling=s["async_scheduling"])
        cache = CacheConfig(block_size=s["block_size"], enable_prefix_caching=s["enable_prefix_caching"])
        cache.num_gpu_blocks = s["num_gpu_blocks"]
        lora = LoRAConfig(max_loras=s["max_loras"], max_lora_rank=8)
        config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, lora_config=lora)
        kv = KVCacheConfig(num_blocks=s["num_gpu_blocks"], kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layers.0"], FullAttentionSpec(block_size=s["block_size"], num_kv_heads=2,
                                                             head_size=32, dtype=torch.float32))])
        cls = AsyncScheduler if s["async_scheduling"] else Scheduler
        self.scheduler = cls(vllm_config=config, kv_cache_config=kv,
                             structured_output_manager=StructuredOutputManager(config), block_size=s["block_size"])
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(s["block_size"], hash_fn)
        self._seed = s["seed"]
        self._tokens: dict[str, Any] = {}
        self._lora_ids: dict[str, int] = {}
        self._n_prompt: dict[str, int] = {}
        self._num_outputs: dict[str, int] = {}
        self._arrival = 0.0

    def add(self, request: dict[str, Any]) -> None:
        rid, name = request["id"], request["lora"]
        lora = None
        if name is not None:
            lora_id = self._lora_ids.setdefault(name, len(self._lora_ids) + 1)
            lora = LoRARequest(name, lora_id, f"/nonexistent/{name}")
        tokens = prompt_tokens(request["prompt"])
        self._arrival += 1.0  # arrival order breaks priority ties, as wall-clock arrival would
        params = SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True, temperature=0.0)
        self.scheduler.add_request(Request(rid, tokens, params, None, arrival_time=self._arrival, lora_request=lora,
                                           priority=request["priority"], block_hasher=self._hasher))
        self._tokens[rid] = token_stream(self._seed, rid)
        self._n_prompt[rid] = len(tokens)
        self._num_outputs[rid] = 0

    def abort(self, request_id: str) -> bool:
        return bool(self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED))

    def has_requests(self) -> bool:
        return self.scheduler.get_num_unfinished_requests() > 0

    def schedule(self) -> tuple[Any, dict[str, Any]]:
        out = self.scheduler.schedule()
        reqs = self.scheduler.requests
        sched, sample = [], []
        for rid, n in out.num_scheduled_tokens.items():
            request = reqs[rid]
            before = request.num_computed_tokens - n
            sched.append([rid, n, kind(before, n, self._n_prompt[rid])])
            if not request.is_prefill_chunk:
                sample.append(rid)
        new = [[r.req_id, r.num_computed_tokens] for r in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        resumed = [[rid, c] for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=True)
                   if rid in cached.resumed_req_ids]
        record = {"sched": sched, "new": new, "resumed": resumed,
                  "preempted": sorted(out.preempted_req_ids or ()),
                  "kv": round(self.scheduler.kv_cache_manager.usage, 6)}
        return (out, sample), record

    def update(self, handle: Any) -> list[tuple[str, bool, bool]]:
        out, sample = handle
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            stream = self._tokens.get(rid)
            live = rid in sample and stream is not None and rid in self.scheduler.requests
            sampled.append([next_token_id(stream)] if live else [])
        runner_out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                       sampled_token_ids=sampled)
        engine_outputs = self.scheduler.update_from_output(out, runner_out)
        events = []
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                if not o.new_token_ids and o.finish_reason is None:
                    continue
                first = bool(o.new_token_ids) and self._num_outputs[o.request_id] == 0
                self._num_outputs[o.request_id] += len(o.new_token_ids)
                events.append((o.request_id, first, o.finish_reason is not None))
        return events
