"""`flotilla sim sweep`: a grid file's cells are `flotilla sim` command lines, run anywhere with the
same numbers: in this process, on two local processes, or as Ray tasks."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flotilla.cli import main
from sim import sweep
from tests.conftest import REPO

# 24 tiny cells: a burst of short requests through look-alike vLLM on an RTX 4090, so the
# autoscalers, cold starts and fleet sizes give different numbers, each cell well under a second
GRID: dict[str, Any] = {
    "sim": {"synthetic": "poisson:rate=1@0/16@8/1@16,duration=24,input=200,output=30", "gpu": "rtx4090",
            "max-model-len": 8192, "slo": "ttft=0.5,tpot=0.05"},
    "grid": {"policy": ["round-robin", "least-outstanding"], "autoscale": [None, "seed:interval_s=5", "kpa"],
             "replicas": [1, 2], "cold-start": [5, 20]},
}


def _grid_file(folder: Path, grid: dict[str, Any] = GRID) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def _sweep(grid: Path, prefix: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flotilla", "sim", "sweep", str(grid), "-o", str(prefix),
                           "--progress", *flags], capture_output=True, text=True, timeout=600, cwd=prefix.parent)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    folder = tmp_path_factory.mktemp("sweep")
    out = _sweep(_grid_file(folder), folder / "two", "--workers", "2")
    assert out.returncode == 0, out.stderr
    return folder / "two", out


def _cells(prefix: Path) -> list[dict[str, Any]]:
    return json.loads(Path(f"{prefix}.json").read_text())["cells"]


def test_cells_are_the_cross_product_of_the_axes_in_grid_order(tmp_path: Path) -> None:
    grid = sweep.load_grid(_grid_file(tmp_path))
    assert len(grid.cells) == 24
    assert [c.index for c in grid.cells] == list(range(24))
    first, last = grid.cells[0], grid.cells[-1]
    assert dict(first.values) == {"policy": "round-robin", "autoscale": None, "replicas": 1, "cold-start": 5}
    assert dict(last.values) == {"policy": "least-outstanding", "autoscale": "kpa", "replicas": 2, "cold-start": 20}
    assert "--autoscale" not in first.argv  # null: the flag is not given, a fixed fleet
    assert last.argv[-8:] == ("--policy", "least-outstanding", "--autoscale", "kpa", "--replicas", "2",
                              "--cold-start", "20")


def test_flags_take_their_values_as_flotilla_sim_does(tmp_path: Path) -> None:
    grid = sweep.load_grid(_grid_file(tmp_path, {
        "sim": {"engine": "fixed", "trace": "tests/data/seed/example9.jsonl", "enable-prefix-caching": False,
                "catalogue": ["a.yaml", "b.yaml"], "seed": None},
        "grid": {"replicas": [1, 2]}}))
    assert grid.cells[1].argv == ("--engine", "fixed", "--trace", "tests/data/seed/example9.jsonl",
                                  "--no-enable-prefix-caching", "--catalogue", "a.yaml", "--catalogue", "b.yaml",
                                  "--replicas", "2")


@pytest.mark.parametrize(("grid", "says"), [
    ({"grid": {"replicas": [1, 0]}, "sim": {"engine": "fixed", "synthetic": "poisson:rate=1,duration=5"}},
     "cell replicas=0: argument --replicas: invalid value 0"),
    ({"grid": {"replicaz": [1]}}, "replicaz: not a flag of flotilla sim"),
    ({"grid": {"replicas": 2}}, "grid.replicas: must be a non-empty list"),
    ({"grid": {"replicas": [1]}, "sim": {"replicas": 2}}, "replicas: in both sim: and grid:"),
    ({"grid": {"replicas": [1]}, "sim": {"json": True}}, "json: the sweep writes its own results"),
    ({"grid": {"replicas": [1]}, "runs": 3}, "runs: unknown key"),
])
def test_a_bad_grid_is_one_error_line_naming_the_key_or_cell(tmp_path: Path, grid: dict[str, Any], says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "sweep", str(_grid_file(tmp_path, grid)), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flotilla sim sweep: error: ") and says in err, err
    assert err.count("\n") == 1 and not (tmp_path / "out.json").exists()


def test_two_workers_write_one_results_file_one_table_and_show_progress_with_a_total(
        two_workers: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    prefix, out = two_workers
    cells = _cells(prefix)
    assert [c["index"] for c in cells] == list(range(24)) and all(len(c["runs"]) == 1 for c in cells)
    table = list(csv.DictReader(io.StringIO(Path(f"{prefix}.csv").read_text())))
    assert len(table) == 24 and list(table[0])[:4] == ["policy", "autoscale", "replicas", "cold-start"]
    assert "24/24" in out.stderr.replace(" ", "")  # the bar: done out of the total, with an ETA
    assert out.stdout.count("\n") >= 24 + 2 and "least-outstanding + kpa" in out.stdout
    # the axes matter: the grid is no 24 copies of one run
    costs, ttfts = {row["replica-s"] for row in table}, {row["TTFT p99 ms"] for row in table}
    assert len(costs) > 5 and len(ttfts) > 2, (costs, ttfts)


def test_a_cell_is_exactly_the_flotilla_sim_run_of_its_command_line(
        two_workers: tuple[Path, subprocess.CompletedProcess[str]], capsys: pytest.CaptureFixture[str]) -> None:
    cell = _cells(two_workers[0])[21]  # least-outstanding, kpa, 2 replicas, cold start 20 s
    assert main(["sim", *cell["argv"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == cell["runs"]


def test_one_worker_in_this_process_gives_the_numbers_of_two(
        two_workers: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    grid = sweep.load_grid(_grid_file(tmp_path))
    runs = sweep.run_local(grid.cells, 1, lambda n: None)
    assert json.loads(json.dumps(sweep.results_json(grid, runs)))["cells"] == _cells(two_workers[0])


@pytest.mark.slow
def test_ray_local_cluster_gives_the_numbers_of_two_local_workers(
        two_workers: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is the optional extra flotilla[ray]")
    out = _sweep(_grid_file(tmp_path), tmp_path / "ray", "--ray", "local", "--workers", "2")
    assert out.returncode == 0, out.stderr
    assert _cells(tmp_path / "ray") == _cells(two_workers[0])
    assert Path(f"{tmp_path / 'ray'}.csv").read_text() == Path(f"{two_workers[0]}.csv").read_text()


def test_ray_missing_is_one_line_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    grid = {"sim": {"engine": "fixed", "trace": str(REPO / "tests/data/seed/example9.jsonl")},
            "grid": {"replicas": [1]}}
    assert main(["sim", "sweep", str(_grid_file(tmp_path, grid)), "--ray", "auto"]) == 2
    assert capsys.readouterr().err == f"flotilla sim sweep: error: {sweep.RAY_MISSING}\n"


def test_the_example_grid_in_the_repository_parses() -> None:
    grid = sweep.load_grid(REPO / "sim" / "examples" / "sweep.yaml")
    assert len(grid.cells) >= 24
    assert {"policy", "autoscale", "replicas", "cold-start"} <= set(grid.axes)


def test_a_missing_grid_file_or_grid_argument_is_one_error_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "sweep", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flotilla sim sweep: error: ") and "nope.yaml" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exited:
        main(["sim", "sweep"])
    assert exited.value.code == 2
    assert "flotilla sim sweep: error: the following arguments are required: GRID.yaml" in capsys.readouterr().err
