"""Installing Flotilla into a fresh virtual environment is enough to get its pytest fixtures.

The project is copied, built into a wheel without build isolation and installed with `--no-deps`
into a new `python -m venv` (no network). The dependencies already installed for these tests are
made importable with a .pth file written after the install, so pip never sees this checkout's own
installation. A test file in a directory outside the repository then uses `flotilla_sim` and a
fleet YAML file, with pytest-asyncio in its default strict mode, and pytest runs it as a
subprocess. The wheel is built the default way, so where a C compiler is it carries the request
path compiled with mypyc (setup.py), and the venv runs that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from proxy.build import missing_toolchain
from tests.conftest import REPO

ENTRY_POINT = '\n[project.entry-points.pytest11]\nflotilla = "flotilla.pytest_plugin"\n'

OUTSIDE_TEST = '''
import sys
from pathlib import Path

import pytest

import flotilla


@pytest.mark.asyncio
async def test_flotilla_sim_from_the_installed_package(flotilla_sim, pytestconfig):
    assert Path(flotilla.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert pytestconfig.pluginmanager.has_plugin("flotilla")  # loaded by its pytest11 entry point
    fleet = await flotilla_sim(Path(__file__).with_name("fleet.yaml"), policy="least-outstanding")
    result = await fleet.replay("poisson:rate=4,duration=5,input=64,output=8", seed=1)
    assert result.summary.num_ok == result.summary.num_requests > 0
    assert set(result.summary.requests_per_backend) == {"0", "1"}
'''

FLEET_YAML = "fleet:\n  engines: 2\n  flavor: vllm\n  model: llama-3.1-8b\n  gpu: h100\n"


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def copy_project(dst: Path) -> Path:
    """The files a build reads: pyproject.toml, setup.py, the build backend, the readme and the
    packages it names."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    dst.mkdir()
    text = (REPO / "pyproject.toml").read_text()
    if "pytest11" not in pyproject["project"].get("entry-points", {}):
        text += ENTRY_POINT  # until pyproject.toml registers the plugin itself
    (dst / "pyproject.toml").write_text(text)
    shutil.copy(REPO / pyproject["project"]["readme"], dst)
    shutil.copy(REPO / "setup.py", dst)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in pyproject["build-system"]["backend-path"]:
        shutil.copytree(REPO / folder, dst / folder, ignore=ignore)
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = pattern.rstrip("*")
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    return dst


def _run(*argv: str | Path, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                                                             "FLOTILLA_COMPILE")}
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with a wheel of this checkout built the default way (no FLOTILLA_COMPILE):
    its python."""
    tmp_path = tmp_path_factory.mktemp("install")
    src = copy_project(tmp_path / "src")
    # compiling the request path: about a minute on 2 cores
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", tmp_path / "wheels", src, cwd=tmp_path, timeout_s=480)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    (wheel,) = (tmp_path / "wheels").glob("flotilla-*.whl")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel,
         cwd=tmp_path)
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path)
                .stdout.strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


skip_without_wheel = pytest.mark.skipif(
    not _has_module("wheel") and not _has_module("setuptools.command.bdist_wheel"),
    reason="building a wheel without build isolation needs `wheel` (or setuptools >= 70.1)")


@pytest.mark.slow
@pytest.mark.timeout(600)
@skip_without_wheel
def test_fixtures_work_from_a_fresh_venv_with_flotilla_installed(installed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "fleet.yaml").write_text(FLEET_YAML)
    (outside / "test_outside.py").write_text(OUTSIDE_TEST)
    proc = _run(installed, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_outside.py", cwd=outside)
    assert "1 passed" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
@skip_without_wheel
@pytest.mark.skipif(missing_toolchain() is not None, reason=f"cannot compile here: {missing_toolchain()}")
def test_a_wheel_built_the_default_way_runs_the_compiled_request_path(installed: Path, tmp_path: Path) -> None:
    proc = _run(installed, "-c", "import proxy.build, proxy.fastpath\n"
                "print(proxy.build.__file__, proxy.fastpath.__file__)\nprint(proxy.build.describe())", cwd=tmp_path)
    files, line = proc.stdout.splitlines()
    assert all(Path(f).resolve().is_relative_to(installed.parents[1].resolve()) for f in files.split())
    assert files.split()[1].endswith(".so")
    assert line == "request path compiled with mypyc"
