"""Registers the `soak` marker: long-running tests that exercise the proxy for a minute."""


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "soak: a one-minute soak run (deselect with -m 'not soak')")
