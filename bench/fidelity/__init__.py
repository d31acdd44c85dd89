"""Replays the real engines' captures against the look-alikes (`python -m bench.fidelity`)."""
