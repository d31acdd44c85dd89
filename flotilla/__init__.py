"""Flotilla: a router and autoscaler for fleets of OpenAI-compatible LLM engines."""

__version__ = "0.1.0"
