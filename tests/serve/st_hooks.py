"""Schemathesis hooks for ``test_openapi_ci.py`` (loaded through SCHEMATHESIS_HOOKS):
NDJSON answers are checked line by line against the document's ``Event`` schema (the
last line is then handed to schemathesis's own schema check)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import schemathesis

_VALIDATORS: dict[int, Any] = {}


def _validator(raw: dict[str, Any]) -> Any:
    v = _VALIDATORS.get(id(raw))
    if v is None:
        schema = {"$ref": "#/components/schemas/Event", "components": raw["components"]}
        v = _VALIDATORS[id(raw)] = jsonschema.Draft202012Validator(schema)
    return v


@schemathesis.deserializer("application/x-ndjson")
def ndjson(ctx: schemathesis.DeserializationContext, response: schemathesis.Response) -> Any:
    validator = _validator(ctx.operation.schema.raw_schema)
    last: Any = None
    for n, line in enumerate(response.content.splitlines()):
        if not line.strip():
            continue
        last = json.loads(line)
        errors = sorted(validator.iter_errors(last), key=str)
        if errors:
            raise AssertionError(f"NDJSON line {n + 1} is not an Event: {errors[0].message}"
                                 f" ({line[:300]!r})")
    return last
