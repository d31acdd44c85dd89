"""What `-m MODEL.gguf` names. It lives below the HTTP surface, in the engine factory
(fake_engines/factory/gguf.py); re-exported here for the HTTP surface."""

from __future__ import annotations

from fake_engines.factory.gguf import FTYPE_NAMES, QUANT_BITS, GgufModel, ModelFileError, load_model

__all__ = ["FTYPE_NAMES", "QUANT_BITS", "GgufModel", "ModelFileError", "load_model"]
