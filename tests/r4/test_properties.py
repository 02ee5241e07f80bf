"""Properties that must hold for every input: references resolve, output is deterministic,
no known identifier survives in narrative."""
from __future__ import annotations

import copy
import json
import random
import re
import string

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.conftest import DATA, make_engine
from fhir_transforms.errors import InputError, LeakFound, RecordRefused

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9\-.]{0,20}", fullmatch=True)
words = st.text(alphabet=string.ascii_letters, min_size=3, max_size=10)


@st.composite
def bundles(draw):
    """A collection of Patients and Observations pointing at them in the ways FHIR allows."""
    n = draw(st.integers(1, 4))
    patient_ids = draw(st.lists(st.one_of(ids, st.uuids().map(str)), min_size=n, max_size=n, unique=True))
    entries = []
    for pid in patient_ids:
        urn = draw(st.booleans())
        full_url = f"urn:uuid:{pid}" if urn and len(pid) == 36 and pid.count("-") == 4 else f"http://h.example/fhir/Patient/{pid}"
        entries.append({"fullUrl": full_url, "resource": {"resourceType": "Patient", "id": pid}})
    patients = list(entries)
    for i in range(draw(st.integers(0, 6))):
        target = draw(st.sampled_from(patients))["fullUrl"]
        ref = target if target.startswith("urn:") or draw(st.booleans()) else "Patient/" + target.rsplit("/", 1)[1]
        entries.append({"fullUrl": f"http://h.example/fhir/Observation/o{i}", "resource": {
            "resourceType": "Observation", "id": f"o{i}", "status": "final", "code": {"text": "x"},
            "subject": {"reference": ref}}})
    return {"resourceType": "Bundle", "type": "collection", "entry": entries}


def _resolvable(bundle) -> set[str]:
    names = set()
    for e in bundle["entry"]:
        names.add(e["fullUrl"])
        names.add(f"{e['resource']['resourceType']}/{e['resource']['id']}")
    return names


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bundles())
def test_every_reference_still_resolves_and_output_is_deterministic(test_key, bundle):
    engine = make_engine(test_key, validate=False)
    out = engine.deidentify(bundle).resource
    assert out == engine.deidentify(bundle).resource
    names = _resolvable(out)
    for before, after in zip(bundle["entry"], out["entry"]):
        ref = before["resource"].get("subject", {}).get("reference")
        if ref:
            assert after["resource"]["subject"]["reference"] in names
        assert after["resource"]["id"] != before["resource"]["id"]


def narrative_text(div: str) -> str:
    """A div's text, lowercased, without its markup (a name "TML" is in every div's xmlns, ...xhtml)."""
    return re.sub(r"<[^>]*>", " ", div).lower()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(given_name=words, family=words,
       filler=st.lists(st.sampled_from(["pt", "seen", "today", "with", "cough", ",", "."]), max_size=8))
