"""The one pseudonym function: deterministic per key, different across keys, UUIDs stay UUIDs."""
import uuid

from hypothesis import given, strategies as st

from fhir_transforms.keys import Key, key_id_for
from fhir_transforms.pseudonym import MAX_SHIFT_DAYS, Pseudonymizer

K1 = Key(key_id_for(b"1" * 32), b"1" * 32)
K2 = Key(key_id_for(b"2" * 32), b"2" * 32)


@given(st.text(min_size=1, max_size=80), st.text(max_size=20))
def test_same_value_same_key_same_pseudonym_other_key_other(value, namespace):
    a, b, c = Pseudonymizer(K1), Pseudonymizer(K1), Pseudonymizer(K2)
    assert a.token(namespace, value) == b.token(namespace, value)
    assert a.token(namespace, value) != c.token(namespace, value)
    assert a.token(namespace, value) != a.token(namespace + "x", value)


@given(st.uuids())
def test_uuid_resource_ids_stay_uuids(u):
    p = Pseudonymizer(K1)
    out = p.resource_id(str(u))
    assert uuid.UUID(out).version == 4
    assert out != str(u)
    assert p.resource_id(str(u).upper()) == out  # UUIDs compare case-insensitively


@given(st.from_regex(r"[A-Za-z0-9\-.]{1,64}", fullmatch=True))
def test_resource_ids_are_valid_fhir_ids(value):
    out = Pseudonymizer(K1).resource_id(value)
    assert 1 <= len(out) <= 64 and all(c.isalnum() or c in "-." for c in out)


@given(st.text(min_size=1, max_size=40))
def test_day_offset_is_in_range_and_never_zero(patient_id):
    offset = Pseudonymizer(K1).day_offset(patient_id)
    assert -MAX_SHIFT_DAYS <= offset <= MAX_SHIFT_DAYS and offset != 0
    assert offset == Pseudonymizer(K1).day_offset(patient_id)


def test_identifier_pseudonyms_are_namespaced_by_system():
    p = Pseudonymizer(K1)
    assert p.identifier("http://a", "12345") != p.identifier("http://b", "12345")


def test_key_never_in_repr():
    assert K1.secret.decode() not in repr(K1) and K1.secret.decode() not in repr(Pseudonymizer(K1).__dict__.get("key_id"))
