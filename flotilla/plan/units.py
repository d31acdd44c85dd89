"""One unit convention for every `flotilla plan TOPIC --json`: SI base units, the unit in the
key name (`_bytes`, `_s`, `_bytes_per_s`), one spelling per quantity (`weights_bytes`).

Topics keep their own figures in whatever unit their table prints; `si_json` turns a topic's
JSON document into the convention just before it is printed, so the rule lives in one place.
"""

from __future__ import annotations

from typing import Any

# key suffix -> (SI suffix, factor to the SI unit); longest suffixes are tried first
_SUFFIXES: dict[str, tuple[str, float]] = {
    "_gbps": ("_bytes_per_s", 1e9),  # GB/s, as the catalogue and --source NAME=GBPS give it
    "_gb": ("_bytes", 1e9),
    "_ms": ("_s", 1e-3),
    "_us": ("_s", 1e-6),
}
# whole names spelled two ways across topics -> the one spelling
_NAMES = {"weight_bytes": "weights_bytes", "weight_bytes_per_gpu": "weights_bytes_per_gpu"}

NON_SI_SUFFIXES = ("_gb", "_gib", "_mb", "_mib", "_kib", "_kb", "_tb", "_gbps", "_tbs", "_ms", "_us", "_tflops")
"""Key endings the convention rules out (the test over every topic checks none is printed)."""


def si_key(key: str, value: Any) -> tuple[str, Any]:
    """(`key`, `value`) in the convention: `load_gbps: 3` -> `load_bytes_per_s: 3e9`."""
    for suffix, (si, factor) in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if key.endswith(suffix):
            key = key[: -len(suffix)] + si
            value = value * factor if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            break
    return _NAMES.get(key, key), value


def si_json(doc: Any) -> Any:
    """`doc` with every key of every nested object in the convention."""
    if isinstance(doc, dict):
        return dict(si_key(str(k), si_json(v)) for k, v in doc.items())
    if isinstance(doc, list):
        return [si_json(v) for v in doc]
    return doc
