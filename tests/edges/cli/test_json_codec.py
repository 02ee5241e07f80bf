"""The JSON reader and writer every edge uses: msgspec's C parser and encoder where they are sure to give the
stdlib's answer (issue #23), the stdlib's everywhere else, to the same documents and the same bytes."""
from __future__ import annotations

import json
import math
import random
import struct

import pytest

from adapter import files, json_input
from tests.conftest import DATA

BUNDLE = next(iter(sorted((DATA / "fhir" / "synthea-bundles").glob("*.json"))))


def stdlib_loads(text):
    """What `loads` answered before msgspec: the stdlib's parse with the duplicate-key hook."""
    return json.loads(text, object_pairs_hook=json_input._unique_pairs)


def random_string(rng: random.Random) -> str:
    alphabet = ['a', 'Z', '0', ':', ' ', '"', '\\', '/', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', '€', '\u2028',
                '\U0001F600', '{', '[', '}', ']', ',', 'e', '+', '-', '.', 'null']
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def random_float(rng: random.Random) -> float:
    kind = rng.randint(0, 3)
    if kind == 0:  # any bit pattern: exponents of every size, subnormals
        value = struct.unpack("d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        return value if math.isfinite(value) else 0.5
    if kind == 1:
        return round(rng.uniform(-1000, 1000), rng.randint(0, 6))  # lab values
    return rng.choice([0.0, -0.0, 1e16, 1e-5, 1e-7, 123456789012345680.0, 1e22, 5e-324, 0.1, 100.0])


def random_doc(rng: random.Random, depth: int = 0):
    kind = rng.randint(0, 9 if depth < 5 else 5)
    if kind == 0:
        return random_string(rng)
    if kind == 1:
        return rng.choice([rng.randint(-10**6, 10**6), 2**63, -2**64 - 1, 10**30])
    if kind == 2:
        return random_float(rng)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return random_string(rng)
    if kind in (6, 7):
        return [random_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_string(rng): random_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def spellings(doc) -> list[str]:
    return [json.dumps(doc), json.dumps(doc, ensure_ascii=False), json.dumps(doc, indent=2),
            json.dumps(doc, separators=(",", ":"), ensure_ascii=False)]


def test_the_reader_gives_the_stdlib_document_for_random_json():
    rng = random.Random(23)
    for _ in range(3000):
        for text in spellings(random_doc(rng)):
            for given in (text, text.encode()):
                assert repr(json_input.loads(given)) == repr(stdlib_loads(given))  # repr: 1 vs 1.0, -0.0


@pytest.mark.parametrize("text", [
    '{"a": 1, "a": 2}',
    '{"a": "\\u003a", "a": 1}',  # the duplicate's ':' offset by an escaped one in a string
    '{"a": 1, "b": "\\u003A", "a": 1}',
    '{"a:b": 1, "a:b": 1}',
    '{"a": "x:y", "a": "x:y"}',
    '[{"ok": 1}, {"x": {"y": [1, {"z": 1, "z": 1}]}}]',
    '{"k": "\\"", "k": "\\""}',
])
def test_a_duplicate_key_is_refused_however_it_is_spelled(text):
    for given in (text, text.encode()):
        with pytest.raises(json_input.JsonInputError, match="duplicate JSON key"):
            json_input.loads(given)


def test_a_duplicate_in_random_documents_is_refused():
    rng = random.Random(17)
    for _ in range(500):
        doc = {random_string(rng) + "k": random_doc(rng) for _ in range(rng.randint(1, 4))}
        key = next(iter(doc))
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
        twice = "{" + json.dumps(key) + ": " + json.dumps(random_doc(rng)) + ", " + text[1:]
        with pytest.raises(json_input.JsonInputError, match="duplicate JSON key"):
            json_input.loads(twice)


@pytest.mark.parametrize("text", ['"\\ud800"', b'\xef\xbb\xbf{}'])
def test_what_msgspec_refuses_is_read_as_the_stdlib_reads_it(text):
    assert json_input._quick(text) is json_input._UNSURE
    assert repr(json_input.loads(text)) == repr(stdlib_loads(text))


@pytest.mark.parametrize("text", ['{"a": NaN}', '[Infinity, -Infinity]', '{"v": 1e400}'])
def test_what_msgspec_refuses_as_not_finite_is_refused(text):
    assert json_input._quick(text) is json_input._UNSURE
    with pytest.raises(json_input.JsonInputError, match="NaN or Infinity"):
        json_input.loads(text)


def test_plain_fhir_takes_the_quick_parse():
    text = BUNDLE.read_text()
    assert json_input._quick(text) is not json_input._UNSURE
    assert json_input.loads(text) == json.loads(text)


def test_the_writer_gives_the_stdlib_bytes():
    rng = random.Random(5)
    docs = [random_doc(rng) for _ in range(3000)]
    docs += [{"v": random_float(rng)} for _ in range(3000)]
    docs += [{"s": "null"}, {"s": "x:1e5,"}, [1e16, 1e-7], {"a": None}]
    for doc in docs:
        assert files.compact(doc) == json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
        if isinstance(doc, dict):
            assert files.serialize([doc], False) == (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode()
            assert files.serialize([doc, doc], True) == 2 * (
                json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def test_plain_fhir_is_written_by_msgspec():
    doc = json.loads(BUNDLE.read_text())
    text = files._ENCODE(doc)
    assert b"null" not in text and b"0.0000" not in text and not files._has_exponent(text)
