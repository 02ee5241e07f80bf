"""Valid R4 is never bad input: the resource types R4B dropped are read by shape, with the same rules."""
from __future__ import annotations

import json

from fhir_transforms.r4.shapes import datatype_of

PRODUCT = {
    "resourceType": "MedicinalProduct", "id": "mp-4711",
    "identifier": [{"system": "http://ema.europa.eu/example/MPID", "value": "EU/1/97/049/001"}],
    "domain": {"coding": [{"system": "http://hl7.org/fhir/medicinal-product-domain", "code": "Human"}]},
    "name": [{"productName": "Equilidem 2.5 mg film-coated tablets",
              "countryLanguage": [{"country": {"coding": [{"system": "urn:iso:std:iso:3166", "code": "EU"}]},
                                   "language": {"coding": [{"system": "urn:ietf:bcp:47", "code": "en"}]}}]}],
    "manufacturingBusinessOperation": [{
        "effectiveDate": "2013-03-15",
        "authorisationReferenceNumber": {"system": "http://ema.europa.eu/example", "value": "123456"},
        "manufacturer": [{"reference": "Organization/example"}],
    }],
    "contact": [{"reference": "Practitioner/dr-ames", "display": "Dr. Jo Ames"}],
}


def test_an_r4_only_resource_is_de_identified_by_its_shapes(engine):
    out = engine.deidentify(json.loads(json.dumps(PRODUCT))).resource
    assert out["resourceType"] == "MedicinalProduct" and out["id"] != "mp-4711"
    assert out["identifier"][0]["value"] != "EU/1/97/049/001"  # Identifier.value: pseudonym
    assert out["domain"] == PRODUCT["domain"]  # codes kept
    op = out["manufacturingBusinessOperation"][0]
    assert op["effectiveDate"] == "2013"  # dateTime: the year
    assert op["manufacturer"][0]["reference"].startswith("Organization/") and "example" not in op["manufacturer"][0]["reference"]
    assert "Ames" not in json.dumps(out)
    assert {"PSEUDED", "ABSTRED"} <= {c["code"] for c in out["meta"]["security"]}


def test_a_bundle_holding_an_r4_only_resource_is_read(engine):
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": json.loads(json.dumps(PRODUCT))},
        {"resource": {"resourceType": "Organization", "id": "example", "name": "Acme Pharma"}}]}
    out = engine.deidentify(bundle).resource
    assert out["entry"][0]["resource"]["resourceType"] == "MedicinalProduct"


def test_shapes_name_the_datatypes_the_rules_know():
    assert datatype_of({"reference": "Patient/1"}) == "Reference"
    assert datatype_of({"family": "Ames"}) == "HumanName"
    assert datatype_of({"system": "phone", "value": "555"}) == "ContactPoint"
    assert datatype_of({"system": "http://x", "value": "555"}) == "Identifier"
    assert datatype_of({"value": 5, "unit": "mg"}) == "Quantity"
    assert datatype_of({"productName": "x"}) is None
