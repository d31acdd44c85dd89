"""Which build of the proxy runs: the request path compiled with mypyc (what a wheel, `pip install .`
and the container image get) or plain Python (an editable install, the checkout); setup.py compiles
the modules listed here when `compile_choice` says so."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sysconfig
from collections.abc import Mapping, Sequence

REQUEST_PATH = (
    # the request path, client to engine and back: about 29 % fewer instructions per request compiled.
    # proxy/records.py says why the request path's Structs are not in them.
    "proxy.fastpath", "proxy.upstream", "proxy.dispatch", "proxy.pool", "proxy.router",
    "proxy.breaker", "proxy.usage", "proxy.request_parse", "proxy.generation",
    # with --workers N, each request writes its worker's row of the shared in-flight table twice
    # and reads the others' once
    "proxy.shared_load",
)
"""The modules setup.py compiles."""

BUILD_COMMANDS = frozenset({"bdist_wheel", "build", "build_ext", "install", "bdist"})
"""setup.py commands that build the package. Others (`dist_info`, `egg_info`, `sdist`) only
describe it, and `editable_wheel` / `develop` point the install at the checkout: compiling
there would put modules beside the sources that hide every later edit."""


def compile_choice(environ: Mapping[str, str], commands: Sequence[str]) -> tuple[bool, str]:
    """Whether setup.py compiles the request path, and why. FLOTILLA_COMPILE=1 compiles (a missing
    compiler is then an error), =0 builds plain Python; unset, a build compiles when it can."""
    choice = environ.get("FLOTILLA_COMPILE", "")
    if choice == "0":
        return False, "FLOTILLA_COMPILE=0"
    if not BUILD_COMMANDS.intersection(commands):
        return False, "not a build (metadata or an editable install)"
    if choice == "1":
        return True, "FLOTILLA_COMPILE=1"
    missing = missing_toolchain()
    if missing:
        return False, f"{missing}; pure Python instead"
    return True, "mypy's mypyc and a C compiler are present"


def missing_toolchain() -> str | None:
    """What compiling lacks here (mypyc, a C compiler, Python's headers), or None."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc (from mypy) is not installed"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "Python's headers (Python.h) are not installed"
    return None


def compiled_modules() -> list[str]:
    """The request path's modules that load from C extensions. Found without importing them: the
    supervisor of several workers names its build before it forks replacements, which should not
    inherit the request path imported into the parent."""
    found = []
    for name in REQUEST_PATH:
        spec = importlib.util.find_spec(name)
        if spec is not None and (spec.origin or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            found.append(name)
    return found


COMPILED = "request path compiled with mypyc"
"""What `describe` says of the compiled build."""


def describe() -> str:
    """For the proxy's first line: COMPILED or 'pure Python'."""
    n = len(compiled_modules())
    if n == len(REQUEST_PATH):
        return COMPILED
    return f"{n} of {len(REQUEST_PATH)} request path modules compiled" if n else "pure Python"
