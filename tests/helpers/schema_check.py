"""A --json document checked against the JSON Schema it names (tpuprof/schemas), with every schema in one registry:
preflight's memory block is a $ref to memory.schema.json."""

from __future__ import annotations

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tpuprof import schemas

REGISTRY = Registry().with_resources(
    (file, Resource.from_contents(schema)) for file, schema in schemas.all_schemas().items())


def validate(document: dict) -> str:
    """The command the document's schema names, once the document has passed that command's JSON Schema."""
    named = schemas.parse(document.get("schema"))
    assert named is not None, f"no tpuprof schema name in {list(document)[:5]}"
    command, version = named
    assert version == schemas.VERSIONS[command]
    validator = Draft202012Validator(schemas.schema(command), registry=REGISTRY)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:10])
    return command
