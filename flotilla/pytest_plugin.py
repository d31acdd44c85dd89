"""Flotilla's pytest plugin: `flotilla_fleet` (live) and `flotilla_sim` (simulated) fixtures.

Registered through the `pytest11` entry point, so installing Flotilla is enough:

    async def test_prefix_aware_keeps_agent_prefixes(flotilla_sim):
        fleet = await flotilla_sim(engines=4, policy="prefix-aware")
        result = await fleet.replay("agents:sessions=6,turns=5,system=2000")
        assert result.summary.prefix_hit_rate > 0.7

Each fixture is a factory: `await factory(config=None, **settings)` with a fleet YAML file,
YAML text, a mapping or a `FleetSpec` as `config` and `FleetSpec` fields as keywords, or
`await factory(fleet="fleet.yaml")` with a `flotilla up` fleet file (or a `flotilla.fleet.Fleet`)
and `policy`, `seed`, `time_scale` or `scrape_interval_s` as keywords. Every fleet a factory
started is closed after the test. The fixtures need pytest-asyncio (any mode); the
heavy imports wait until a fixture is used, so the plugin costs nothing to other test suites.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

try:
    import pytest_asyncio
except ImportError:  # the fixtures then explain what is missing instead of breaking collection
    pytest_asyncio = None  # type: ignore[assignment]

FleetFactory = Callable[..., Awaitable[Any]]


@contextlib.asynccontextmanager
async def fleets(kind: str) -> AsyncIterator[FleetFactory]:
    """A factory of `live` or `sim` fleets that closes every fleet it started on exit."""
    from flotilla.fleet import Fleet
    from flotilla.testing import LiveFleet, SimFleet, load_fleet, load_fleet_spec

    fleet_cls = LiveFleet if kind == "live" else SimFleet
    started: list[Any] = []

    async def start(config: Any = None, *, fleet: Any = None, **settings: Any) -> Any:
        if isinstance(config, Fleet):
            config, fleet = None, config
        if fleet is not None and config is not None:
            raise TypeError("give a fleet file (fleet=) or FleetSpec settings (config), not both")
        target = load_fleet(fleet, **settings) if fleet is not None else load_fleet_spec(config, **settings)
        running = await fleet_cls.start(target)
        started.append(running)
        return running

    try:
        yield start
    finally:
        for fleet in reversed(started):
            await fleet.close()


if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def flotilla_fleet() -> AsyncIterator[FleetFactory]:
        """Factory of live fleets: look-alike engines and the proxy on free 127.0.0.1 ports."""
        async with fleets("live") as factory:
            yield factory

    @pytest_asyncio.fixture
    async def flotilla_sim() -> AsyncIterator[FleetFactory]:
        """Factory of simulated fleets with the same interface as `flotilla_fleet`."""
        async with fleets("sim") as factory:
            yield factory

else:

    @pytest.fixture
    def flotilla_fleet() -> None:
        """Needs pytest-asyncio."""
        pytest.fail("flotilla_fleet needs pytest-asyncio: pip install pytest-asyncio")

    @pytest.fixture
    def flotilla_sim() -> None:
        """Needs pytest-asyncio."""
        pytest.fail("flotilla_sim needs pytest-asyncio: pip install pytest-asyncio")
