"""The build backend: setuptools', plus what compiling the request path needs (setup.py,
proxy/build.py).

A wheel build (`pip install .`, `pip wheel .`) compiles with mypyc, which type-checks the request
path against the libraries it uses: the isolated build environment gets the `compile` extra (mypy
and stubs), the project's dependencies and its k8s extra (pip's cache then serves the same wheels
to the install itself). An editable install, and FLOTILLA_COMPILE=0, get setuptools alone:
nothing is compiled there.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403  (every hook setuptools has, unchanged but one)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def compile_requirements() -> list[str]:
    """mypy, its stubs and the libraries the compiled modules' types come from."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    return [*extras["compile"], *project["dependencies"], *extras["k8s"]]


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = [] if os.environ.get("FLOTILLA_COMPILE") == "0" else compile_requirements()
    return [*build_meta.get_requires_for_build_wheel(config_settings), *extra]
