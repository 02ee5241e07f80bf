"""HL7v2 by the standard: datatype rules per version, dates only as dates, known identifiers, the guard, charsets."""
from __future__ import annotations

import base64
import re
from datetime import date, timedelta
from pathlib import Path

import pytest

from fhir_transforms.errors import InputError, LeakFound
from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2.engine import HL7Deidentifier, MessageWalk
from fhir_transforms.hl7v2.rules import is_calendar_dtm, load_hl7_profile
from fhir_transforms.hl7v2.standard import standard_version
from fhir_transforms.pseudonym import Pseudonymizer
from tests.conftest import DATA, FIXED_TODAY, SHARED, needs_shared
from text_deid.stack import build_stack

PID = "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F"


def msg(version: str, *segments: str, msh18: str = "", pid: str = PID) -> str:
    msh = f"MSH|^~\\&|APP|FAC|RCV|RFAC|20240101120000||ADT^A01|CTRL1|P|{version}||||||{msh18}"
    return "\r".join((msh, pid) + segments) + "\r"


@pytest.fixture(scope="module")
def deid(test_key) -> HL7Deidentifier:
    return HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), build_stack("patterns"),
                           lambda: FIXED_TODAY)


def field(out: str, sid: str, n: int) -> str:
    parts = next(s for s in out.split("\r") if s.startswith(sid)).split("|")
    return parts[n - (sid == "MSH")] if len(parts) > n - (sid == "MSH") else ""


PSEUDONYM = r"[0-9a-f]{32}"
# (segment line, segment, field, expected output, or a pattern it matches); `pid=True`: the line is the PID
CASES = [
    ("EVN|A01|20240101120000", "EVN", 2, "2024"),                     # TS (2.3, 2.5.1) / DTM (2.8)
    ("PV1|1|I|W1^R2^B3", "PV1", 3, ""),                               # PL
    ("PV1|1|I|||||12345^Welby^Marcus", "PV1", 7, ""),                 # XCN
    ("NK1|1|Quixote^Sancho|SPO", "NK1", 2, ""),                       # XPN
    ("NK1|1||SPO||(217)555-0100", "NK1", 5, ""),                      # XTN
    ("OBX|1|NM|76164006^Octanoylcarnitine^SCT||0.1", "OBX", 3, "76164006^Octanoylcarnitine^SCT"),  # CE/CWE
    ("OBX|1|NM|1^x^L||76164006", "OBX", 5, "76164006"),               # NM: a number, not a date
    ("OBX|1|ST|1^x^L||76164006", "OBX", 5, "76164006"),               # ST: not a calendar date
    ("OBX|1|ST|1^x^L||20141006", "OBX", 5, "2014"),                   # ST: a calendar date is a date
    ("PV1|1|I" + "|" * 44 + "20141006092900", "PV1", 46, "2014092900"),  # NM holding a date-time: dated
    ("PID|1||||||||||||||||||123-45-6789", "PID", 19, ""),            # SSN
    ("IN1|1|PLAN^Plan^L", "IN1", 2, "PLAN^Plan^L"),                   # CE/CWE code kept
    ("PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F|||1 Main St^^Boston^MA^02139^USA", "PID", 11,
     "MA^021"),                                                       # XAD: state kept, ZIP to 3 digits
    ("PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F", "PID", 3,
     re.compile(PSEUDONYM + r"\^\^\^\^MR")),                          # CX: keyed pseudonym, type kept
    ("PV1|1|I" + "|" * 17 + "VIS778899^^^HOSP^VN", "PV1", 19, re.compile(PSEUDONYM + r"\^\^\^\^VN")),  # CX
    ("ORC|NW|PL778899^EPIC^1.2.3^ISO", "ORC", 2, re.compile(PSEUDONYM)),  # EI: authority folded in, removed
    ("NK1|1|Quixote^Sancho|SPO|||||20200115", "NK1", 8, "2020"),     # DT
    ("TQ1|1||||||20240301120000", "TQ1", 7, "2024"),                  # TS (2.3, 2.5.1) / DTM (2.8)
    ("PV1|1|I" + "|" * 35 + "^20240301", "PV1", 37, "2024"),          # CM_DLD (2.3) / DLD: its date
    ("PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19700312|F|||||^PRN^PH^^1^617^5550142", "PID", 13, ""),  # XTN
    ("IN1|1|PLAN^Plan^L|||||||||||||Quixote^Donna", "IN1", 16, ""),  # XPN (insured)
    ("ORC|NW" + "|" * 20 + "Good Health^L^^^^HOSP&1.2.3&ISO^XX^^^1234", "ORC", 21, "Good Health"),  # XON: the
    # facility name kept (the facility rule), its identifier and authority removed
    ("OBX|7|NM|1^x^L||5|mg|||||F", "OBX", 1, "7"),                    # SI
    ("OBX|7|NM|1^x^L||5|mg|||||F", "OBX", 11, "F"),                   # ID
    ("OBX|1|SN|1^x^L||>^100|mg", "OBX", 5, ">^100"),                  # SN (not an age: kept)
    ("OBX|1|DT|1^x^L||20200301", "OBX", 5, "2020"),                   # DT as a value type
    ("OBX|1|CWE|1^x^L||260385009^Negative^SCT^^^^20200301", "OBX", 5,
     "260385009^Negative^SCT^^^^20200301"),                           # CWE value: code and version kept
    ("OBX|1|TX|1^x^L||Donna Quixote called", "OBX", 5, "[NAME] called"),  # TX
    ("NTE|1||Donna Quixote called", "NTE", 3, "[NAME] called"),       # FT
    ("OBX|1|ED|1^x^L||^TEXT^PLAIN^Base64^" + base64.b64encode(b"Donna Quixote").decode(), "OBX", 5,
     "TEXT^PLAIN^Base64^" + base64.b64encode(b"[NAME]").decode()),    # ED: text payload decoded, scanned
]


