"""`python -m bench.llamacpp_suite`: llama.cpp's server tests against fake-llama-server, file by file.

Fetches the llama-cpp-python sdist (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`),
takes its vendor/llama.cpp/tools/server/tests, installs their requirements.txt (plus pytest-timeout) in a
venv of their own, and runs upstream's default selection (`-m "not slow"`, as its tests.sh) with
LLAMA_SERVER_BIN_PATH naming a wrapper around fake-llama-server (bench/llamacpp_suite/wrapper.py).
Writes the "llama.cpp's server tests" section of docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.llamacpp_suite.classify import Case, parse_junit
from bench.llamacpp_suite.report import render, replace_section
from bench.llamacpp_suite.wrapper import TEMPLATES_ENV

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.3.36"
TESTS_IN_SDIST = "vendor/llama.cpp/tools/server/tests"
DEFAULT_HOME = Path.home() / ".cache" / "flotilla" / "llamacpp-suite"
COMMAND = "python -m bench.llamacpp_suite"


def fetch_tests(home: Path) -> Path:
    # Kept at its place in llama.cpp's tree: test_tools_builtin.py reads files relative to the root it
    # derives from its own path (unit/../../../..), so home stands in for that root.
    tests = home / "tools" / "server" / "tests"
    if (tests / "utils.py").exists():
        return tests
    home.mkdir(parents=True, exist_ok=True)
    sdist = home / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(home)], check=True)
    prefix = f"llama_cpp_python-{VERSION}/{TESTS_IN_SDIST}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = "tools/server/tests/" + m.name[len(prefix):]
        tar.extractall(home, members=members, filter="data")
    return tests


def fetch_templates(home: Path) -> Path:
    """llama.cpp's models/templates/*.jinja from the sdist (test_template.py and others pass them by path)."""
    templates = home / "models" / "templates"
    if templates.is_dir():
        return templates
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/"
    with tarfile.open(home / f"llama_cpp_python-{VERSION}.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for m in members:
            m.name = "models/templates/" + m.name[len(prefix):]
        tar.extractall(home, members=members, filter="data")
    return templates


def ensure_venv(home: Path, tests: Path) -> Path:
    python = home / "venv" / "bin" / "python"
    if not (home / "venv" / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(tests / "requirements.txt"),
                        "pytest-timeout"], check=True)
        (home / "venv" / ".installed").touch()
    return python


def write_wrapper(home: Path) -> Path:
    """An executable for LLAMA_SERVER_BIN_PATH (the tests Popen it with llama-server's argv)."""
    path = home / "llama-server"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{REPO}/.venv/bin/python" '
                    f'-m bench.llamacpp_suite.wrapper "$@"\n')
    path.chmod(0o755)
    return path


def count_selected(python: Path, tests: Path, files: list[str]) -> int:
    out = subprocess.run([str(python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not slow", *files], cwd=tests, capture_output=True, text=True).stdout
    found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out)
    return int(found.group(1)) if found else 0


def run_file(python: Path, tests: Path, file: str, out: Path, wrapper: Path, timeout: int) -> list[Case]:
    stem = Path(file).stem
    xml, misses = out / f"{stem}.xml", out / f"{stem}.misses.json"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(wrapper), "LLAMACPP_SUITE_MISSES": str(misses),
           "PYTHONPATH": str(REPO), TEMPLATES_ENV: str(tests.parent.parent / "models" / "templates")}
    with open(out / f"{stem}.log", "w") as log:
        subprocess.run([str(python), "-m", "pytest", file, "-m", "not slow", "-p", "no:cacheprovider",
                        "-p", "bench.llamacpp_suite.plugin", f"--timeout={timeout}", "-rN",
                        f"--junitxml={xml}", "-o", "junit_logging=all"],
                       cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    if not xml.exists():
        return [Case(f"{file}::(collection)", "errors", "no junit report", "collection error")]
    seen = json.loads(misses.read_text()) if misses.exists() else {}
    return parse_junit(xml.read_text(), seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llamacpp_suite", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="unit/test_*.py files (default: all)")
    p.add_argument("--home", type=Path, default=DEFAULT_HOME, help="sdist, tests and their venv")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test (pytest-timeout)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "llamacpp_suite")
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/fidelity.md")
    p.add_argument("--reparse", action="store_true",
                   help="classify the reports already under --out again instead of running the tests")
    args = p.parse_args(argv)
    if args.reparse:
        return publish(reparse(args.out), args.out, args.no_docs or bool(args.files))
    tests = fetch_tests(args.home)
    fetch_templates(args.home)
    python = ensure_venv(args.home, tests)
    wrapper = write_wrapper(args.home)
    (tests / "tmp").mkdir(exist_ok=True)  # LLAMA_CACHE=tmp: the real server creates it with its first download
    files = args.files or sorted(str(f.relative_to(tests)) for f in (tests / "unit").glob("test_*.py"))
    args.out.mkdir(parents=True, exist_ok=True)
    total = count_selected(python, tests, files)
    print(f"{total} tests selected in {len(files)} files", flush=True)
    results: dict[str, list[Case]] = {}
    start, done = time.monotonic(), 0
    for i, file in enumerate(files, 1):
        results[file] = run_file(python, tests, file, args.out, wrapper, args.timeout)
        done += len(results[file])
        elapsed = time.monotonic() - start
        eta = elapsed / done * (total - done) if done else 0
        passed = sum(c.outcome == "passed" for c in results[file])
        print(f"[{i}/{len(files)}] {file}: {passed}/{len(results[file])} passed; {done}/{total} tests, "
              f"{elapsed / 60:.1f} min, ETA {max(eta, 0) / 60:.1f} min", flush=True)
    return publish(results, args.out, args.no_docs or bool(args.files))


def reparse(out: Path) -> dict[str, list[Case]]:
    results = {}
    for xml in sorted(out.glob("test_*.xml")):
        misses = out / f"{xml.stem}.misses.json"
        seen = json.loads(misses.read_text()) if misses.exists() else {}
        results[f"unit/{xml.stem}.py"] = parse_junit(xml.read_text(), seen)
    return results


def publish(results: dict[str, list[Case]], out: Path, no_docs: bool) -> int:
    (out / "results.json").write_text(json.dumps({f: [vars(c) for c in cs] for f, cs in results.items()}, indent=1))
    section = render(results, COMMAND)
    print(section.splitlines()[2])
    if not no_docs:
        doc = REPO / "docs" / "fidelity.md"
        doc.write_text(replace_section(doc.read_text(), section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
