"""`flotilla sim sweep GRID.yaml`: the cross product of `flotilla sim` flags, one run per cell, in parallel.

A grid file names flags of `flotilla sim` without their dashes:

    sim:                          # flags every cell shares
      engine: fixed
      slo: ttft=1,tpot=0.05
    grid:                         # the axes: a flag and its values; the cells are their cross product
      trace: [a.jsonl, b.jsonl]
      policy: [round-robin, least-outstanding]
      autoscale: [none, kpa]
      replicas: [1, 2]
      cold-start: [30, 60]

Each cell is one `flotilla sim` command line, run by `flotilla.sim_cmd.simulate_args`: the very
code a single `flotilla sim` runs. Cells share nothing and every run is seeded by its flags, so a
cell's numbers do not depend on the process, the machine or the order it runs in; the results
are kept in grid order whatever finishes first.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SECTIONS = ("sim", "grid")
OWN_FLAGS = frozenset({"json", "output", "plot", "pareto", "progress", "help"})
"""`flotilla sim` flags the sweep itself owns (its output and progress), not a cell's."""
Progress = Callable[[int], None]
"""Called with the number of cells that just finished."""


class GridError(ValueError):
    """The grid file cannot be run: the message names the key or cell at fault."""


@dataclass(frozen=True)
class Cell:
    """One point of the grid: its axis values and the `flotilla sim` command line that runs it."""

    index: int
    values: tuple[tuple[str, Any], ...]
    """(axis, value) in the grid's axis order."""
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return " ".join(f"{axis}={value}" for axis, value in self.values)


@dataclass(frozen=True)
class Grid:
    path: Path
    sim: dict[str, Any]
    axes: dict[str, list[Any]]
    cells: tuple[Cell, ...]


class _RaisingParser(argparse.ArgumentParser):
    """`flotilla sim`'s parser, with errors raised (a cell's error names the cell) instead of exits."""

    def error(self, message: str) -> Any:
        raise GridError(message)


def sim_parser() -> argparse.ArgumentParser:
    from flotilla import sim_cmd

    parser = _RaisingParser(prog="flotilla sim", add_help=False)
    sim_cmd.add_arguments(parser)
    return parser


def _option(parser: argparse.ArgumentParser, name: str) -> str:
    """The option string of flag `name` (`replicas`, `cold_start`, `tp`, ...)."""
    for spelled in (f"--{name.replace('_', '-')}", f"-{name}"):
        if spelled in parser._option_string_actions:
            return spelled
    raise GridError(f"{name}: not a flag of flotilla sim (see flotilla sim --help)")


def _flag_args(parser: argparse.ArgumentParser, name: str, value: Any) -> list[str]:
    """The command-line words of one flag's value: true -> --flag, false -> --no-flag (or nothing),
    null -> nothing, a list -> the flag repeated. Paths are read as `flotilla sim` reads them,
    relative to the current folder."""
    if name.replace("_", "-") in OWN_FLAGS:
        raise GridError(f"{name}: the sweep writes its own results and progress; use flotilla sim sweep's flags")
    option = _option(parser, name)
    if value is None:
        return []
    if isinstance(value, list):
        return [word for item in value for word in _flag_args(parser, name, item)]
    if value is True:
        return [option]
    if value is False:
        negated = "--no-" + option[2:]
        return [negated] if negated in parser._option_string_actions else []
    return [option, str(value)]


def _mapping(data: Any, key: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise GridError(f"{key}: must be a mapping of flotilla sim flags to values")
    return dict(data)


def parse_grid(data: Any, path: Path) -> Grid:
    """A grid from a grid file's YAML; every cell's command line is checked by `flotilla sim`'s
    own parser, so a bad value fails before anything runs."""
    if not isinstance(data, dict):
        raise GridError(f"{path}: must be a mapping with `sim:` and `grid:`")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise GridError(f"{unknown[0]}: unknown key; known: {', '.join(SECTIONS)}")
    sim, axes = _mapping(data.get("sim"), "sim"), _mapping(data.get("grid"), "grid")
    if not axes:
        raise GridError("grid: name at least one flag and its values")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise GridError(f"grid.{axis}: must be a non-empty list of values")
        if axis in sim:
            raise GridError(f"{axis}: in both sim: and grid:; keep it in one")
    parser = sim_parser()
    shared = [w for name, value in sim.items() for w in _flag_args(parser, name, value)]
    cells = []
    for index, combo in enumerate(itertools.product(*axes.values())):
        values = tuple(zip(axes, combo, strict=True))
        argv = (*shared, *(w for name, value in values for w in _flag_args(parser, name, value)))
        cell = Cell(index, values, tuple(argv))
        try:
            parser.parse_args(argv)
        except GridError as exc:
            raise GridError(f"cell {cell.name}: {exc}") from None
        cells.append(cell)
    return Grid(path, sim, axes, tuple(cells))


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise GridError(f"{path}: not YAML: {exc}") from None
    return parse_grid(data, path)


# --- running cells -----------------------------------------------------------------------------

def run_cell(argv: Sequence[str]) -> list[dict[str, Any]]:
    """The runs of one cell, as loadgen result JSON: what `flotilla sim ARGV --json` prints."""
    from flotilla.sim_cmd import simulate_args

    args = sim_parser().parse_args(list(argv))
    args.progress = False  # the sweep shows one bar for the cells
    return [r.to_json() for r in simulate_args(args)]


def run_local(cells: Sequence[Cell], workers: int, done: Progress) -> list[list[dict[str, Any]]]:
    """Every cell on `workers` local processes (1: in this process), results in grid order."""
    if workers <= 1:
        out = []
        for cell in cells:
            out.append(run_cell(cell.argv))
            done(1)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[int, list[dict[str, Any]]] = {}
    # spawn: every worker a fresh interpreter, as a Ray worker is, whatever the platform's default
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_cell, cell.argv): cell.index for cell in cells}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done(1)
    return [results[cell.index] for cell in cells]