@pytest.mark.parametrize("version", ["2.3", "2.5.1", "2.8"])
@pytest.mark.parametrize("line,sid,n,expected", CASES)
def test_each_datatype_in_each_version(deid, version, line, sid, n, expected):
    out = deid.deidentify(msg(version, pid=line) if line.startswith("PID|1||MRN") else msg(version, line))
    got = field(out, sid, n)
    if sid == "PV1" and n == 46:  # year + the time as DTM precision allows: only the day is gone
        assert "20141006" not in got
    elif isinstance(expected, re.Pattern):
        assert expected.fullmatch(got.strip("^")), got
    else:
        assert got.strip("^&") == expected  # a removed component leaves its separators


def test_blg3_account_number_is_a_cx(deid):
    out = deid.deidentify(msg("2.5.1", "BLG|||ACC778899^^^FAC&1.2.3&ISO^AN"))
    assert "ACC778899" not in out and "1.2.3" not in field(out, "BLG", 3)


def test_calendar_dates_only():
    assert is_calendar_dtm("20141006092900+0700") and is_calendar_dtm("19700312")
    assert not is_calendar_dtm("76164006") and not is_calendar_dtm("20141306") and not is_calendar_dtm("5555")
    assert not is_calendar_dtm("20141006", with_time=True)


@pytest.mark.parametrize("line,category", [
    ("PID|1||||||||||||||||||123-45-6789", "SOCIAL_SECURITY_NUMBER"),
    ("PID|1|||||||||||||||||||D1234567^IL", "CERTIFICATE_LICENSE_NUMBER"),
    ("PID|1||X98765432^^^USA^PPN", "CERTIFICATE_LICENSE_NUMBER"),
])
def test_ssn_licence_passport_are_guard_needles(deid, monkeypatch, line, category):
    copy = line.split("|")[-1].split("^")[0]
    out = deid.deidentify(msg("2.5.1", "ZPI|1|" + copy, pid=line))
    assert copy not in out  # the Z-segment copy is masked by the text stack, which knows it
    monkeypatch.setattr(deid.stack, "detect_many", lambda texts, known: [[] for _ in texts])
    with pytest.raises(LeakFound) as e:
        deid.deidentify(msg("2.5.1", "ZPI|1|" + copy, pid=line))
    assert category in str(e.value) and copy not in str(e.value)