@example(given_name="AAA", family="WWW", filler=[])  # in the div's xmlns: the guard refused the record
@example(given_name="AAA", family="NAME", filler=[])  # in the stack's own [NAME] tags: refused the same way
@example(given_name="AAA", family="GENERATED", filler=[])  # Narrative.status "generated": refused at the code
def test_no_known_name_survives_in_narrative(test_key, given_name, family, filler):
    engine = make_engine(test_key, validate=False)
    note = " ".join(filler + [given_name, family.upper(), "and", f"{family}, {given_name}", f"{given_name[0]}. {family}"])
    patient = {"resourceType": "Patient", "id": "p", "name": [{"family": family, "given": [given_name]}],
               "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{note}</div>'}}
    try:
        div = narrative_text(engine.deidentify(patient).resource["text"]["div"])
    except LeakFound as e:  # a name that spells one of the record's kept codes is refused there, by design
        assert "1 known identifier(s) survived: NAME at Patient.text.status" in str(e)  # "generated"
        return
    assert family.lower() not in div.replace("[name]", "")
    assert given_name.lower() not in div.replace("[name]", "")


@pytest.mark.parametrize("given_name, family", [("Anh", "Do"), ("Dana", "Miss"), ("Rev", "Smith"), ("abc", "PHD")])
def test_a_name_that_spells_a_title_is_masked_in_narrative(test_key, given_name, family):
    """Do is a common family name and also the credential DO: HumanName.given and .family are names, whatever
    word they spell (titles have their own elements, prefix and suffix). Found by the property test above."""
    engine = make_engine(test_key, validate=False)
    note = f"Dr. {given_name} {family} and {family.upper()}, {given_name}; {given_name[0]}. {family} seen"
    patient = {"resourceType": "Patient", "id": "p", "name": [{"family": family, "given": [given_name]}],
               "text": {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{note}</div>'}}
    div = narrative_text(engine.deidentify(patient).resource["text"]["div"]).replace("[name]", "")
    assert family.lower() not in div and given_name.lower() not in div, div


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=15)
patient_like = st.fixed_dictionaries(
    {"resourceType": st.just("Patient")},
    optional={k: json_values for k in ("id", "name", "telecom", "address", "birthDate", "text", "contact", "extension",
                                       "identifier", "gender", "photo")})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patient_like)
def test_without_validation_bad_shapes_are_input_errors_never_crashes(test_key, doc):
    engine = make_engine(test_key, validate=False)
    try:
        engine.deidentify(doc)
    except (InputError, RecordRefused):
        pass


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("doc", [
    {"resourceType": "Bundle", "entry": 1}, {"resourceType": "Bundle", "entry": "x"}, {"resourceType": "Patient", "contained": 1},
    {"resourceType": "Bundle", "entry": [{"resource": {"resourceType": "Patient", "contained": 1}}]}])
@pytest.mark.parametrize("version", [None, "auto"])
def test_an_entry_or_contained_that_is_no_list_is_bad_input(test_key, doc, validate, version):
    """Found by the HTTP fuzz test (a 500): the record's resources, reference targets and the R4-only check
    read `entry` and `contained` before anything has checked that they are lists."""
    with pytest.raises(InputError):
        make_engine(test_key, validate=validate).deidentify(doc, fhir_version=version)



@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("doc", [
    {"resourceType": ["Patient"]}, {"resourceType": {"reference": "x"}, "id": "1"},
    {"resourceType": "Patient", "extension": [{"url": {"a": 1}, "valueString": "x"}]},
    {"resourceType": "Patient", "extension": [{"url": [], "valueString": "x"}]},
    {"resourceType": "Patient", "modifierExtension": [{"url": {"a": 1}, "valueString": "x"}]},
    {"resourceType": "Patient", "telecom": [{"system": [], "value": "555-123-4567"}]},
    {"resourceType": "Patient", "identifier": [{"type": "MR", "value": "12345678"}]},
    {"resourceType": "Patient", "identifier": [{"type": {"coding": 1}, "value": "12345678"}]},
    {"resourceType": "Patient", "identifier": [{"type": {"coding": [1, {"code": []}]}, "value": "12345678"}]},
    {"resourceType": "Patient", "identifier": [{"system": {"a": 1}, "value": "12345678"}]},
    {"resourceType": "Observation", "status": "final", "code": {"coding": 1, "text": "Blood pressure"}},
])
def test_a_value_of_the_wrong_json_shape_is_bad_input_never_a_crash(test_key, doc, validate):
    """Found by mutating the samples' resources (a value replaced by one of another JSON type): the
    known-identifier collector, identifier types and systems, extension urls and resource types were read as
    strings before anything had checked that they were (TypeError, AttributeError: a 500 over HTTP)."""
    try:
        make_engine(test_key, validate=validate).deidentify(doc)
    except (InputError, RecordRefused):
        pass


MUTANTS = [None, 1, -1, 0.5, True, "", "x", "2020-13-45", "urn:uuid:", "#", "Patient/", [], {}, [None], [1], [{}],
           {"a": 1}, "<div>x</div>", [[]], {"reference": 1}, {"resourceType": "Patient"}, {"resourceType": 1}]


def _paths(node, here=()):
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield here + (k,)
        yield from _paths(v, here + (k,))


def test_mutated_sample_resources_are_bad_input_never_a_crash(test_key):
    """The samples' resources with one to three values replaced by values of other JSON types, without
    validation (where the engine reads unchecked shapes): each is de-identified or refused as bad input."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    resources = []
    for path in sorted((DATA / "fhir").rglob("*.json")):
        doc = json.loads(path.read_text())
        entries = doc.get("entry", []) if doc.get("resourceType") == "Bundle" else [{"resource": doc}]
        resources += [e["resource"] for e in entries[:20] if isinstance(e.get("resource"), dict)]
    engine = make_engine(test_key, validate=False)
    for _ in range(300):
        doc = copy.deepcopy(rng.choice(resources))
        for _ in range(rng.randint(1, 3)):
            where = rng.choice(list(_paths(doc)) or [("id",)])
            node = doc
            for step in where[:-1]:
                node = node[step]
            node[where[-1]] = copy.deepcopy(rng.choice(MUTANTS))
        try:
            engine.deidentify(doc, fhir_version=rng.choice([None, "auto"]))
        except (InputError, RecordRefused):
            pass
        except Exception as e:  # noqa: BLE001 - the failure names the seed that reproduces it
            raise AssertionError(f"{type(e).__name__} on a mutated {doc.get('resourceType')!r} (seed {seed})") from e
