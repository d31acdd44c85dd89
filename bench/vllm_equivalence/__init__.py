"""Step-for-step equivalence of the look-alike vLLM scheduler with vLLM 0.32's V1 scheduler.

`python -m bench.vllm_equivalence` (run with the vLLM venv's python) drives the real `Scheduler`
/ `AsyncScheduler` and the fake core on the same workloads and writes golden traces; see
docs/fidelity.md ("scheduler")."""