def test_birth_date_of_a_90_year_old_is_removed_in_a_z_segment_copy(deid):
    old = "PID|1||MRN12345^^^HOSP^MR||Quixote^Donna||19300312|F"
    out = deid.deidentify(msg("2.5.1", "ZPD|1|19300312|19300312120000", "OBX|1|DT|1^x^L||19300312", pid=old))
    assert field(out, "PID", 7) == "" and field(out, "ZPD", 2) == "" and field(out, "ZPD", 3) == ""
    assert field(out, "OBX", 5) == ""


def test_msa2_gets_the_pseudonym_of_the_control_id_it_answers(deid):
    sent = deid.deidentify(msg("2.5.1"))
    ack = "MSH|^~\\&|RCV|RFAC|APP|FAC|20240101120001||ACK^A01|A1|P|2.5.1\rMSA|AA|CTRL1\r"
    assert field(deid.deidentify(ack), "MSA", 2) == field(sent, "MSH", 10) != "CTRL1"


def test_sft_version_and_profile_ids_equal_to_dates_are_kept_and_not_refused(deid):
    out = deid.deidentify(msg("2.5.1", "SFT|Vendor|20190101|Product|20190101").replace(
        "ADT^A01|CTRL1|P|2.5.1", "ADT^A01|CTRL1|P|2.5.1|||||||||PH_SS^SS Sender^2.16.840.1.114222.4.10.3^ISO"))
    assert field(out, "SFT", 2) == "20190101" and "PH_SS" in out


def test_known_date_followed_by_a_time_is_a_leak(deid, monkeypatch):
    monkeypatch.setattr(deid.stack, "detect_many", lambda texts, known: [[] for _ in texts])
    with pytest.raises(LeakFound) as e:
        deid.deidentify(msg("2.5.1", "ZXX|1|born 197003120815 here"))
    assert "DATE" in str(e.value)


def test_ed_html_in_windows_1252_is_read_and_written_in_it(deid):
    html = '<html><meta charset="windows-1252"><p>Donna Quixote 4 \u00b5mol/L</p></html>'.encode("cp1252")
    ed = base64.b64encode(html).decode()
    out = deid.deidentify(msg("2.5.1", f"OBX|1|ED|1^x^L||^TEXT^HTML^Base64^{ed}"))
    data = base64.b64decode(field(out, "OBX", 5).split("^")[4])
    text = data.decode("cp1252")
    assert "Quixote" not in text and "\u00b5mol/L" in text


def test_msh18_and_the_bytes_agree(deid):
    latin = deid.deidentify(msg("2.5.1", "NTE|1||4 \u00b5mol/L", msh18="8859/1"))
    assert field(latin, "MSH", 18) == "8859/1" and er7.encode(latin) == latin.encode("latin-1")
    euro = deid.deidentify(msg("2.5.1", "NTE|1||5 \u20ac", msh18="ASCII"))
    assert field(euro, "MSH", 18) == "UNICODE UTF-8" and er7.encode(euro) == euro.encode("utf-8")
    plain = deid.deidentify(msg("2.5.1", "NTE|1||5 \u00e9"))
    assert field(plain, "MSH", 18) == "UNICODE UTF-8"


def test_longitudinal_shift_onto_another_date_is_no_leak(test_key):
    deid = HL7Deidentifier.from_names("longitudinal", Pseudonymizer(test_key), build_stack("patterns"),
                                      lambda: FIXED_TODAY)
    offset = deid.pseudo.day_offset("HOSP|MRN12345")  # the patient's key: PID-3's authority and value
    # DB1-6 lands on EVN-2's original date: the guard must not take the written date for a survivor
    target = date(2024, 1, 1)
    source = (target - timedelta(days=offset)).strftime("%Y%m%d")
    out = deid.deidentify(msg("2.5.1", "EVN|A01|20240101", f"DB1|1|PT||Y|20200101|{source}"))
    assert field(out, "DB1", 6) == "20240101"


