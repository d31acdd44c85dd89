"""`flotilla plan TOPIC`: capacity and speed questions answered by `fake_engines.perf`.

Each topic is a module in this package exposing ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; the module only parses flags, calls the perf library and formats.
"""

from __future__ import annotations

import argparse
import importlib

HELP = "answer capacity questions: memory, GPUs, parallel layouts, step times, cold starts"
DESCRIPTION = (
    "Capacity planning from GPU memory, bandwidth, compute and interconnect.\n"
    "Every topic prints a human table; add --json for machines."
)

# topic -> module in this package
TOPICS: dict[str, str] = {
    "fit": "fit",
    "tp-demo": "tp_demo",
    "allreduce": "allreduce",
    "pipeline": "pipeline",
    "experts": "experts",
    "llamacpp-split": "llamacpp_split",
    "vllm-layout": "vllm_layout",
    "choose": "choose",
    "lora": "lora",
    "coldstart": "coldstart",
    "step": "step",
    "autoscale": "autoscale",
    "pd": "pd",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="topic", metavar="TOPIC", required=True)
    for topic, module in TOPICS.items():
        mod = importlib.import_module(f"{__name__}.{module}")
        p = sub.add_parser(topic, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_topic_run=mod.run)


def run(args: argparse.Namespace) -> int:
    return int(args._topic_run(args) or 0)
