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
