"""The copy of presidio-analyzer's patterns and checks (text_deid/detectors/presidio_patterns.py) is the
installed presidio's: same regexes, same answers on valid, invalid and malformed values."""
from __future__ import annotations

import random

from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    IpRecognizer,
    MedicalLicenseRecognizer,
    UsNpiRecognizer,
    UsSsnRecognizer,
)
from presidio_analyzer.predefined_recognizers.generic.email_recognizer import EmailRecognizer
from presidio_analyzer.predefined_recognizers.generic.url_recognizer import UrlRecognizer

from text_deid.detectors import presidio_patterns as copy


def test_the_regexes_are_presidios():
    assert copy.PATTERNS["credit_card"] == CreditCardRecognizer.PATTERNS[0].regex
    assert copy.PATTERNS["ip"] == {p.name: p.regex for p in IpRecognizer.PATTERNS}
    assert copy.PATTERNS["email"] == EmailRecognizer.PATTERNS[0].regex
    assert copy.PATTERNS["url"] == UrlRecognizer.PATTERNS[1].regex
    assert copy.PATTERNS["dea"] == MedicalLicenseRecognizer.PATTERNS[0].regex


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def test_the_checks_answer_as_presidio_does():
    rng = random.Random(23)
    cc, npi, dea, ssn, ip = (CreditCardRecognizer(), UsNpiRecognizer(), MedicalLicenseRecognizer(),
                             UsSsnRecognizer(), IpRecognizer())
    for _ in range(3000):
        card = "-".join(_digits(rng, 4) for _ in range(4))
        assert copy.credit_card_valid(card) == cc.validate_result(card)
        number = rng.choice("12") + _digits(rng, 9)
        assert copy.npi_valid(number) == npi.validate_result(number)
        licence = rng.choice("ABFM") + rng.choice("BJKZ") + _digits(rng, 7)
        assert copy.dea_valid(licence) == bool(dea.validate_result(licence))
        sep = rng.choice(["-", " ", ".", ""])
        social = sep.join([rng.choice(["000", "666", "123", _digits(rng, 3)]), rng.choice(["00", _digits(rng, 2)]),
                           rng.choice(["0000", _digits(rng, 4)])])
        assert copy.ssn_invalid(social) == bool(ssn.invalidate_result(social))
    for text in ["123-45-6789", "111-11-1111", "123-45 6789", "078-05-1120"]:
        assert copy.ssn_invalid(text) == bool(ssn.invalidate_result(text))
    for text in ["10.0.0.1", "256.1.1.1", "::1", "fe80::1%eth0", "2001:db8::/32", "1.2.3.4/33", "::ffff:1.2.3.4"]:
        assert copy.ip_invalid(text) == bool(ip.invalidate_result(text))
