"""The optional compiled build: with FLOTILLA_COMPILE=1, the request path's modules are compiled
to C extensions with mypyc (`make compiled`, docs/benchmarks.md "The compiled build"); without it,
a plain Python build. Everything else is in pyproject.toml.

mypyc compiles the modules as they are, from their type annotations: the same code runs either
way, and a compiled module behaves as its source (the proxy's tests run against both builds).
Compiling needs mypy (the `test` extra has it) and a C compiler; build without isolation so the
environment's mypy is used: `FLOTILLA_COMPILE=1 pip install --no-build-isolation .`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

from setuptools import setup

# setuptools' PEP 517 backend does not put the project on sys.path; proxy/build.py (and the
# package's __init__) import nothing outside the standard library.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy.build import REQUEST_PATH  # noqa: E402


def compiled_build() -> dict:
    """setup()'s extension modules and build folder for the compiled build; none for the plain one."""
    if os.environ.get("FLOTILLA_COMPILE") != "1":
        return {}
    from mypyc.build import mypycify

    # A fresh build folder each time: setuptools would otherwise pack a module compiled by an earlier
    # build that is no longer on the list, left in ./build.
    base = tempfile.mkdtemp(prefix="flotilla-compiled-")
    atexit.register(shutil.rmtree, base, True)
    # The mypy settings are pyproject.toml's, less its note on sections for modules not compiled.
    modules = mypycify(["--no-warn-unused-configs", *(m.replace(".", "/") + ".py" for m in REQUEST_PATH)],
                       opt_level="3", target_dir=os.path.join(base, "mypyc"))
    return {"ext_modules": modules, "options": {"build": {"build_base": base}}}


setup(**compiled_build())
