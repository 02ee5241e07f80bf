"""Site rules and the files a user names are data, never a program: alias bombs, unknown tags, deep nesting,
FIFOs and oversized files are refused with file and line (exit 2); FHIRPath conditions are an allowed subset
(no trace(), repeat(), aggregate(); matches() in RE2), evaluated under a budget that refuses the record."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from adapter.http.auth import TokenFileError, TokenStore
from adapter.review.auth import UsersFileError, UserStore
from adapter.review.queue import Thresholds
from fhir_transforms import keys
from fhir_transforms.config import fhirpath
from fhir_transforms.errors import RecordRefused
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.r4.site import site_profile
from fhir_transforms.rules import ProfileError
from fhir_transforms.site_rules import RulesFileError, read_site_rules
from tests.conftest import FIXED_TODAY, ROOT
from text_deid import budget
from text_deid.stack import build_stack

BOMB = "extends: safe-harbor\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
PHONE = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"
PATIENT = {"resourceType": "Patient", "id": "p1", "name": [{"family": "Qqqplanted", "given": ["Zyxwvut"]}],
           "telecom": [{"system": "phone", "value": PHONE, "use": "home"}]}
SLOW = ("value.toChars().select(%context.value.toChars().select(%context.value.toChars()"
        ".select(%context.value.toChars()))).count() > 0")


def finishes(fn, seconds: float = 30):
    """fn's result or exception, or AssertionError when it does not return (a FIFO open blocks in a daemon thread)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def fifo(tmp_path, name: str):
    path = tmp_path / name
    os.mkfifo(path, 0o600)
    return path


def rules_file(tmp_path, text: str):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, line, words", [
    (BOMB, 2, "anchors (&name) are not allowed"),
    ("extends: safe-harbor\nfhir:\n  rules: *nothing\n", 3, "aliases (*name) are not allowed"),
    ("extends: safe-harbor\ndescription: !!python/object/apply:os.system [\"true\"]\n", 2, "unknown tag"),
    ("extends: safe-harbor\nfhir: !site {rules: {}}\n", 2, "unknown tag"),
    ("extends: safe-harbor\ndescription: " + "[" * 5000 + "]" * 5000 + "\n", 2, "nested deeper than 64 levels"),
], ids=["alias-bomb", "alias", "python-tag", "local-tag", "deep"])
def test_yaml_that_is_more_than_data_is_refused_with_its_line(tmp_path, text, line, words):
    with pytest.raises(RulesFileError) as e:
        finishes(lambda: read_site_rules(rules_file(tmp_path, text)))
    assert f"site.yaml:{line}: " in str(e.value) and words in str(e.value), str(e.value)


