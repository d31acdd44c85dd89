"""Read /metrics the way a router does: prometheus_client's text parser."""

from __future__ import annotations

import urllib.request

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def fetch_text(base_url: str, path: str = "/metrics") -> str:
    """GET a text body (blocking)."""
    with urllib.request.urlopen(base_url + path, timeout=30) as resp:
        return resp.read().decode()


async def fetch_text_on(session: aiohttp.ClientSession, base_url: str, path: str = "/metrics") -> str:
    """GET a text body on an aiohttp session (for an engine on the test's own loop)."""
    async with session.get(base_url + path) as resp:
        return await resp.text()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample as (name, labels, value)."""
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for n, lab, v in samples(text) if n == name and all(lab.get(k) == w for k, w in labels.items()))


def scrape(base_url: str, name: str, **labels: str) -> float:
    """One figure from a live /metrics."""
    return value(fetch_text(base_url), name, **labels)
