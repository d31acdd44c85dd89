"""Loads Flotilla's pytest plugin for the examples unless the installed entry point already did."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registering the module a second time under another name would make pluggy refuse it.
    if not config.pluginmanager.has_plugin("flotilla"):
        config.pluginmanager.import_plugin("flotilla.pytest_plugin")
