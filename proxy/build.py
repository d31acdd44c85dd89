"""Which build of the proxy runs: plain Python, or the request path compiled with mypyc
(`make compiled`; setup.py compiles the modules listed here)."""

from __future__ import annotations

import importlib.machinery
import importlib.util

REQUEST_PATH = (
    # the request path, client to engine and back: about 28 % fewer instructions per request compiled.
    # proxy/records.py says why the request path's Structs are not in them.
    "proxy.fastpath", "proxy.upstream", "proxy.dispatch", "proxy.pool", "proxy.router",
    "proxy.breaker", "proxy.usage", "proxy.request_parse",
)
"""The modules setup.py compiles with FLOTILLA_COMPILE=1."""


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


def describe() -> str:
    """For the proxy's first line: 'request path compiled with mypyc' or 'pure Python'."""
    n = len(compiled_modules())
    if n == len(REQUEST_PATH):
        return "request path compiled with mypyc"
    return f"{n} of {len(REQUEST_PATH)} request path modules compiled" if n else "pure Python"
