"""`[hooks.hook_schemas.<hook>] input/output`: LibreFang's JSON-Schema subset, checked on every call.

Supported keywords: type (string, number, integer, boolean, object, array, null, or a list of them), enum,
minimum/maximum, minLength/maxLength, required, properties (recursive), items. Input violations only warn; output
violations warn, or fail the call when `output_schema_strict = true` (LibreFang's kernel hard-codes it to false).
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Every violation as a readable string; [] when `value` fits (or the schema is not a table)."""
    if not isinstance(schema, dict):
        return []
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return [f"{path}: expected {' or '.join(map(str, kinds))}, got {_name(value)}"]
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if _TYPES["number"](value):
        if isinstance(schema.get("minimum"), int | float) and value < schema["minimum"]:
            out.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if isinstance(schema.get("maximum"), int | float) and value > schema["maximum"]:
            out.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str):
        if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
            out.append(f"{path}: shorter than {schema['minLength']} characters")
        if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
            out.append(f"{path}: longer than {schema['maxLength']} characters")
    if isinstance(value, dict):
        for key in schema.get("required") or []:
            if key not in value:
                out.append(f"{path}: missing required field {key!r}")
        props = schema.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if key in value:
                    out += validate(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += validate(item, schema["items"], f"{path}[{i}]")
    return out


def _name(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[kind](value):
            return kind
    return type(value).__name__
