"""llama-server's pooling flags: embeddings, reranking and how /infill lays out its prompt.

They decide which pooling routes answer and how (fake_engines/llamacpp/embeddings.py,
fake_engines/llamacpp/infill.py read the config fields); the engine's timing does not depend on them.
"""

from __future__ import annotations

import argparse
from typing import Any

POOLINGS = ("none", "mean", "cls", "last", "rank")
"""--pooling's values (common/arg.cpp)."""


def add_pooling_flags(p: argparse.ArgumentParser) -> None:
    """The flags as llama-server spells them; --reranking implies --embedding and --pooling rank."""
    g = p.add_argument_group("embeddings and reranking")
    g.add_argument("--embedding", "--embeddings", action="store_true",
                   help="serve the embedding routes (/embeddings, /v1/embeddings; 501 otherwise)")
    g.add_argument("--rerank", "--reranking", dest="reranking", action="store_true",
                   help="serve the rerank routes (/rerank, /v1/rerank); implies --embedding and --pooling rank")
    g.add_argument("--pooling", choices=POOLINGS, default="", help="pooling for embeddings (default: the model's)")
    g.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="embedding normalisation: -1 none, 0 max absolute int16, 1 taxicab, 2 euclidean, >2 p-norm")
    g.add_argument("--spm-infill", action="store_true", help="/infill puts the suffix before the prefix (SPM)")


def pooling_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LlamaServerConfig fields of these flags."""
    return {"embedding": args.embedding or args.reranking, "pooling": "rank" if args.reranking else args.pooling,
            "embd_normalize": args.embd_normalize, "spm_infill": args.spm_infill}