def _samples() -> list[Path]:
    """The shared sample and peer corpora where ../shared is beside the checkout, else the repository's samples."""
    if SHARED.is_dir():
        return sorted(p for d in ("hl7v2", "hl7v2-peer") for p in (SHARED / d).rglob("*.hl7"))
    return sorted((DATA / "hl7v2").rglob("*.hl7"))


# fields that may keep a full date in the output, none about a person: MSH-7 is not kept whole (year), so
# only kept structure: SFT (software install dates, versions), MSH-21 (profile ids)
NOT_ABOUT_A_PERSON = {"SFT", "MSH.21"}
# a digit run that may be a full date, inside any value (a note, a Z-segment, an id with a date in it)
DIGIT_RUN = re.compile(r"(?<!\d)\d{8,14}(?:[+-]\d{4})?(?!\d)")
# CE/CNE/CWE components that are codes, coding systems, their versions and OIDs (not the texts 2, 5, 9, 11)
CODE_COMPONENTS = (1, 3, 4, 6, 7, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22)


def test_no_full_date_survives_and_codes_are_unchanged(deid):
    """Over every sample: no valid calendar date (with or without a time) in any value of the output, whole or
    inside, except in NOT_ABOUT_A_PERSON; every code and coding-system component of CE/CWE/CNE fields (and coded
    OBX-5) as it was, unless it was a date with a time (dated) or one of the patient's own values (removed)."""
    written = 0
    for path in _samples():
        try:
            text = er7.decode_bytes(path.read_bytes())
            out = deid.deidentify_file_text(text)
        except InputError:
            continue
        written += 1
        for before, after in zip(er7.parse_text(text), er7.parse_text(out)):
            profile = deid.profile
            d = before.delimiters
            version = _version(before)
            persons = set() if before.envelope else _known_values(deid, before)
            walk = MessageWalk(deid, before, set())
            for sb, sa in zip(before.segments, after.segments):
                # a segment a sender glued on ("PID|…|PV1|1|…") is ruled as its own fields, not as these
                glued = next((m for m in sb.numbers() if walk._glued_at(sb, m)), None)
                for n in sa.numbers():
                    if sa.sid in NOT_ABOUT_A_PERSON or f"{sa.sid}.{n}" in NOT_ABOUT_A_PERSON:
                        continue
                    for leaf in _leaves(sa.get(n), d):
                        assert not any(is_calendar_dtm(run) for run in DIGIT_RUN.findall(leaf)), \
                            f"{path.name}: a full date in {sa.sid}-{n}"
                    coded = profile.datatype_of(sa.sid, n, version) in ("CE", "CWE", "CNE") or (
                        (sa.sid, n) == ("OBX", 5) and sa.get(2).split(d.component)[0] in ("CE", "CWE", "CNE"))
                    if not coded or profile.fields.get(f"{sa.sid}.{n}") or (glued and n > glued):
                        continue
                    for rb, ra in zip(er7.split_field(sb.get(n), d), er7.split_field(sa.get(n), d)):
                        for i in CODE_COMPONENTS:
                            cb = rb[i - 1] if len(rb) >= i else [""]
                            ca = ra[i - 1] if len(ra) >= i else [""]
                            if ca == cb or is_calendar_dtm(cb[0], with_time=True) or not any(map(str.isalnum, cb[0])):
                                continue  # kept; a date; a placeholder a sample's authors masked (asterisks)
                            assert ca == [""] and er7.decode(cb[0], d)[0].strip().casefold() in persons, \
                                f"{path.name}: {sa.sid}-{n}.{i} changed"
    assert written > (250 if SHARED.is_dir() else 10)


