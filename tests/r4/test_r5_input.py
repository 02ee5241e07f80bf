"""FHIR R5 input: the same Safe Harbor rules by datatype, read with the R5 models; golden files in tests/cases/r5/.

tests/cases/r5/<profile>/<name>.json → <name>.expected.json, as in test_golden.py (DEID_UPDATE_GOLDEN=1 rewrites them).
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fhir.resources import get_fhir_model_class as r5_model_class
from fhir_transforms.errors import InputError
from fhir_transforms.r4 import versions
from fhir_transforms.r4.schema import elements
from fhir_transforms.r4.walker import PRIMITIVE_TYPES
from fhir_transforms.rules import load_profile, profile_names, MAPPINGS
from tests.conftest import CASES, SHARED_TOOLS, make_engine, needs_shared_tools

R5_CASES = CASES / "r5"
GOLDEN = sorted(p for p in R5_CASES.glob("*/*.json") if not p.name.endswith(".expected.json"))
VISIT = R5_CASES / "safe-harbor" / "telehealth-visit.json"
LEAK_TOOL = SHARED_TOOLS / "fhir_leak.py"
# what the shared leak tool does not look for: R5's new places of names, links and identifiers, and full dates
R5_IDENTIFYING = ["Baptiste", "Olufemi", "Castellanos", "Ines", "Mill Race", "zoom.example", "8812039911",
                  "clinic.example/visit", "ZQX771203904", "GRP-88120", "Philippa", "Dunmore", "DOC-20250314-0042",
                  "RX-2025-0031442", "MD-77120", "1942267713", "999-41-2207"]


def r5_engine(test_key, profile: str = "safe-harbor", validate: bool = True, version: str = "r5"):
    engine = make_engine(test_key, profile=profile, validate=validate)
    engine.fhir_version = version
    return engine


def visible_text(doc) -> str:
    """The output as a reader sees it: its JSON, narratives without tags, text attachments decoded."""
    parts = [json.dumps(doc, ensure_ascii=False)]

    def walk(node):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            if k == "div" and isinstance(v, str):
                parts.append(re.sub(r"<[^>]+>", " ", v))
            elif k == "data" and isinstance(v, str):
                parts.append(base64.b64decode(v).decode("utf-8", "replace"))
            walk(v)
    walk(doc)
    return "\n".join(parts)


@pytest.mark.parametrize("case", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_r5_golden(case: Path, test_key):
    result = r5_engine(test_key, profile=case.parent.name).deidentify(json.loads(case.read_text()), case.stem).resource
    expected_path = case.with_name(case.stem + ".expected.json")
    if os.environ.get("DEID_UPDATE_GOLDEN"):
        expected_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    assert result == json.loads(expected_path.read_text())
    r5_model_class(result["resourceType"]).model_validate(result)  # valid R5, checked apart from the engine


def test_r5_output_keeps_no_name_identifier_link_or_full_date(test_key):
    out = visible_text(r5_engine(test_key).deidentify(json.loads(VISIT.read_text()), "visit").resource)
    assert [v for v in R5_IDENTIFYING if v.lower() in out.lower()] == []
    assert re.findall(r"\d{4}-\d{2}-\d{2}", out) == []


def test_r5_renamed_and_new_elements_get_their_datatype_rules(test_key):
    bundle = r5_engine(test_key).deidentify(json.loads(VISIT.read_text()), "visit").resource
    by_type = {e["resource"]["resourceType"]: e["resource"] for e in bundle["entry"]}
    encounter, request = by_type["Encounter"], by_type["MedicationRequest"]
    assert encounter["actualPeriod"] == {"start": "2025", "end": "2025"}  # Period.start/end: dateTime → year
    assert encounter["plannedStartDate"] == "2025"
    assert encounter["virtualService"] == [{"channelType": {"system": "http://hl7.org/fhir/virtual-service-type",
                                                            "code": "zoom"}}]
    reason = request["reason"][0]["reference"]  # CodeableReference.reference: a Reference
    assert reason["reference"].startswith("Condition/") and "cond-1" not in reason["reference"]
    assert reason["display"] == "Dyspnea noted [DATE]"
    assert "name" not in by_type["Patient"]["contact"][0]  # Patient.contact.name: HumanName → remove
    assert "name" not in by_type["Organization"]["contact"][0]  # ExtendedContactDetail.name: HumanName → remove
    assert by_type["Coverage"]["subscriberId"][0]["value"] != "ZQX771203904"  # an Identifier in R5
    attachment = by_type["DocumentReference"]["content"][0]["attachment"]
    assert attachment["size"] == str(len(base64.b64decode(attachment["data"])))  # integer64: a JSON string in R5
    assert {"system": "http://deid-adapter.org/fhir/CodeSystem/deid-profile", "code": "safe-harbor@2026.11.1"} \
        in encounter["meta"]["tag"]
    assert {c["code"] for c in encounter["meta"]["security"]} >= {"ABSTRED", "PSEUDED", "REDACTED", "MASKED"}


@needs_shared_tools
def test_shared_leak_tool_finds_nothing_in_r5_output(test_key, tmp_path):
    engine = r5_engine(test_key)
    for case in GOLDEN:
        out = engine.deidentify(json.loads(case.read_text()), case.stem).resource
        (tmp_path / case.name).write_text(json.dumps(out))
    inputs = tmp_path / "in"
    inputs.mkdir()
    for case in GOLDEN:
        (inputs / case.name).write_text(case.read_text())
    done = subprocess.run([sys.executable, str(LEAK_TOOL), str(inputs), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["leaks"] == 0, done.stdout


@pytest.mark.parametrize("version", versions.FHIR_VERSIONS)
@pytest.mark.parametrize("profile", sorted(profile_names(MAPPINGS)))
def test_every_path_rule_names_an_element_its_method_can_take(profile, version):
    # a rule written for R4's string (Coverage.subscriberId) must not meet R5's Identifier there
    applied = load_profile(profile).for_version(version)
    wrong = []
    for path, rule in applied.rules.items():
        parts = path.split(".")
        if len(parts) < 2 or rule.method in ("remove", "keep", "age90"):
            continue
        owner, el = parts[0] if parts[0] not in ("Resource", "Element") else "DomainResource", None
        try:
            for name in parts[1:]:
                el = elements(owner, version).get(name)
                if el is None:
                    break
                owner = el.type
        except (KeyError, ValueError):
            continue  # a type this version lacks
        if el is not None and el.type not in PRIMITIVE_TYPES:
            wrong.append(f"{path}: {rule.method} on {el.type}")
    assert wrong == []


def test_auto_reads_a_record_marked_r5_as_r5(test_key):
    doc = json.loads(VISIT.read_text())  # its Patient's meta.profile is http://hl7.org/fhir/StructureDefinition/Patient|5.0.0
    auto = r5_engine(test_key, version=versions.AUTO).deidentify(doc, "visit").resource
    assert auto == r5_engine(test_key).deidentify(doc, "visit").resource


def test_an_r5_record_read_as_r4_is_bad_input_that_names_the_fix(test_key):
    doc = json.loads((R5_CASES / "safe-harbor" / "patient-over-89.json").read_text())  # no marker: auto reads R4
    for version in ("r4", versions.AUTO):
        with pytest.raises(InputError) as e:
            r5_engine(test_key, version=version).deidentify(doc, "old")
        assert "actualPeriod" in str(e.value) and "--fhir-version r5" in str(e.value)
        assert "Oldroyd" not in str(e.value) and "1931" not in str(e.value)


def test_r4_only_elements_read_as_r5_are_bad_input(test_key):
    encounter = {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "AMB"},
                 "period": {"start": "2025-03-14"}}
    with pytest.raises(InputError, match="not a valid FHIR R5 Encounter.*--fhir-version r4"):
        r5_engine(test_key).deidentify(encounter, "e1")


def test_without_validation_an_r5_resource_type_is_refused_in_an_r4_run(test_key):
    transport = {"resourceType": "Transport", "id": "t1", "status": "completed", "intent": "order"}
    with pytest.raises(InputError, match="not an R4 resource type"):
        r5_engine(test_key, validate=False, version="r4").deidentify(transport, "t1")
    assert r5_engine(test_key, validate=False, version=versions.AUTO).deidentify(transport, "t1").resource["id"] != "t1"


PATIENT = {"resourceType": "Patient", "id": "p1"}
MARKERS = [
    ([PATIENT], "r4", set()),
    ([{"resourceType": "CapabilityStatement", "fhirVersion": "5.0.0"}], "r5", {"fhirVersion 5.0.0"}),
    ([{"resourceType": "CapabilityStatement", "fhirVersion": "4.3.0"}], "r4", {"fhirVersion 4.3.0"}),
    ([{"resourceType": "ImplementationGuide", "fhirVersion": ["4.0.1"]}], "r4", {"fhirVersion 4.0.1"}),
    ([dict(PATIENT, meta={"profile": ["http://hl7.org/fhir/StructureDefinition/Patient|5.0.0"]})], "r5", {"meta.profile"}),
    ([dict(PATIENT, meta={"profile": ["http://hl7.org/fhir/R5/StructureDefinition/Patient"]})], "r5", {"meta.profile"}),
    ([dict(PATIENT, meta={"profile": ["http://hl7.org/fhir/StructureDefinition/Patient|4.0.1"]})], "r4", {"meta.profile"}),
    # another type's versioned url (a cross-version extension) and US Core say nothing of the record's version
    ([dict(PATIENT, meta={"profile": ["http://hl7.org/fhir/5.0/StructureDefinition/extension-Patient.sex"]})], "r4", set()),
    ([dict(PATIENT, meta={"profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient"]})], "r4", set()),
    ([{"resourceType": "Transport"}], "r5", {"resourceType Transport"}),
    ([{"resourceType": "Media"}], "r4", {"resourceType Media"}),
    ([{"resourceType": "MedicinalProduct"}], "r4", {"resourceType MedicinalProduct"}),
]


@pytest.mark.parametrize("resources,version,said", MARKERS)
def test_version_markers(resources, version, said):
    assert versions.detect(resources, "x") == version
    assert versions.markers(resources).get(version, set()) == said


def test_markers_that_disagree_are_refused_naming_both():
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": {"resourceType": "Transport"}}, {"resource": {"resourceType": "Media"}}]}
    with pytest.raises(InputError, match=r"more than one FHIR version \(R4: resourceType Media; R5: resourceType Transport\)"):
        versions.detect(versions.resources_of(bundle), "x")


def test_markers_are_read_from_any_json_without_error():
    odd = {"resourceType": "Bundle", "entry": 5, "contained": "x", "meta": {"profile": [3]}, "fhirVersion": 5}
    assert versions.detect(versions.resources_of(odd), "x") == "r4"


def test_the_r4_profile_is_unchanged_and_r5_has_plans_of_its_own():
    profile = load_profile("safe-harbor")
    assert profile.for_version("r4") is profile and profile.fhir_version == "r4"
    r5 = profile.for_version("r5")
    assert r5 is profile.for_version("r5") and r5.plans is not profile.plans
    assert "Coverage.subscriberId" in profile.rules and "Coverage.subscriberId" not in r5.rules
    assert r5.rules["VirtualServiceDetail.addressUrl"].method == "remove"
