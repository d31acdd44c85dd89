"""A seeded JSON value that conforms to a JSON schema, read the way llama.cpp's
json-schema-to-grammar reads one (common/json-schema-to-grammar.cpp, SchemaConverter::visit).

llama-server turns a schema into a grammar and samples under it; the look-alike generates a
conforming value directly: the same keywords in the same order of precedence ($ref, oneOf/anyOf,
a list of types, const, enum, object with properties, allOf, array with items/prefixItems, string
pattern, formats, length and range bounds, the primitive types), and what the converter refuses is
a SchemaError with its message ("Unrecognized schema: ..." and the like), which llama-server
answers with a 400 "JSON schema conversion failed:\\n...".
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable
from re import _parser as sre_parse  # type: ignore[attr-defined]  # stdlib's own regex parser
from typing import Any

_MAX_DEPTH = 64
_PRIMITIVES = {"boolean", "number", "integer", "value", "object", "array", "uuid", "char", "string", "null"}
_WORDS = ("alpha", "beta", "john", "blue", "apple", "river", "stone", "cloud", "maple", "tiger")


class SchemaError(ValueError):
    """The schema is one llama.cpp's converter refuses."""


def dump(value: object) -> str:
    """JSON as nlohmann::json dumps it (keys sorted, no spaces): how llama.cpp quotes a schema."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _Generator:
    def __init__(self, root: object, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def resolve(self, ref: str) -> object:
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            raise SchemaError(f"Unsupported ref: {ref}")
        target = self.root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"Error resolving ref {ref}: {part} not in {dump(target)}")
            target = target[part]
        return target

    def value(self, schema: object, depth: int = 0) -> object:
        if depth > _MAX_DEPTH:  # a schema that requires itself: no finite value (a model would hit max_tokens)
            raise SchemaError(f"Schema nests deeper than {_MAX_DEPTH} levels")
        if schema is True or (isinstance(schema, dict) and not schema):
            return self.any_value(depth)
        if not isinstance(schema, dict):
            raise SchemaError(f"Unrecognized schema: {dump(schema)}")
        kind = schema.get("type")
        if "$ref" in schema:
            return self.value(self.resolve(schema["$ref"]), depth + 1)
        if "oneOf" in schema or "anyOf" in schema:
            return self.value(self.rng.choice(schema.get("oneOf") or schema["anyOf"]), depth + 1)
        if isinstance(kind, list):
            return self.value({**schema, "type": self.rng.choice(kind)}, depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        if kind in (None, "object") and ("properties" in schema or schema.get("additionalProperties", True) is not True):
            return self.object(schema, depth)
        if kind in (None, "object", "string") and "allOf" in schema:
            merged: dict[str, Any] = {}
            for item in schema["allOf"]:
                part: Any = self.resolve(item["$ref"]) if isinstance(item, dict) and "$ref" in item else item
                merged = {**merged, **part, "properties": {**merged.get("properties", {}),
                                                           **(part.get("properties") or {})}}
            return self.value(merged, depth + 1)
        if kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
            return self.array(schema, depth)
        if kind in (None, "string") and "pattern" in schema:
            return self.pattern(schema["pattern"])
        if kind in (None, "string") and schema.get("format") in _FORMATS:
            return _FORMATS[schema["format"]](self.rng)
        if kind == "string" and ("minLength" in schema or "maxLength" in schema):
            low = int(schema.get("minLength", 0))
            return self.text(low, int(schema.get("maxLength", max(low, 8))))
        if kind in ("integer", "number") and any(k in schema for k in ("minimum", "exclusiveMinimum", "maximum",
                                                                       "exclusiveMaximum")):
            return self.number(schema, kind == "integer")
        if not schema or kind == "object":
            return self.any_object(depth)
        if not isinstance(kind, str) or kind not in _PRIMITIVES:
            raise SchemaError(f"Unrecognized schema: {dump(schema)}")
        return self.primitive(kind, depth)

    def primitive(self, kind: str, depth: int) -> object:
        rng = self.rng
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "integer":
            return rng.randint(-100, 1000)
        if kind == "number":
            return round(rng.uniform(-100, 1000), 2)
        if kind == "string":
            return rng.choice(_WORDS)
        if kind == "char":
            return rng.choice(string.ascii_letters)
        if kind == "null":
            return None
        if kind == "uuid":
            return _FORMATS["uuid"](rng)
        if kind == "array":
            return [self.any_value(depth + 1) for _ in range(rng.randint(0, 2))]
        if kind == "object":
            return self.any_object(depth)
        return self.any_value(depth)

    def any_value(self, depth: int) -> object:
        kinds = ["string", "integer", "boolean", "null"] + (["array", "object"] if depth < 2 else [])
        return self.primitive(self.rng.choice(kinds), depth + 1)

    def any_object(self, depth: int) -> dict[str, object]:
        keys = self.rng.sample(_WORDS, self.rng.randint(1, 2) if depth < 2 else 0)
        return {key: self.any_value(depth + 1) for key in keys}

    def object(self, schema: dict[str, Any], depth: int) -> dict[str, object]:
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        out: dict[str, Any] = {}  # not `object`: the method of that name shadows it here
        for name, sub in properties.items():
            if name in required or (depth < 3 and self.rng.random() < 0.5):
                out[name] = self.value(sub, depth + 1)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and depth < 3 and self.rng.random() < 0.5:
            key = self.rng.choice([w for w in _WORDS if w not in out] or ["extra"])
            out[key] = self.value(extra, depth + 1)
        return out

    def array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        items = schema.get("prefixItems", schema.get("items"))
        if isinstance(items, list):
            return [self.value(item, depth + 1) for item in items]
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", low + (2 if depth < 3 else 0)))
        return [self.value(items, depth + 1) for _ in range(self.rng.randint(low, max(low, high)))]

    def text(self, low: int, high: int) -> str:
        length = self.rng.randint(low, max(low, min(high, low + 8)))
        return "".join(self.rng.choice(string.ascii_lowercase) for _ in range(length))

    def number(self, schema: dict[str, Any], integer: bool) -> float | int:
        low = schema.get("minimum", schema.get("exclusiveMinimum", -100))
        high = schema.get("maximum", schema.get("exclusiveMaximum", max(low, 0) + 1000))
        if integer:
            low = int(low) + ("exclusiveMinimum" in schema and "minimum" not in schema)
            high = int(high) - ("exclusiveMaximum" in schema and "maximum" not in schema)
            return self.rng.randint(low, max(low, high))
        return round(self.rng.uniform(low, high), 2) if high > low else low

    def pattern(self, pattern: str) -> str:
        if not (pattern.startswith("^") and pattern.endswith("$")):
            raise SchemaError("Pattern must start with '^' and end with '$'")
        try:
            parsed = sre_parse.parse(pattern[1:-1])
        except re.error as exc:
            raise SchemaError(f"Unsupported pattern syntax: {exc}") from None
        return "".join(self.regex(parsed))

    def regex(self, items: Any) -> list[str]:  # sre_parse's parse tree
        out: list[str] = []
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                out.append(chr(arg))
            elif name == "ANY":
                out.append(self.rng.choice(string.ascii_lowercase))
            elif name == "IN":
                out.append(self._class(arg))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = arg
                count = self.rng.randint(low, min(high, low + 3))
                for _ in range(count):
                    out += self.regex(sub)
            elif name == "SUBPATTERN":
                out += self.regex(arg[-1])
            elif name == "BRANCH":
                out += self.regex(self.rng.choice(arg[1]))
            elif name == "AT":
                continue
            else:
                raise SchemaError(f"Unsupported pattern syntax: {name}")
        return out

    def _class(self, items: Any) -> str:  # sre_parse's character class
        chars: list[str] = []
        negate = False
        for op, arg in items:
            name = str(op)
            if name == "NEGATE":
                negate = True
            elif name == "LITERAL":
                chars.append(chr(arg))
            elif name == "RANGE":
                chars += [chr(c) for c in range(arg[0], min(arg[1], arg[0] + 200) + 1)]
            elif name == "CATEGORY":
                chars += {"CATEGORY_DIGIT": list(string.digits), "CATEGORY_SPACE": [" "],
                          "CATEGORY_WORD": list(string.ascii_letters + string.digits + "_")}.get(str(arg), ["x"])
        if negate:
            chars = [c for c in string.ascii_letters + string.digits if c not in chars]
        return self.rng.choice(chars or ["x"])


def _uuid(rng: random.Random) -> str:
    hexes = "".join(rng.choice("0123456789abcdef") for _ in range(32))
    return f"{hexes[:8]}-{hexes[8:12]}-{hexes[12:16]}-{hexes[16:20]}-{hexes[20:]}"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1990, 2030):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"


_FORMATS: dict[str, Callable[[random.Random], str]] = {"uuid": _uuid, "date": _date, "time": _time, "date-time": lambda rng: f"{_date(rng)}T{_time(rng)}"}


def schema_value(schema: object, rng: random.Random) -> object:
    """A value conforming to `schema`, drawn from `rng`; SchemaError where llama.cpp's converter fails."""
    return _Generator(schema, rng).value(schema)


def regex_text(pattern: str, rng: random.Random) -> str:
    """A string the whole of which `pattern` matches (anchors optional), drawn from `rng`;
    SchemaError for syntax it cannot generate from (look-arounds, back-references)."""
    core = pattern[1 if pattern.startswith("^") else 0:len(pattern) - 1 if pattern.endswith("$") else None]
    return _Generator(None, rng).pattern(f"^{core}$")


def schema_text(schema: object, rng: random.Random) -> str:
    """`schema_value` as the text a model writes under llama.cpp's JSON grammar (a space after
    `,` and `:`, which its `space` rule allows)."""
    return json.dumps(schema_value(schema, rng), ensure_ascii=False)
