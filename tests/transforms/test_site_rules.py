"""Site rules files: the schema follows the methods' declaration, every kind of error names its line, and the
merge over the packaged profile overrides, adds and drops rules by key."""
from __future__ import annotations

import json

import pytest

from fhir_transforms.hl7v2.rules import hl7_site_profile, load_hl7_profile
from fhir_transforms.methods import COMMON, FHIR, HL7V2, METHODS
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
    for engine, rule in ((FHIR, "fhirMethodRule"), (HL7V2, "hl7MethodRule")):
        for method in METHODS.values():  # each method's settings for the engine, and only those, are allowed with it
            case = next(c for c in schema()["$defs"][rule]["allOf"]
                        if c["if"]["properties"]["method"]["const"] == method.name)
            declared = [p for p in method.params + COMMON if engine in p.engines]
            assert set(case["then"]["properties"]) == {"method", *["where"] * (engine == FHIR), *(p.name for p in declared)}
            for p in declared:  # the type and choices the Param table declares
                assert case["then"]["properties"][p.name].get("type", "any") == p.type
                assert case["then"]["properties"][p.name].get("enum", []) == list(p.choices)


def test_a_rule_the_param_table_refuses_the_schema_refuses_too(tmp_path):
    # the schema and check_options read one table: a setting of another engine, a wrong choice, a wrong type
    for rule, words in (("{method: keep, checked: true}", "unknown key 'checked'"),
                        ("{method: shift, scope: galaxy}", "galaxy"),
                        ("{method: perturb, span: wide}", "span: expected number")):
        with pytest.raises(RulesFileError) as e:
            read_site_rules(write(tmp_path, f"extends: safe-harbor\nfhir:\n  rules:\n    date: {rule}\n"))
        assert ":4:" in str(e.value) and words in str(e.value)


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
    Organization.alias: remove # adds
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
    assert "Organization.alias" not in packaged.rules and fhir.rules["Organization.alias"].method == "remove"
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


def test_profile_level_keys_and_r5_rules_of_a_site_file(tmp_path):
    site, fhir, _ = load(tmp_path, """extends: safe-harbor
fhir:
  marking: true
  entries:
    remove: [Provenance, {resource: DocumentReference, element: type, code: '34117-2'}]
  fhir_versions:
    r5:
      rules:
        ExtendedContactDetail.name: keep
""")
    assert fhir.marking is True and [e.resource for e in fhir.remove_entries] == ["Provenance", "DocumentReference"]
    r5 = fhir.for_version("r5")
    assert r5.rules["ExtendedContactDetail.name"].method == "keep" and r5.rules["ExtendedContactDetail.name"].trusted
    assert "ExtendedContactDetail.name" not in fhir.rules  # R4 keeps its own rules
    assert r5.rules_sha256 == site.sha256


def test_r5_paths_are_checked_against_r5_and_r4_paths_against_r4b(tmp_path):
    with pytest.raises(RulesFileError) as e:  # a datatype R5 added: no R4 element
        load(tmp_path, "extends: safe-harbor\nfhir:\n  rules:\n    ExtendedContactDetail.name: keep\n")
    assert ":4:" in str(e.value) and "no FHIR R4" in str(e.value)
    with pytest.raises(RulesFileError) as e:
        load(tmp_path, "extends: safe-harbor\nfhir:\n  fhir_versions:\n    r5:\n      rules:\n        Patient.colour: keep\n")
    assert ":6:" in str(e.value) and "Patient has no element 'colour'" in str(e.value)
    with pytest.raises(RulesFileError) as e:  # an entry rule is a resource type or {resource, element, code}
        load(tmp_path, "extends: safe-harbor\nfhir:\n  entries:\n    remove: [{resource: Provenance, code: x}]\n")
    assert ":4:" in str(e.value)
