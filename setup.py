"""The compiled build: a wheel, `pip install .` and the container image get the request path's
modules compiled to C extensions with mypyc (docs/proxy.md "The compiled build"); an editable
install (`make install`) stays plain Python. Everything else is in pyproject.toml.

mypyc compiles the modules as they are, from their type annotations: the same code runs either
way, and a compiled module behaves as its source (the proxy's tests run against both builds).
Compiling needs mypy (the `compile` extra, which the build backend, scripts/build/flotilla_build.py,
adds to a wheel's build) and a C compiler with Python's headers; without them the build is plain
Python. FLOTILLA_COMPILE=1 insists on compiling,
FLOTILLA_COMPILE=0 never compiles (proxy/build.py `compile_choice`).
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
from proxy.build import REQUEST_PATH, compile_choice  # noqa: E402


def compiled_build() -> dict:
    """setup()'s extension modules and build folder for the compiled build; none for the plain one."""
    compiles, why = compile_choice(os.environ, sys.argv[1:])
    if not compiles:
        if "not a build" not in why:
            print(f"flotilla: building pure Python: {why}", file=sys.stderr)
        return {}
    print(f"flotilla: compiling the request path with mypyc ({why})", file=sys.stderr)
    from mypyc.build import mypycify

    # A fresh build folder each time: setuptools would otherwise pack a module compiled by an earlier
    # build that is no longer on the list, left in ./build.
    base = tempfile.mkdtemp(prefix="flotilla-compiled-")
    atexit.register(shutil.rmtree, base, True)
    # The mypy settings are pyproject.toml's, less its note on sections for modules not compiled.
    try:
        modules = mypycify(["--no-warn-unused-configs", *(m.replace(".", "/") + ".py" for m in REQUEST_PATH)],
                           opt_level="3", target_dir=os.path.join(base, "mypyc"))
    except SystemExit:  # mypyc's way to fail (its type check printed why)
        if os.environ.get("FLOTILLA_COMPILE") == "1":
            raise
        print("flotilla: mypyc could not compile the request path (above); pure Python instead", file=sys.stderr)
        return {}
    return {"ext_modules": modules, "options": {"build": {"build_base": base}}}


setup(**compiled_build())
