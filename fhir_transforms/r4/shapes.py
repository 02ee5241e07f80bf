"""R4 resource types the R4B models lack (MedicinalProduct*, Substance*, the evidence syntheses): read
without a schema, each element's datatype told by its JSON shape, so that the profile's datatype rules
(Reference, Identifier, HumanName, dates, ...) still apply to them and every other string is free text."""
from __future__ import annotations

from fhir_transforms.dates import FHIR_DATE_RE

# R4 (4.0.1) resource types that R4B (4.3.0) dropped
R4_ONLY = frozenset({
    "EffectEvidenceSynthesis", "MedicinalProduct", "MedicinalProductAuthorization",
    "MedicinalProductContraindication", "MedicinalProductIndication", "MedicinalProductIngredient",
    "MedicinalProductInteraction", "MedicinalProductManufactured", "MedicinalProductPackaged",
    "MedicinalProductPharmaceutical", "MedicinalProductUndesirableEffect", "RiskEvidenceSynthesis",
    "SubstanceSpecification", "SubstanceNucleicAcid", "SubstancePolymer", "SubstanceProtein",
    "SubstanceReferenceInformation", "SubstanceSourceMaterial",
})
TELECOM_SYSTEMS = {"phone", "fax", "email", "pager", "url", "sms", "other"}
# datatype → the keys it may have (besides id and extension); the first whose keys fit, in this order
DATATYPES = (
    ("Reference", {"reference", "type", "identifier", "display"}, {"reference"}),
    ("HumanName", {"use", "text", "family", "given", "prefix", "suffix", "period"}, {"family", "given"}),
    ("Address", {"use", "type", "text", "line", "city", "district", "state", "postalCode", "country", "period"},
     {"line", "city", "district", "postalCode"}),
    ("ContactPoint", {"system", "value", "use", "rank", "period"}, set()),
    ("Identifier", {"use", "type", "system", "value", "period", "assigner"}, {"value"}),
    ("CodeableConcept", {"coding", "text"}, {"coding"}),
    ("Coding", {"system", "version", "code", "display", "userSelected"}, {"code"}),
    ("Quantity", {"value", "comparator", "unit", "system", "code"}, {"value"}),
    ("Period", {"start", "end"}, set()),
    ("Range", {"low", "high"}, set()),
    ("Ratio", {"numerator", "denominator"}, set()),
    ("Attachment", {"contentType", "language", "data", "url", "size", "hash", "title", "creation"}, {"contentType"}),
    ("Annotation", {"authorReference", "authorString", "time", "text"}, {"text"}),
)


def datatype_of(value: dict) -> str | None:
    """The FHIR datatype a JSON object of unknown type has the shape of, or None (a backbone element)."""
    keys = set(value) - {"id", "extension"}
    if not keys:
        return None
    for name, allowed, needs in DATATYPES:
        if keys <= allowed and (not needs or keys & needs):
            if name == "ContactPoint" and value.get("system") not in TELECOM_SYSTEMS:
                continue
            if name == "Quantity" and not isinstance(value.get("value"), (int, float)):
                continue
            return name
    return None


def primitive_of(value) -> str:
    """The FHIR primitive type a JSON value of unknown type is read as: dates as dateTime, other text as string."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "decimal"
    if isinstance(value, str) and FHIR_DATE_RE.match(value):
        return "dateTime"
    return "string"
