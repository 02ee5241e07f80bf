"""FHIR element types, read once from fhir.resources' models: R4 from the R4B models (R4B shares R4's
datatypes), R5 from the package's own (R5) models.

The walker needs, for each JSON key of a resource or datatype, the element's FHIR type, whether it
is a list and whether it is required. Reading that from the model classes (instead of validating
every resource) lets trusted bulk input take a fast path with the same rules.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import lru_cache

from fhir.resources import get_fhir_model_class as r5_model_class
from fhir.resources.R4B import get_fhir_model_class as r4_model_class

FHIR_VERSIONS = ("r4", "r5")
MODEL_CLASS = {"r4": r4_model_class, "r5": r5_model_class}
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
    targets: tuple[str, ...] = ()  # a Reference: the resource types it may point to ("Resource": any)


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


def model_class(type_name: str, version: str = "r4"):
    """The fhir.resources model class of a type in a FHIR version (ValueError or KeyError if there is none)."""
    return MODEL_CLASS[version](type_name)


@lru_cache(maxsize=None)
def elements(type_name: str, version: str = "r4") -> dict[str, Element]:
    """JSON key → Element for a resource, datatype or backbone element type name."""
    model = model_class(type_name, version)
    out: dict[str, Element] = {}
    for field_name, field in model.model_fields.items():
        if field_name == "fhir_comments":
            continue
        extra = field.json_schema_extra or {}
        type_name_, is_list = _type_name(field.annotation)
        key = field.alias or field_name
        name = key.lstrip("_")
        choice = extra.get("one_of_many", "") if extra.get("one_of_many_required") else ""
        out[key] = Element(name, type_name_, is_list, bool(extra.get("element_required")), choice,
                           tuple(extra.get("enum_reference_types") or ()))
    return out


@lru_cache(maxsize=4096)
def declared_targets(fpath: str) -> tuple[str, ...]:
    """The resource types the Reference at a FHIR path without indices (`Claim.insurance.coverage`) may point
    to, as its element declares them; () where the path is not one of the R4B models' Reference elements."""
    type_name, *names = fpath.split(".")
    found: Element | None = None
    for name in names:
        try:
            candidates = [e for e in elements(type_name).values() if e.name == name and e.type != "Element"]
        except (KeyError, ValueError):
            return ()  # an R4 type the R4B models lack
        found = next((e for e in candidates if e.type == "Reference"), candidates[0] if candidates else None)
        if found is None:
            return ()
        type_name = found.type
    return found.targets if found is not None and found.type == "Reference" else ()


@lru_cache(maxsize=None)
def is_resource_type(name: str, version: str = "r4") -> bool:
    """True for a resource type name of the version's models (for R4, the R4-only types R4B dropped, such as
    MedicinalProduct, are not known: fhir_transforms/r4/shapes.py)."""
    try:
        model = model_class(name, version)
    except (KeyError, ValueError):
        return False
    return any(base.__name__ == "Resource" for base in model.__mro__)
