"""The typed contract in /api/openapi.json: models the routes read from the raw body (the hook requests, the
memory API's writes, ...) or answer with, published under `components/schemas` by name, so that generated clients
get a class for each (plugins_app/api/app.py adds them to the document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"
COMPONENTS: dict[str, type[BaseModel]] = {}


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A reference to `model`, which is published with the document's components."""
    COMPONENTS.setdefault(model.__name__, model)
    return {"$ref": REF.format(model=model.__name__)}


def body_of(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """A route's `openapi_extra` for a JSON body the route reads itself (json_body, or the hook routes' one parse)."""
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": ref(model)}}}}


def add_components(schema: dict[str, Any]) -> None:
    """Every referenced model (and the models they use) into the document's components; what django-ninja already
    put there is kept."""
    if not COMPONENTS:
        return
    _, top = models_json_schema([(m, "validation") for m in COMPONENTS.values()], ref_template=REF)
    found = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in top.get("$defs", {}).items():
        found.setdefault(name, definition)


def merge_status_keys(schema: dict[str, Any]) -> None:
    """One entry per status code in each operation's responses. django-ninja keys the statuses it knows by int, a
    route's `openapi_extra` by string ("503" with its Retry-After header): serialised, the two became duplicate
    "503" keys, which Swagger UI and strict parsers refuse. The string entry's fields are merged into the int one."""
    for methods in schema.get("paths", {}).values():
        for op in methods.values():
            responses = op.get("responses") if isinstance(op, dict) else None
            if not responses:
                continue
            for key in [k for k in responses if isinstance(k, str) and k.isdigit()]:
                extra = responses.pop(key)
                merged = responses.setdefault(int(key), {})
                for field, value in extra.items():
                    if isinstance(value, dict) and isinstance(merged.get(field), dict):
                        merged[field] = {**merged[field], **value}
                    else:
                        merged[field] = value
