"""Proxy overhead benchmark: added latency at a fixed rate, maximum requests per second and CPU per
request, measured through the proxy and directly against the same zero-latency backend in one run.

    python -m bench.overhead            # writes the overhead section of docs/benchmarks.md
"""
