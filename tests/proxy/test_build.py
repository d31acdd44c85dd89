"""The build the proxy runs: the request path compiled with mypyc (a wheel, the image,
`make compiled`) or plain Python (an editable install), and how setup.py chooses.

`make compiled-test` runs tests/proxy against the compiled build with FLOTILLA_EXPECT_COMPILED=1;
tests/flotilla/test_pytest_plugin_install.py builds a wheel the default way and runs it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import tomllib

from proxy.build import REQUEST_PATH, compile_choice, compiled_modules, describe, missing_toolchain
from tests.conftest import REPO


def test_the_build_loaded_is_the_one_expected() -> None:
    # what imports load, checked apart from compiled_modules(), which finds them without importing
    loaded = [name for name in REQUEST_PATH if (importlib.import_module(name).__file__ or "").endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES))]
    if os.environ.get("FLOTILLA_EXPECT_COMPILED") == "1":
        assert loaded == compiled_modules() == list(REQUEST_PATH)
        assert describe() == "request path compiled with mypyc"
    else:
        assert loaded == compiled_modules() == []
        assert describe() == "pure Python"



def test_a_wheel_build_compiles_where_it_can_and_an_editable_install_never_does(monkeypatch) -> None:
    can = missing_toolchain() is None
    assert compile_choice({}, ["bdist_wheel", "--dist-dir", "x"])[0] is can
    assert compile_choice({"FLOTILLA_COMPILE": "1"}, ["bdist_wheel"]) == (True, "FLOTILLA_COMPILE=1")
    assert compile_choice({"FLOTILLA_COMPILE": "0"}, ["bdist_wheel"])[0] is False
    for describing in (["editable_wheel", "--dist-info-dir", "x"], ["develop"], ["dist_info"], ["egg_info"]):
        assert compile_choice({"FLOTILLA_COMPILE": "1"}, describing)[0] is False, describing
    monkeypatch.setattr(shutil, "which", lambda name: None)
    compiles, why = compile_choice({}, ["bdist_wheel"])
    assert not compiles and why.startswith(("no C compiler", "mypyc")) and why.endswith("pure Python instead")


def test_the_build_backend_asks_for_mypy_and_the_dependencies_only_for_a_compiled_wheel(monkeypatch) -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    spec = importlib.util.spec_from_file_location(
        "flotilla_build", REPO / pyproject["build-system"]["backend-path"][0] / "flotilla_build.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    monkeypatch.chdir(REPO)  # setuptools' hooks read the project from the working directory
    monkeypatch.delenv("FLOTILLA_COMPILE", raising=False)
    wheel = backend.get_requires_for_build_wheel()
    assert any(r.startswith("mypy") for r in wheel)
    assert set(pyproject["project"]["dependencies"]) <= set(wheel)
    assert set(pyproject["project"]["optional-dependencies"]["k8s"]) <= set(wheel)
    assert not any(r.startswith("mypy") for r in backend.get_requires_for_build_editable())
    monkeypatch.setenv("FLOTILLA_COMPILE", "0")
    assert not any(r.startswith("mypy") for r in backend.get_requires_for_build_wheel())
