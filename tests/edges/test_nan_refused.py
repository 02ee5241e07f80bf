"""NaN, Infinity and numbers that overflow to Infinity (1e400) are not JSON: refused at every JSON input, and
never written (issue #36, item 6)."""
import pytest

from adapter import files, json_input
from tests.edges.cli.test_strict_input import cli
from text_deid import evaluation

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.mark.parametrize("number", NON_FINITE)
def test_a_non_finite_number_is_refused_by_the_one_strict_parse(number):
    text = '{"resourceType": "Observation", "valueQuantity": {"value": %s}}' % number
    with pytest.raises(json_input.JsonInputError, match="NaN or Infinity"):
        json_input.loads(text)
    with pytest.raises(json_input.JsonInputError, match="NaN or Infinity"):  # after a duplicate key too
        json_input.loads('{"a": {"b": 1, "b": 2}, "c": %s}' % number)
    bundle = '{"resourceType": "Bundle", "entry": [{"resource": {"v": %s}}]}' % number
    assert json_input.split_bundle(bundle) is None  # the caller's whole parse then refuses it
    with pytest.raises(json_input.JsonInputError):
        json_input.loads(bundle)


def test_large_finite_numbers_are_kept():
    assert json_input.loads('{"a": 1.5e300, "b": 123456789012345678901234567890}')["a"] == 1.5e300


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_the_writers_never_write_a_bare_nan(value):
    with pytest.raises(ValueError):
        files.compact({"v": value})
    with pytest.raises(ValueError):
        files.serialize([{"v": value}], ndjson=False)


@pytest.mark.parametrize("number", NON_FINITE)
def test_a_gold_or_text_jsonl_line_with_a_non_finite_number_is_refused(tmp_path, number):
    path = tmp_path / "gold.jsonl"
    path.write_text('{"id": "1", "text": "x", "score": %s}\n' % number)
    with pytest.raises(ValueError, match="line 1: invalid JSON"):
        evaluation.load_jsonl(path)


def test_the_cli_refuses_a_fhir_file_and_an_ndjson_line_with_nan_and_writes_nothing(tmp_path, test_key_file):
    src = tmp_path / "in"
    src.mkdir()
    obs = '{"resourceType": "Observation", "status": "final", "code": {"text": "x"}, "valueQuantity": {"value": NaN}}'
    (src / "obs.json").write_text(obs)
    (src / "lines.ndjson").write_text('{"resourceType": "Patient"}\n' + obs + "\n")
    for validate in ([], ["--validate", "off"]):
        out = tmp_path / f"out{len(validate)}"
        result = cli("fhir", str(src), str(out), "--today", "2026-01-15", *validate, key_file=test_key_file)
        assert result.exit_code == 2, result.output
        assert "obs.json: invalid JSON: NaN or Infinity" in result.output
        assert "lines.ndjson: line 2: invalid JSON: NaN or Infinity" in result.output
        assert not (out / "obs.json").exists() and not (out / "lines.ndjson").exists()


def test_the_text_cli_refuses_a_jsonl_line_with_nan(tmp_path, test_key_file):
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"id": "1", "text": "x", "n": NaN}\n')
    result = cli("text", "detect", "--in", str(notes), key_file=test_key_file)
    assert result.exit_code == 2, result.output
    assert "line 1: invalid JSON: NaN or Infinity" in result.output