def _known_values(deid: HL7Deidentifier, message: er7.Message) -> set[str]:
    """The values the engine knows as the patient's, and their words (a kept code equal to one is removed)."""
    walk = MessageWalk(deid, er7.parse_message(message.to_er7()), set())
    walk.run()
    return {v for k in walk.known for v in [k.value.strip().casefold(), *k.value.casefold().split()]}


def _version(m: er7.Message) -> str:
    return standard_version(m.segments[0].get(12).split(m.delimiters.component)[0] if m.segments[0].sid == "MSH" else "")


def _leaves(raw: str, d: er7.Delimiters):
    for r in er7.split_field(raw, d):
        for c in r:
            for s in c:
                yield er7.decode(s, d)[0]


@pytest.mark.parametrize("unit, value, expected", [
    ("a^year^UCUM", "95", "90"), ("yrs", "90", "90"), ("^Years", "104.5", "90"), ("a^year^UCUM", "45", "45"),
    ("mg/dL^milligrams per deciliter^UCUM", "95", "95")])
def test_nm_observation_in_years_is_an_age(deid, unit, value, expected):
    """An NM observation whose unit is years is an age whatever its code: 90 and over becomes 90."""
    out = deid.deidentify(msg("2.5.1", f"OBX|1|NM|99999-9^Some duration^LN||{value}|{unit}"))
    assert field(out, "OBX", 5) == expected


# (OBX-2, OBX-3 code, OBX-5, OBX-6, expected OBX-5): ages of 90 years or more become the one category 90+
AGES = [
    ("NM", "30525-0", "95", "a^year^UCUM", "90"),        # NM holds no comparator: 90, as FHIR's Age value
    ("NM", "30525-0", "89", "a^year^UCUM", "89"),
    ("NM", "21612-7", "1200", "mo^month^UCUM", "1080"),  # 100 years in months: 90 years, in the unit sent
    ("NM", "21612-7", "100", "mo^month^UCUM", "100"),    # 8 years
    ("NM", "29553-5", "92", "", "90"),                   # an age code without a unit: years
    ("SN", "29553-5", "^95", "a^year^UCUM", ">=^90"),    # SN keeps FHIR's comparator: >= 90 a
    ("SN", "30525-0", ">^89", "a^year^UCUM", ">=^90"),
    ("SN", "30525-0", "^85^-^95", "a^year^UCUM", ">=^90"),  # a range reaching 90
    ("SN", "30525-0", "^45", "a^year^UCUM", "^45"),
    ("ST", "30525-0", "95 years", "", ">=90 years"),
    ("ST", "21612-7", ">89", "a^year^UCUM", ">=90"),
    ("ST", "30525-0", "45", "a^year^UCUM", "45"),
    ("ST", "99999-9", "95", "yr", ">=90"),               # any code, in years: an age
]


@pytest.mark.parametrize("version", ["2.3", "2.5.1", "2.8"])
@pytest.mark.parametrize("vtype, code, value, unit, expected", AGES)
def test_ages_over_89_in_nm_sn_st_observations_become_90_plus(deid, version, vtype, code, value, unit, expected):
    out = deid.deidentify(msg(version, f"OBX|1|{vtype}|{code}^Age^LN||{value}|{unit}"))
    assert field(out, "OBX", 5) == expected
    assert field(out, "OBX", 6) == unit


@pytest.mark.parametrize("folder", [DATA / "hl7v2", pytest.param(SHARED / "hl7v2-peer", marks=needs_shared)],
                         ids=["samples", "peer"])
