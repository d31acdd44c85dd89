"""Routing quality at scale: every routing policy (Flotilla's and the peers' algorithms) on long
trace windows through 8 simulated vLLM replicas with real KV sizes (`python -m bench.routing_quality`)."""
