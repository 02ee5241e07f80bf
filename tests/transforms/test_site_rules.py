"""Site rules files: the schema follows the methods' declaration, every kind of error names its line, and the
merge over the packaged profile overrides, adds and drops rules by key."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.hl7v2.rules import hl7_site_profile, load_hl7_profile
from fhir_transforms.methods import METHODS
from fhir_transforms.r4.site import site_profile
from fhir_transforms.rules import load_profile
from fhir_transforms.site_rules import SCHEMA_FILE, RulesFileError, read_site_rules, schema, write_schema


def write(tmp_path, text: str):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


def load(tmp_path, text: str):
    site = read_site_rules(write(tmp_path, text))
    return site, site_profile(site), hl7_site_profile(site)


def test_the_shipped_schema_is_the_one_derived_from_the_methods_declaration():
    assert SCHEMA_FILE.read_text() == write_schema(), "regenerate: deid-adapter rules schema > mappings/site-rules.schema.json"
    shipped = json.loads(SCHEMA_FILE.read_text())
    assert shipped["$defs"]["fhirMethodRule"]["properties"]["method"]["enum"] == sorted(METHODS)
    for method in METHODS.values():  # each method's declared settings, and only those, are allowed with it
        case = next(c for c in schema()["$defs"]["fhirMethodRule"]["allOf"]
                    if c["if"]["properties"]["method"]["const"] == method.name)
        assert set(case["then"]["properties"]) == {"method", "where", *method.options}


# (the file, the line the error must name, words the message must hold): one row per kind of error
ERRORS = [
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: shred\n", 4, "unknown method 'shred'"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: {method: sherd}\n", 4, "unknown method 'sherd'"),
    ("extends: safe-harbor\ncolour: red\n", 2, "unknown key 'colour'"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: {method: keep, colour: red}\n", 4,
     "unknown key 'colour'"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Identifier.value:\n      method: fpe\n      keep_prefix: two\n", 6,
     "keep_prefix: expected integer"),
    ("extends: safe-harbor\nfhir:\n  rules: [Patient.gender]\n", 3, "fhir.rules: expected object"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: keep\n    Patient.shoeSize: remove\n", 5,
     "Patient has no element 'shoeSize'"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Pateint.gender: keep\n", 4, "'Pateint' is no FHIR R4"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    patient gender: keep\n", 4, "is not a rule key"),
    ("extends: safe-harbor\nhl7v2:\n  fields:\n    PID.99: remove\n", 4, "defines PID-99"),
    ("extends: safe-harbor\nhl7v2:\n  fields:\n    PID-13: remove\n", 4, "is not a rule key"),
    ("extends: safe-harbor\nhl7v2:\n  datatypes:\n    QQQ: {default: remove}\n", 4, "no version of HL7v2 has"),
    ("extends: safe-harbor\nhl7v2:\n  fields:\n    PID.13: {method: keep, where: {component: two, in: [WPN]}}\n", 4,
     "component: expected integer"),
    ("extends: safe-harbor\nhl7v2:\n  datatypes:\n    XTN: {1: shred}\n", 4, "neither a method"),
    ("extends: safe-harbour\n", 1, "unknown profile 'safe-harbour'"),
    ("fhir: {}\n", 1, "'extends' is a required property"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: keep\n    Patient.gender: remove\n", 5, "given twice"),
    ("extends: safe-harbor\nfhir:\n  rules:\n    Patient.gender: [keep\n", 5, "not YAML"),
]


@pytest.mark.parametrize("text, line, words", ERRORS)
def test_every_kind_of_error_names_the_file_and_line(tmp_path, text, line, words):
    with pytest.raises(RulesFileError) as e:
        load(tmp_path, text)
    assert f"site.yaml:{line}: " in str(e.value) and words in str(e.value), str(e.value)


def test_a_where_that_is_no_fhirpath_names_its_line(tmp_path):
    with pytest.raises(RulesFileError, match=r"site.yaml:4: .*not a FHIRPath expression"):
        load(tmp_path, "extends: safe-harbor\nfhir:\n  rules:\n    Patient.telecom: {method: keep, where: \"use = 'x\"}\n")


def test_extends_then_override_add_and_drop_by_key(tmp_path):
    site, fhir, hl7 = load(tmp_path, """extends: longitudinal
fhir:
  rules:
    dateTime: year            # overrides longitudinal's shift
    Organization.name: remove # adds
    Meta.profile: null        # drops: Meta.profile falls to its type's rule
  identifiers:
    remove_types: [SS]
hl7v2:
  datatypes:
    DTM: year
  fields:
    PV1.3: remove
""")
    packaged = load_profile("longitudinal")
    assert packaged.rules["dateTime"].method == "shift" and fhir.rules["dateTime"].method == "year"
    assert "Organization.name" not in packaged.rules and fhir.rules["Organization.name"].method == "remove"
    assert "Meta.profile" in packaged.rules and "Meta.profile" not in fhir.rules
    assert fhir.rules["date"].method == "shift"  # what the file does not name stays as packaged
    assert fhir.identifier_remove_types == {"SS"} and fhir.identifier_remove_systems == packaged.identifier_remove_systems
    assert load_hl7_profile("longitudinal").datatypes["DTM"].method == "shift" and hl7.datatypes["DTM"].method == "year"
    assert hl7.fields["PV1.3"].method == "remove"
    assert fhir.rules_sha256 == hl7.rules_sha256 == site.sha256 and len(site.sha256) == 64
    assert load_profile("longitudinal").rules_sha256 == ""


def test_the_hash_follows_the_content_not_its_spelling(tmp_path):
    one = read_site_rules(write(tmp_path, "extends: safe-harbor\nfhir: {rules: {Organization.name: remove}}\n"))
    spelled = read_site_rules(write(tmp_path, "# a comment\nfhir:\n  rules:\n    Organization.name: remove\n"
                                             "extends: safe-harbor\n"))
    other = read_site_rules(write(tmp_path, "extends: safe-harbor\nfhir: {rules: {Organization.name: text}}\n"))
    assert one.sha256 == spelled.sha256 != other.sha256
