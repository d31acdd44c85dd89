"""Nothing in the repository reads outside it: a fresh clone, alone in an empty folder, runs its tests,
benchmarks and demo. Inputs live under tests/data/ (traces, engine captures, calibration)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini"}
CODE_NAMES = {"Makefile", "Dockerfile"}
SKIP_DIRS = {".git", ".venv", "__pycache__", "build", "dist", ".peers", ".pytest_cache", ".ruff_cache"}

ESCAPES = (
    (re.compile(r"(?:^|[\s\"'=(:,])\.\./"), "a relative path climbing out with ../"),
    (re.compile(r"/\s*[\"']\.\.[\"']|Path\([\"']\.\.[\"']\)|\bos\.pardir\b"), "a '..' path component"),
    (re.compile(r"\b(?:REPO|REPO_ROOT|ROOT|repo|repo_root)\.parent\b"), "the parent of the repository root"),
)
"""What a line reaching outside the repository looks like, and why it does."""

_FILE_CHAIN = re.compile(r"__file__\)*(?:\.resolve\(\)|\.absolute\(\))?(?P<chain>(?:\.parent\b(?!s)|\.parents\[\d+\])+)")
_STEP = re.compile(r"\.parent\b(?!s)|\.parents\[(\d+)\]")


def levels_up(line: str) -> int:
    """How many folders above the file a `Path(__file__)...parent/parents[k]` or
    `dirname(...dirname(__file__))` chain on this line goes (0 when it has none)."""
    if "__file__" not in line:
        return 0
    up = line.count("dirname(")
    for chain in _FILE_CHAIN.finditer(line):
        steps = sum(int(m.group(1)) + 1 if m.group(1) else 1 for m in _STEP.finditer(chain.group("chain")))
        up = max(up, steps)
    return up


def names_a_sibling(line: str, parent: Path = REPO.parent, repo_name: str = REPO.name) -> bool:
    """Whether `line` spells an absolute path into a folder or file that sits beside the repository
    on this machine (the folder holding the clone is read at run time, however it is spelled). Only
    siblings that exist count: a clone in a shared folder such as /tmp must not fail on container
    paths like /tmp/requirements.txt; one at the file-system root has no siblings to name."""
    if parent == Path(parent.anchor):
        return False
    for match in re.finditer(rf"(?<![\w.-]){re.escape(str(parent))}/([\w.-]+)", line):
        if match.group(1) != repo_name and (parent / match.group(1)).exists():
            return True
    return False


INPUT_NOT_READ = "# an input, not a path read"
"""A line carrying this comment spells a path as data for the code under test (a client's path-
traversal attempt, upstream's own argv), not a place the repository reads."""


def escapes(rel: Path, line: str) -> str | None:
    """Why `line` of the file at `rel` (relative to the repository) reaches outside it, or None."""
    if line.rstrip().endswith(INPUT_NOT_READ):
        return None
    if levels_up(line) > len(rel.parts):
        return f"climbs {levels_up(line)} folders above {rel}, past the repository root"
    if names_a_sibling(line):
        return "an absolute path beside the repository"
    return next((why for pattern, why in ESCAPES if pattern.search(line)), None)


def code_files() -> list[Path]:
    """Tracked and new (not ignored) code files, relative to the repository root."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True, timeout=60).stdout.decode()
        paths = [Path(p) for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # an export without .git: walk the tree instead
        paths = [p.relative_to(REPO) for p in REPO.rglob("*") if p.is_file()
                 and not SKIP_DIRS & set(p.relative_to(REPO).parts)]
    return sorted(p for p in paths if (p.suffix in CODE_SUFFIXES or p.name in CODE_NAMES) and (REPO / p).is_file())


def test_no_code_or_test_references_a_path_outside_the_repository() -> None:
    this = Path(__file__).resolve().relative_to(REPO)
    found = [f"{rel}:{n}: {why}: {line.strip()}"
             for rel in code_files() if rel != this
             for n, line in enumerate((REPO / rel).read_text(errors="replace").splitlines(), 1)
             if (why := escapes(rel, line))]
    assert not found, "\n".join(found)


def test_the_inputs_the_tests_compare_against_are_in_the_repository() -> None:
    data = REPO / "tests" / "data"
    assert (data / "calibration" / "h200-llama-3.1-8b.json").is_file()
    assert (data / "real-engines" / "vllm" / "029_metrics_after_basic_requests.http").is_file()
    assert (data / "traces" / "AzureLLMInferenceTrace_conv.before1845.csv").is_file()
    for folder in ("calibration", "real-engines", "traces"):
        readme = (data / folder / "README.md").read_text()
        assert "icence" in readme or "icense" in readme, f"tests/data/{folder}/README.md names no licence"


@pytest.mark.parametrize("rel, line", [
    ("tests/conftest.py", 'SIBLING = REPO.parent / "beside"'),
    ("bench/sim_speed/__main__.py", 'TRACE = REPO / ".." / "beside" / "traces" / "a.csv"'),
    ("bench/peers/quality.py", '"--trace", "../beside/traces/a.csv",'),
    ("bench/x/__main__.py", "ROOT = Path(__file__).resolve().parents[3]"),
    ("tests/conftest.py", "REPO = Path(__file__).resolve().parent.parent.parent"),
    ("tests/a/b.py", "HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))"),
    ("tests/a/b.py", "REPO = Path(__file__).resolve().parents[2].parent"),
    ("Makefile", "\tcp ../beside/calibration/x.json tests/data/"),
    ("tests/a/b.py", 'p = Path("..") / "elsewhere"'),
])
def test_each_way_out_of_the_repository_is_caught(rel: str, line: str) -> None:
    assert escapes(Path(rel), line)
    assert escapes(Path(rel), line + "  # a note")  # only the one marked comment lets a line through


def test_a_path_marked_as_an_input_is_not_a_way_out() -> None:
    assert escapes(Path("tests/a/b.py"), f'bad = {{"filename": "../escape"}}  {INPUT_NOT_READ}') is None


@pytest.mark.parametrize("rel, line", [
    ("bench/peers/launch.py", "REPO = Path(__file__).resolve().parents[2]"),
    ("tests/conftest.py", "REPO = Path(__file__).resolve().parent.parent"),
    ("deploy/grafana/build_dashboards.py", 'OUT = Path(__file__).resolve().parent / "dashboards"'),
    ("bench/soak/__main__.py", "    args.out.parent.mkdir(parents=True, exist_ok=True)"),
    ("proxy/fleetfile.py", "    return parse_up_fleet(Path(path).read_text(), Path(path).resolve().parent)"),
    ("fake_engines/perf/experts.py", '    """experts 0..E/n-1 on device 0, the next block on device 1, ..."""'),
    ("loadgen/synthetic.py", "            shared = (0,) if self.system_tokens else ()"),
    ("flotilla/up_cmd.py", '        _say("stopping the fleet ...")'),
])
def test_paths_inside_the_repository_and_ordinary_text_pass(rel: str, line: str) -> None:
    assert escapes(Path(rel), line) is None


def test_an_absolute_path_into_a_sibling_of_the_clone_is_caught_and_one_that_names_nothing_there_passes(
        tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    beside = dict(parent=tmp_path, repo_name="repo")
    assert names_a_sibling(f'TRACE = Path("{tmp_path}/shared/traces/a.csv")', **beside)
    assert names_a_sibling(f"cp {tmp_path}/shared/x.json tests/data/", **beside)
    # a clone in a shared scratch folder: paths there that name nothing beside it are someone's data
    assert not names_a_sibling(f'"--download-dir", "{tmp_path}/hf",', **beside)
    assert not names_a_sibling(f'"endpoint": "ipc://{tmp_path}/kv.sock"', **beside)
    assert not names_a_sibling(f'ROOT = "{tmp_path}/repo/tests"', **beside)
    assert not names_a_sibling("COPY /requirements.txt /tmp/", parent=Path("/"), repo_name="repo")