def test_rules_check_on_an_alias_bomb_exits_2_at_once(tmp_path):
    path = rules_file(tmp_path, BOMB)
    run = subprocess.run([sys.executable, "-m", "adapter.cli", "rules", "check", str(path)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and "site.yaml:2: not YAML: anchors" in run.stderr and "Traceback" not in run.stderr


def test_a_fifo_or_an_oversized_rules_file_is_refused_without_reading_it(tmp_path):
    with pytest.raises(RulesFileError, match="a FIFO, not a regular file"):
        finishes(lambda: read_site_rules(fifo(tmp_path, "rules.yaml")))
    big = rules_file(tmp_path, "extends: safe-harbor\ndescription: " + "x" * (5 << 20) + "\n")
    with pytest.raises(RulesFileError, match="larger than"):
        read_site_rules(big)
    with pytest.raises(RulesFileError, match="a folder, not a regular file"):
        read_site_rules(tmp_path)


def test_a_fifo_key_file_is_refused(tmp_path):
    path = fifo(tmp_path, "pseudonym.key")
    with pytest.raises(keys.KeyError_, match="a FIFO, not a regular file"):
        finishes(lambda: keys.load_key(path))
    with pytest.raises(keys.KeyError_, match="a FIFO, not a regular file"):
        finishes(lambda: keys.key_purpose(path))


def test_fifo_token_users_and_review_config_files_are_refused(tmp_path):
    with pytest.raises(TokenFileError, match="a FIFO"):
        finishes(lambda: TokenStore.load(fifo(tmp_path, "tokens.json")))
    with pytest.raises(UsersFileError, match="a FIFO"):
        finishes(lambda: UserStore.load(fifo(tmp_path, "users.json")))
    with pytest.raises(ValueError, match="a FIFO"):
        finishes(lambda: Thresholds.load(fifo(tmp_path, "review.yaml")))
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(ValueError, match="review config"):
        finishes(lambda: Thresholds.load(tmp_path / "bomb.yaml"))


def site_rules(tmp_path, where: str):
    text = f"extends: safe-harbor\nfhir:\n  rules:\n    Patient.telecom: {{method: keep, where: \"{where}\"}}\n"
    return read_site_rules(rules_file(tmp_path, text))


@pytest.mark.parametrize("where, words", [
    ("value.trace('v').exists()", "trace() is not allowed"),
    ("%context.repeat(telecom).exists()", "repeat() is not allowed"),
    ("value.aggregate($total + 1, 0) > 1", "aggregate() is not allowed"),
    ("value.matches('(a)\\\\1')", "not one RE2 runs in linear time"),
    ("value.matches(%context.use)", "the pattern must be a string literal"),
], ids=["trace", "repeat", "aggregate", "backreference", "pattern-not-literal"])
def test_a_condition_outside_the_subset_is_refused_when_the_file_loads(tmp_path, capsys, where, words):
    with pytest.raises((RulesFileError, ProfileError)) as e:
        site_profile(site_rules(tmp_path, where))
    assert "site.yaml:4: " in str(e.value) and words in str(e.value), str(e.value)
    assert capsys.readouterr().out == ""


def engine_with(tmp_path, where: str, test_key) -> Deidentifier:
    profile = site_profile(site_rules(tmp_path, where))
    return Deidentifier(profile, Pseudonymizer(test_key), build_stack("patterns"), lambda: FIXED_TODAY, True)


def test_a_catastrophic_regex_in_matches_runs_in_linear_time(tmp_path, test_key):
    # Python's `re` takes 2^n steps on ^(a+)+$ against a's and a b: the record would never finish
    engine = engine_with(tmp_path, "value.matches('^(a+)+$')", test_key)
    out = finishes(lambda: engine.deidentify({**PATIENT, "telecom": [{**PATIENT["telecom"][0],
                                                                       "value": "a" * 5000 + "b"}]}, "t").resource)
    assert "telecom" not in out or "a" * 5000 not in str(out)  # false: the packaged rule removes it
    assert fhirpath.holds(fhirpath.compile_condition("value.replaceMatches('(a+)+$', 'x') = 'x'"), {"value": "aaa"})


def test_a_slow_condition_refuses_the_record_and_names_no_value(tmp_path, test_key, capsys):
    engine = engine_with(tmp_path, SLOW, test_key)
    with pytest.raises(RecordRefused) as e:
        engine.deidentify(PATIENT, "t")
    assert "over its budget" in str(e.value) and PHONE not in str(e.value) and "Qqqplanted" not in str(e.value)
    assert capsys.readouterr().out == ""


def test_a_condition_stops_at_the_records_deadline(tmp_path, test_key):
    engine = engine_with(tmp_path, SLOW, test_key)
    with budget.until(time.monotonic() - 1), pytest.raises(RecordRefused, match="past the record's deadline"):
        engine.deidentify(PATIENT, "t")


def test_a_condition_that_errors_refuses_the_record_instead_of_falling_through(tmp_path, test_key):
    # substring() of a value that is no number errors in fhirpathpy, with a message that quotes the value
    engine = engine_with(tmp_path, "value.substring(%context.value) = 'x'", test_key)
    with pytest.raises(RecordRefused) as e:
        engine.deidentify(PATIENT, "t")
    assert "an error" in str(e.value) and PHONE not in str(e.value)
