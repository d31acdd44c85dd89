import json
import random
import re

import jsonschema
import pytest

from fake_engines.core._json_schema import SchemaError, schema_text

SCHEMAS = [
    {"const": "42"},
    {"items": [{"type": "integer"}]},
    {"type": "object"},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 5},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1}},
     "required": ["name", "age", "tags"], "additionalProperties": False},
    {"anyOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 3}]},
    {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    {"$defs": {"p": {"type": "boolean"}}, "type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 3},
    {"type": "string", "format": "date"},
    {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}, "required": ["n"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_json_validates_against_its_schema_and_is_deterministic_per_seed(schema):
    for seed in range(15):
        text = schema_text(schema, random.Random(seed))
        # a well-kept validator, not our own reading (draft 7: the tuple form of items llama.cpp reads)
        jsonschema.Draft7Validator(schema).validate(json.loads(text))
        assert text == schema_text(schema, random.Random(seed))


@pytest.mark.parametrize("schema,message", [
    (123, "Unrecognized schema: 123"),
    ({"type": 123}, 'Unrecognized schema: {"type":123}'),
    ({"type": "hiccup"}, 'Unrecognized schema: {"type":"hiccup"}'),
    ({"type": "string", "pattern": "[a-z]+"}, "Pattern must start with '^' and end with '$'"),
    ({"$ref": "#/$defs/missing"}, "Error resolving ref #/$defs/missing"),
    ({"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}, "Schema nests deeper than 64"),
])
def test_schemas_llama_cpp_cannot_convert_are_refused_with_its_message(schema, message):
    with pytest.raises(SchemaError, match=re.escape(message)):
        schema_text(schema, random.Random(0))