RAY_MISSING = "--ray needs Ray: pip install 'flotilla[ray]'"


def run_ray(cells: Sequence[Cell], address: str, done: Progress,
            num_cpus: int | None = None) -> list[list[dict[str, Any]]]:
    """Every cell as a Ray task on the cluster at `address` (`local`: a new single-node cluster
    on this machine with `num_cpus` CPUs; `auto`: the one `ray start` runs here; `ray://HOST:PORT`:
    a remote one, whose nodes have Flotilla installed and the traces at the same paths)."""
    try:
        import ray
    except ImportError:
        raise GridError(RAY_MISSING) from None
    started = not ray.is_initialized()
    if started:
        options: dict[str, Any] = {"num_cpus": num_cpus} if address == "local" and num_cpus else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, **options)
    try:
        task = ray.remote(num_cpus=1)(run_cell)
        refs = {task.remote(list(cell.argv)): cell.index for cell in cells}
        results: dict[int, list[dict[str, Any]]] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[refs[ref]] = ray.get(ref)
                done(1)
        return [results[cell.index] for cell in cells]
    finally:
        if started:
            ray.shutdown()


# --- the results file and the table -------------------------------------------------------------

def results_json(grid: Grid, runs: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The results file: the grid, then per cell its values, command line and runs."""
    return {"grid": str(grid.path), "sim": grid.sim, "axes": grid.axes,
            "cells": [{"index": cell.index, "values": dict(cell.values), "argv": list(cell.argv),
                       "runs": list(cell_runs)} for cell, cell_runs in zip(grid.cells, runs, strict=True)]}


def _get(data: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping) or data.get(key) is None:
            return None
        data = data[key]
    return data


# column -> (how it reads from one run's JSON, how the text table shows it)
def _count(value: Any) -> Any:
    return len(value) if isinstance(value, list) else value


METRICS: dict[str, tuple[Callable[[Mapping[str, Any]], Any], str]] = {
    "run": (lambda r: _get(r, "meta", "label"), "{}"),
    "reqs": (lambda r: _get(r, "summary", "num_requests"), "{}"),
    "SLO attainment %": (lambda r: None if (v := _get(r, "summary", "slo_attainment")) is None else 100 * v,
                         "{:.1f}"),
    "replica-s": (lambda r: _get(r, "meta", "replica_seconds"), "{:.0f}"),
    "GPU-s": (lambda r: _get(r, "meta", "gpu_seconds"), "{:.0f}"),
    "scale events": (lambda r: _count(_get(r, "meta", "scale_events")), "{}"),
    "peak replicas": (lambda r: _get(r, "meta", "peak_ready_replicas"), "{}"),
    "TTFT p99 ms": (lambda r: None if (v := _get(r, "summary", "ttft_s", "p99")) is None else 1e3 * v, "{:.1f}"),
    "E2E p90 ms": (lambda r: None if (v := _get(r, "summary", "e2e_s", "p90")) is None else 1e3 * v, "{:.1f}"),
    "goodput/s": (lambda r: _get(r, "summary", "goodput_per_s"), "{:.3f}"),
}


def rows(grid: Grid, runs: Sequence[Sequence[Mapping[str, Any]]]) -> Iterator[list[Any]]:
    """One row per run: the cell's axis values, then METRICS (None where a run has no figure)."""
    for cell, cell_runs in zip(grid.cells, runs, strict=True):
        for run in cell_runs:
            yield [value for _, value in cell.values] + [read(run) for read, _ in METRICS.values()]


def header(grid: Grid) -> list[str]:
    return [*grid.axes, *METRICS]


def table_csv(grid: Grid, runs: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header(grid))
    writer.writerows([["" if v is None else v for v in row] for row in rows(grid, runs)])
    return out.getvalue()


def table_text(grid: Grid, runs: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    formats = ["{}"] * len(grid.axes) + [fmt for _, fmt in METRICS.values()]
    cells = [[("-" if v is None else fmt.format(v)) for v, fmt in zip(row, formats, strict=True)]
             for row in rows(grid, runs)]
    head = header(grid)
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(head)]

    def line(words: Sequence[str]) -> str:  # the axes and the run's label to the left, figures to the right
        return "  ".join(w.ljust(n) if i <= len(grid.axes) else w.rjust(n)
                         for i, (w, n) in enumerate(zip(words, widths, strict=True))).rstrip()
    return "\n".join([line(head), "-" * len(line(head)), *(line(r) for r in cells),
                      "latencies in ms and seconds of virtual time"])


def write(grid: Grid, runs: Sequence[Sequence[Mapping[str, Any]]], prefix: str | Path) -> tuple[Path, Path]:
    """PREFIX.json (every run) and PREFIX.csv (the table)."""
    results, table = Path(f"{prefix}.json"), Path(f"{prefix}.csv")
    results.write_text(json.dumps(results_json(grid, runs), indent=1) + "\n", encoding="utf-8")
    table.write_text(table_csv(grid, runs), encoding="utf-8")
    return results, table


def progress_bar(total: int, show: bool) -> Any:
    """A bar over the cells with the total and an ETA, on stderr."""
    from tqdm import tqdm

    return tqdm(total=total, desc="sweep", unit="cell", disable=not show, file=sys.stderr, smoothing=0)
