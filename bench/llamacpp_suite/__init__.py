"""llama.cpp's own server tests (tools/server/tests) run against fake-llama-server.

Not part of `make test`: `python -m bench.llamacpp_suite` (see docs/fidelity.md, "llama.cpp's server
tests"). The tests come from the llama-cpp-python sdist, the build whose captures the look-alike imitates.
"""
