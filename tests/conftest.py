"""Shared test helpers. Tests mirror the package tree: tests/<package>/test_<module>.py."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
"""Inputs the tests read (traces, engine captures, calibration): all inside the repository."""


@pytest.fixture
def repo_root() -> Path:
    return REPO
