"""`flotilla sim sweep GRID.yaml`: a grid of `flotilla sim` runs on local processes or a Ray cluster."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flotilla.cli_errors import fail, positive_int

HELP = "run the cross product of flotilla sim flags (policies, autoscalers, fleet sizes, traces, cold starts)"
DESCRIPTION = """\
Run every cell of a grid, the cross product of the values of `flotilla sim` flags, each cell one
`flotilla sim` run, in parallel: local processes by default, or the tasks of a Ray cluster. Writes
one results file (PREFIX.json: each cell's values, command line and loadgen result JSON) and one
table (PREFIX.csv, also printed). The same grid gives the same numbers whatever the worker count.

grid file (flags of flotilla sim without their dashes; paths as flotilla sim reads them):
  sim:                       # shared by every cell
    engine: fixed
    slo: ttft=1,tpot=0.05
  grid:                      # the axes: the cells are the cross product of these values
    policy: [round-robin, least-outstanding]
    autoscale: [none, kpa]
    replicas: [1, 2, 3]
    trace: [tests/data/seed/example9.jsonl]
    cold-start: [30, 60]

examples:
  flotilla sim sweep sim/examples/sweep.yaml --workers 4
  flotilla sim sweep grid.yaml --ray auto            # the cluster `ray start` runs here
  flotilla sim sweep grid.yaml --ray ray://head:10001 -o results/azure
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("grid", type=Path, metavar="GRID.yaml", help="the grid file")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="local processes (default: the CPUs of this machine; 1 runs in this process); "
                        "with --ray local, the CPUs of that cluster")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the cells as tasks on a Ray cluster: `local` (a new one on this machine), "
                        "`auto` (the one `ray start` runs here), or ray://HOST:PORT; needs "
                        "pip install 'flotilla[ray]'")
    p.add_argument("-o", "--output", metavar="PREFIX",
                   help="write PREFIX.json and PREFIX.csv (default: the grid file's name, in this folder)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a bar over the cells with the total and an ETA on stderr (default: when stderr "
                        "is a terminal)")


def run(args: argparse.Namespace) -> int:
    from fake_engines.factory import ModelDoesNotFit
    from sim import sweep

    try:
        grid = sweep.load_grid(args.grid)
    except (sweep.GridError, OSError) as exc:
        return fail("flotilla sim sweep", str(exc))
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    try:
        with sweep.progress_bar(len(grid.cells), show) as bar:
            if args.ray:
                runs = sweep.run_ray(grid.cells, args.ray, bar.update, num_cpus=args.workers)
            else:
                runs = sweep.run_local(grid.cells, args.workers or os.cpu_count() or 1, bar.update)
    except (sweep.GridError, ValueError, KeyError, OSError, ModelDoesNotFit) as exc:
        return fail("flotilla sim sweep", str(exc))
    prefix = args.output or args.grid.stem
    results, table = sweep.write(grid, runs, prefix)
    print(sweep.table_text(grid, runs))
    print(f"{len(grid.cells)} cells: {results} (every run), {table} (this table)")
    return 0
