"""FHIR R4 element types, read from fhir.resources' R4B models (R4B shares R4's datatypes).

The walker needs, for each JSON key of a resource or datatype, the element's FHIR type, whether it
is a list and whether it is required. Reading that from the model classes (instead of validating
every resource) lets trusted bulk input take a fast path with the same rules.

Building a model class costs pydantic tens of milliseconds, so the models' answers for every type are kept
in `r4b-elements.json` beside this module, and a run with validation off imports no model at all.
`python -m fhir_transforms.r4.schema` writes the file again from the installed models;
tests/r4/test_schema_table.py checks that it still matches them.
"""
from __future__ import annotations

import json
import sys
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).with_name("r4b-elements.json")

# Primitive annotation class name (fhir_core types) → FHIR primitive type name.
PRIMITIVES = {
    "Boolean": "boolean", "Integer": "integer", "Integer64": "integer64", "PositiveInt": "positiveInt",
    "UnsignedInt": "unsignedInt", "Decimal": "decimal", "String": "string", "Markdown": "markdown",
    "Code": "code", "Id": "id", "Uri": "uri", "Url": "url", "Canonical": "canonical", "Oid": "oid",
    "Uuid": "uuid", "Base64Binary": "base64Binary", "Date": "date", "DateTime": "dateTime",
    "Instant": "instant", "Time": "time", "Xhtml": "xhtml", "UuidVersion": "uuid",
}


@dataclass(frozen=True)
class Element:
    name: str  # FHIR element name (JSON key without a leading "_")
    type: str  # FHIR type: "HumanName", "dateTime", "Resource", ... ; "Element" for `_x` primitive extensions
    is_list: bool
    required: bool
    required_choice: str = ""  # one type of a required choice (occurrence[x]): its name without the type


def _type_name(annotation) -> tuple[str, bool]:
    is_list = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif origin in (list, typing.List):
            is_list = True
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Annotated:
            names = [type(m).__name__ for m in annotation.__metadata__]
            primitive = next((PRIMITIVES[n] for n in names if n in PRIMITIVES), None)
            if primitive is None:
                raise TypeError(f"unknown FHIR primitive annotation {names}")
            return primitive, is_list
        elif annotation is bool:
            return "boolean", is_list
        else:
            name = getattr(annotation, "__name__", str(annotation))
            if name.endswith("Type"):
                name = name[: -len("Type")]
            if name == "FHIRPrimitiveExtension":
                name = "Element"
            return name, is_list


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def elements(type_name: str) -> dict[str, Element]:
    """JSON key → Element for a resource, datatype or backbone element type name (ValueError if there is none)."""
    try:
        fields = _table()["types"][type_name]
    except KeyError:
        raise ValueError(f"{type_name} is not a valid FHIR Model") from None
    return {key: Element(*field) for key, field in fields.items()}


def is_resource_type(name: str) -> bool:
    """True for an R4B resource type name (R4-only types such as MedicinalProduct are not known)."""
    return name in _resource_types()


@lru_cache(maxsize=1)
def _resource_types() -> frozenset[str]:
    return frozenset(_table()["resources"])


def read_model(type_name: str) -> dict[str, Element]:
    """`elements` as the installed fhir.resources model of the type states it (what the table is made of)."""
    from fhir.resources.R4B import get_fhir_model_class  # the models load only to write or check the table

    model = get_fhir_model_class(type_name)
    out: dict[str, Element] = {}
    for field_name, field in model.model_fields.items():
        if field_name == "fhir_comments":
            continue
        extra = field.json_schema_extra or {}
        type_name_, is_list = _type_name(field.annotation)
        key = field.alias or field_name
        name = key.lstrip("_")
        choice = extra.get("one_of_many", "") if extra.get("one_of_many_required") else ""
        out[key] = Element(name, type_name_, is_list, bool(extra.get("element_required")), choice)
    return out


def model_is_resource(name: str) -> bool:
    """Whether the installed fhir.resources has a resource model of that name."""
    from fhir.resources.R4B import get_fhir_model_class

    try:
        model = get_fhir_model_class(name)
    except (KeyError, ValueError):
        return False
    return any(base.__name__ == "Resource" for base in model.__mro__)


def read_models() -> dict:
    """The table: every type fhir.resources R4B names (its fhirtypes `…Type` classes), and which are resources."""
    from fhir.resources.R4B import fhirtypes

    names = sorted(n[: -len("Type")] for n in dir(fhirtypes) if n.endswith("Type") and n != "Type")
    types, resources = {}, []
    for name in names:
        try:
            fields = read_model(name)
        except (ValueError, TypeError, AttributeError):  # primitives and helpers: no model of elements
            continue
        types[name] = {key: [el.name, el.type, el.is_list, el.required, el.required_choice] for key, el in fields.items()}
        if model_is_resource(name):
            resources.append(name)
    return {"source": "fhir.resources R4B models", "resources": resources, "types": types}


if __name__ == "__main__":
    TABLE.write_text(json.dumps(read_models(), indent=0, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(f"{TABLE} written\n")
