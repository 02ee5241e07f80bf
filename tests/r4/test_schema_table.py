"""The packaged element tables (fhir_transforms/r4/r4b-elements.json, r5-elements.json) are what the installed
fhir.resources R4B and R5 models say, type by type; and a run with validation off reads it without building any model."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fhir_transforms.r4 import schema
from tests.conftest import ROOT


@pytest.mark.parametrize("version", schema.FHIR_VERSIONS)
def test_the_table_is_the_installed_models(version):
    table = json.loads(schema.TABLES[version].read_text(encoding="utf-8"))
    assert table == json.loads(json.dumps(schema.read_models(version)))


def test_validation_off_builds_no_model():
    code = ("import json, sys\n"
            "from fhir_transforms.r4.schema import elements, is_resource_type\n"
            "assert is_resource_type('Patient') and not is_resource_type('HumanName')\n"
            "assert elements('Patient')['birthDate'].type == 'date'\n"
            "assert elements('Encounter', 'r5')['actualPeriod'].type == 'Period'\n"
            "from fhir_transforms.r4.walker import _model_requires\n"  # an emptied required element, e.g. EOB.insurer
            "assert _model_requires('ExplanationOfBenefit', 'insurer', 'r4')\n"
            "assert not _model_requires('ExplanationOfBenefit', 'provider', 'r5')\n"
            "print(json.dumps([m for m in ('fhir.resources', 'pydantic') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
