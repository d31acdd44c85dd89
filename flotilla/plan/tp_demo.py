"""`flotilla plan tp-demo`: tensor-parallel splits on small integer matrices (Examples 2 and 3)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from fake_engines.perf.tensor_split import column_split, lesson_column_inputs, lesson_mlp_inputs, mlp_split
from flotilla.plan.units import si_json

HELP = "show a column split and a column-then-row MLP split on two simulated devices"
DESCRIPTION = """\
Tensor parallelism on numbers small enough to check by hand.
1. y = x W with W's output columns split over devices: the concatenated parts equal one device.
2. y = relu(x A) B with A split by columns and B by rows: the sum of the partials (one all-reduce)
   equals one device; splitting A by rows instead puts ReLU before the sum and is wrong.

examples:
  flotilla plan tp-demo
  flotilla plan tp-demo --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=2, choices=(1, 2),
                        help="simulated devices sharing the 6 output columns and 8 hidden units (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the text")


def show(m: np.ndarray, width: int) -> str:
    """Rows as [ v v v ], each value right-aligned in ``width`` characters."""
    return "".join(" [" + "".join(f"{v:{width}.0f}" for v in row) + " ]" for row in m)


def run(args: argparse.Namespace) -> int:
    col = column_split(*lesson_column_inputs(), devices=args.devices)
    mlp = mlp_split(*lesson_mlp_inputs(), devices=args.devices)
    if args.json:
        print(json.dumps(si_json(_as_json(col, mlp)), indent=2))
        return 0
    print("one device   :" + show(col.full, 4))
    for d, part in enumerate(col.parts):
        print(f"device {d}     :" + show(part, 4))
    print("concatenated :" + show(col.gathered, 4))
    print(f"equal to one device: {str(col.equal).lower()}")
    print(f"weights per device: {col.weights_per_device} of {col.weights_total}; both devices need all of x")
    print()
    for d, part in enumerate(mlp.partials):
        print(f"device {d} partial :" + show(part, 5))
    print("all-reduce sum   :" + show(mlp.reduced, 5))
    print("one device       :" + show(mlp.reference, 5))
    print(f"equal: {str(mlp.equal).lower()}")
    print(f"A split by rows, ReLU before the sum, equal: {str(mlp.wrong_equal).lower()}")
    return 0


def _as_json(col, mlp) -> dict:
    return {
        "column_split": {"one_device": col.full.tolist(), "devices": [p.tolist() for p in col.parts],
                         "concatenated": col.gathered.tolist(), "equal": col.equal,
                         "weights_per_device": col.weights_per_device, "weights_total": col.weights_total},
        "mlp_split": {"partials": [p.tolist() for p in mlp.partials], "all_reduce_sum": mlp.reduced.tolist(),
                      "one_device": mlp.reference.tolist(), "equal": mlp.equal,
                      "rows_split_equal": mlp.wrong_equal},
    }
