"""FHIR element types from fhir.resources' models: R4 from the R4B models (R4B shares R4's datatypes), R5 from
the package's own (R5) models, STU3 from its STU3 models.

The walker needs, for each JSON key of a resource or datatype, the element's FHIR type, whether it
is a list and whether it is required. Reading that from the model classes (instead of validating
every resource) lets trusted bulk input take a fast path with the same rules.

Building a model class costs pydantic tens of milliseconds, so the models' answers for every type are kept
in a table per version beside this module (`r4b-elements.json`, `r5-elements.json`, `stu3-elements.json`), and a run with
validation off imports no model at all. `python -m fhir_transforms.r4.schema` writes the tables again from
the installed models; tests/r4/test_schema_table.py checks that they still match them.
"""
from __future__ import annotations

import importlib
import json
import sys
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FHIR_VERSIONS = ("r4", "r5", "stu3")
MODELS = {"r4": "fhir.resources.R4B", "r5": "fhir.resources", "stu3": "fhir.resources.STU3"}  # each version's models
TABLES = {version: Path(__file__).with_name(f"{'r4b' if version == 'r4' else version}-elements.json")
          for version in FHIR_VERSIONS}
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
    model_required: bool = False  # the model requires it (`required` marks required primitives only)


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
    """The fhir.resources model class of a type in a FHIR version (ValueError or KeyError if there is none).
    The models load here, with the first validation, not before."""
    return importlib.import_module(MODELS[version]).get_fhir_model_class(type_name)


@lru_cache(maxsize=None)
def _table(version: str) -> dict:
    return json.loads(TABLES[version].read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def elements(type_name: str, version: str = "r4") -> dict[str, Element]:
    """JSON key → Element for a resource, datatype or backbone element type name (ValueError if there is none)."""
    try:
        fields = _table(version)["types"][type_name]
    except KeyError:
        raise ValueError(f"{type_name} is not a valid FHIR Model") from None
    found = {key: Element(*field[:5], tuple(field[5]), field[6]) for key, field in fields.items()}
    if type_name == "Extension":  # FHIR JSON gives value[x] its primitive extensions; the models have no field
        for key, el in list(found.items()):
            if key.startswith("value") and el.type in PRIMITIVES.values():
                found["_" + key] = Element(key, "Element", False, False)
    return found


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
def known_keys() -> frozenset[str]:
    """Every JSON key some type of some FHIR version's models has: the names a diagnostic may repeat as they are
    (an R5 element in a record read as R4 is named, so the message can say the record reads as R5)."""
    return frozenset(key for v in FHIR_VERSIONS for fields in _table(v)["types"].values() for key in fields) | \
        {"resourceType"}


def is_resource_type(name: str, version: str = "r4") -> bool:
    """True for a resource type name of the version's models (for R4, the R4-only types R4B dropped, such as
    MedicinalProduct, are not known: fhir_transforms/r4/shapes.py)."""
    return name in _resource_types(version)


@lru_cache(maxsize=None)
def _resource_types(version: str) -> frozenset[str]:
    return frozenset(_table(version)["resources"])


def read_model(type_name: str, version: str = "r4") -> dict[str, Element]:
    """`elements` as the installed fhir.resources model of the type states it (what the table is made of)."""
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
                           tuple(extra.get("enum_reference_types") or ()), field.is_required())
    return out


def model_is_resource(name: str, version: str = "r4") -> bool:
    """Whether the installed fhir.resources has a resource model of that name in the version."""
    try:
        model = model_class(name, version)
    except (KeyError, ValueError):
        return False
    return any(base.__name__ == "Resource" for base in model.__mro__)


def read_models(version: str = "r4") -> dict:
    """A version's table: every type its fhir.resources models name (their fhirtypes `…Type` classes), and which
    are resources."""
    fhirtypes = importlib.import_module(MODELS[version] + ".fhirtypes")
    names = sorted(n[: -len("Type")] for n in dir(fhirtypes) if n.endswith("Type") and n != "Type")
    types, resources = {}, []
    for name in names:
        try:
            fields = read_model(name, version)
        except (ValueError, TypeError, AttributeError, KeyError):  # primitives and helpers: no model of elements
            continue
        types[name] = {key: [el.name, el.type, el.is_list, el.required, el.required_choice, list(el.targets),
                             el.model_required]
                       for key, el in fields.items()}
        if model_is_resource(name, version):
            resources.append(name)
    return {"source": f"fhir.resources {MODELS[version]} models", "resources": resources, "types": types}


if __name__ == "__main__":
    for version, table in TABLES.items():
        table.write_text(json.dumps(read_models(version), indent=0, sort_keys=True) + "\n", encoding="utf-8")
        sys.stdout.write(f"{table} written\n")
