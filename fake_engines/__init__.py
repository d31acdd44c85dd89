"""Look-alike vLLM and llama-server engines: perf model, engine core and HTTP surfaces."""
