"""Flotilla beside peer routers (sglang-router, vllm-router, LiteLLM, nginx): overhead and routing
quality on the same backends and traffic. `python -m bench.peers --help`."""
