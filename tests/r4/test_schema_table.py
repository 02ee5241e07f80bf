"""The packaged element table (fhir_transforms/r4/r4b-elements.json) is what the installed fhir.resources R4B
models say, type by type; and a run with validation off reads it without building any model."""
from __future__ import annotations

import json
import subprocess
import sys

from fhir_transforms.r4 import schema
from tests.conftest import ROOT


def test_the_table_is_the_installed_models():
    assert json.loads(schema.TABLE.read_text(encoding="utf-8")) == json.loads(json.dumps(schema.read_models()))


def test_validation_off_builds_no_model():
    code = ("import json, sys\n"
            "from fhir_transforms.r4.schema import elements, is_resource_type\n"
            "assert is_resource_type('Patient') and not is_resource_type('HumanName')\n"
            "assert elements('Patient')['birthDate'].type == 'date'\n"
            "print(json.dumps([m for m in ('fhir.resources', 'pydantic') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
