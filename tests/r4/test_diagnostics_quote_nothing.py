"""Issue #36: a diagnostic repeats no string a sender wrote: positions, and the names FHIR and HL7 define, only."""
from __future__ import annotations

import pytest

from fhir_transforms.errors import InputError
from fhir_transforms.hl7v2.message import CharsetError, decode_bytes
from tests.conftest import make_engine

SECRET = "Zyxwortel6175550142"


@pytest.mark.parametrize("resource", [
    {"resourceType": "Patient", "id": "p1", SECRET: "x"},  # a key the models do not know
    {"resourceType": "Patient", "id": "p1", "name": [{"family": "Doe", SECRET: 1}]},
    {"resourceType": SECRET, "id": "p1"},  # a resourceType no version has
    {"resourceType": "Patient", "id": "p1", "_birthDate": {SECRET: True}, "birthDate": "1970"},
])
def test_invalid_fhir_is_named_by_place_not_by_what_it_holds(test_key, resource):
    with pytest.raises(InputError) as e:
        make_engine(test_key).deidentify(resource, "in.json")
    assert SECRET not in str(e.value) and "in.json" in str(e.value)


def test_an_unknown_msh18_is_not_repeated():
    with pytest.raises(CharsetError) as e:
        decode_bytes(f"MSH|^~\\&|A|B|C|D|20200101||ADT^A01|1|P|2.5.1||||||{SECRET}\r".encode())
    assert SECRET.upper() not in str(e.value).upper() and "MSH-18" in str(e.value)