def test_the_guard_reads_a_segment_whole_exactly_as_field_by_field(deid, folder):
    """The leak guard searches most segments as one text (`_guard_texts`) and reads fields and paths only
    when it finds something: for every sample segment as received, alone after its MSH, with the message's
    known identifiers (and dates a rule wrote, or none), that first search finds a known identifier exactly
    where the field by field search does, and a known day wherever that finds one with a time."""
    from fhir_transforms.hl7v2.engine import _guard_texts, _output_strings
    from fhir_transforms.hl7v2.identifying import dates_with_time, holds_known_day
    from text_deid import leak_guard
    outcomes = set()
    for path in sorted(folder.rglob("*.hl7")):
        try:
            messages = [m for m in er7.parse_text(er7.decode_bytes(path.read_bytes())) if not m.envelope]
        except InputError:
            continue
        for message in messages:
            walk = MessageWalk(deid, er7.parse_message(message.to_er7()), set())
            try:
                walk.run()
            except InputError:
                continue
            guarded = walk.known_identifiers()[1]
            for seg in message.segments[1:]:
                alone = er7.Message([message.segments[0], seg], message.delimiters)
                for written in (set(), {(2, v) for _, v in walk.written_dates}):
                    texts = _guard_texts(alone, deid.profile, walk.version, written)
                    strings = _output_strings(alone, deid.profile, walk.version, written, skip_codes=False)
                    clean = leak_guard.clean(texts, guarded)
                    assert clean == (leak_guard.scan(strings, guarded) == []), (path.name, seg.sid)
                    assert holds_known_day(texts, guarded) or not dates_with_time(strings, guarded)
                    outcomes.add(clean)
    assert outcomes == {True, False}


def test_the_guard_sets_aside_the_dates_a_rule_wrote_when_it_reads_a_segment_whole(test_key):
    """Shifted dates (`longitudinal`) written into the output are not read, segment whole or field by field:
    with each written day made a known one, both searches agree, and find the days only where they are not
    set aside (or where the same day stands unwritten)."""
    from fhir_transforms.hl7v2.engine import _guard_texts, _output_strings
    from fhir_transforms.hl7v2.identifying import dates_with_time, holds_known_day
    from text_deid import leak_guard
    from text_deid.spans import KnownIdentifier
    deid = HL7Deidentifier(load_hl7_profile("longitudinal"), Pseudonymizer(test_key), build_stack("patterns"),
                           lambda: FIXED_TODAY)
    checked, found = 0, {True: 0, False: 0}  # set aside or not → messages in which the days are found
    for path in sorted((DATA / "hl7v2").glob("*.hl7")):
        for message in (m for m in er7.parse_text(er7.decode_bytes(path.read_bytes())) if not m.envelope):
            walk = MessageWalk(deid, message, set())
            walk.run()
            walk.finish()
            days = tuple(KnownIdentifier(f"{v[:4]}-{v[4:6]}-{v[6:8]}", "DATE") for _, v in walk.written_dates
                         if len(v) >= 8)
            if not days:
                continue
            for written in (walk.written_dates, set()):
                texts = _guard_texts(message, deid.profile, walk.version, written)
                strings = _output_strings(message, deid.profile, walk.version, written, skip_codes=False)
                clean = leak_guard.clean(texts, days)
                assert clean == (leak_guard.scan(strings, days) == [])
                assert holds_known_day(texts, days) or not dates_with_time(strings, days)
                found[bool(written)] += not clean or bool(dates_with_time(strings, days))
            checked += 1
    assert checked > 10 and found[False] == checked and found[True] < found[False]


def test_context_only_names_in_a_z_segment_are_masked_by_the_default_stack(test_key):
    """#32: a neighbour named only in the note, a place no list holds, both halves of the patient's double surname."""
    deid = HL7Deidentifier(load_hl7_profile("safe-harbor"), Pseudonymizer(test_key), build_stack("no-llm"),
                           lambda: FIXED_TODAY)
    note = "Visited by her neighbour Søndergaard; daughter Donna Quixote-Reyes called from Tromsø."
    out = deid.deidentify(msg("2.5.1", "ZPI|1|" + note))
    assert field(out, "ZPI", 2) == "Visited by her neighbour [NAME]; daughter [NAME] called from [GEOGRAPHIC_LOCATION]."
