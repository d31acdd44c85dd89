"""The compiled build of Flotilla, for benchmarks beside the plain one: `make compiled`.

Installs the repository, with the request path compiled by mypyc (setup.py, FLOTILLA_COMPILE=1),
into build/compiled, a folder of its own, so the working tree stays plain Python and a test or an
edit never meets a stale compiled module. A process runs the compiled build with `env()` and its
working directory there (`python -m` puts the working directory first on sys.path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / "build" / "compiled"


def build(dest: Path = DEST) -> Path:
    """Build and install into `dest` (about a minute on 2 cores); returns `dest`."""
    started = time.monotonic()
    print(f"building the compiled request path into {dest} (about 30 s)", file=sys.stderr, flush=True)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--target", str(tmp), str(REPO)], check=True, cwd=REPO,
                   env={**os.environ, "FLOTILLA_COMPILE": "1"})
    check(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return dest


def env(dest: Path = DEST) -> dict[str, str]:
    """The environment that runs the build in `dest` ahead of the working tree."""
    before = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{dest}{os.pathsep}{before}" if before else str(dest)}


def check(dest: Path = DEST) -> None:
    """Fail unless every module of the request path in `dest` loads compiled."""
    out = subprocess.run([sys.executable, "-c", "from proxy.build import REQUEST_PATH, compiled_modules\n"
                          "assert compiled_modules() == list(REQUEST_PATH), compiled_modules()"],
                         cwd=dest, env={**os.environ, **env(dest)}, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{dest} does not load the compiled request path:\n{out.stderr}")


if __name__ == "__main__":
    build()
