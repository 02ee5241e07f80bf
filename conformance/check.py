"""Run the Safe Harbor checks against any `$de-identify` server: post samples, judge what comes back."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fhir.resources.R4B import get_fhir_model_class

from conformance import safe_harbor


@dataclass
class Report:
    resources: int = 0
    values_checked: int = 0
    leaks: dict[str, int] = field(default_factory=dict)
    broken_references: int = 0
    invalid_outputs: int = 0
    http_errors: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.leaks or self.broken_references or self.invalid_outputs or self.http_errors) and self.resources > 0

    def to_json(self) -> dict:
        return {"passed": self.passed, "resources": self.resources, "values_checked": self.values_checked,
                "leaks": sum(self.leaks.values()), "leaks_by_kind": self.leaks,
                "broken_references": self.broken_references, "invalid_outputs": self.invalid_outputs,
                "http_errors": self.http_errors}


def samples(folder: Path) -> list[dict]:
    docs = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".json", ".ndjson") and path.is_file():
            docs.extend(d for d in safe_harbor.load(path) if "resourceType" in d)
    return docs


def check(base_url: str, token: str, folder: Path, timeout_s: float = 120.0) -> Report:
    """Post every resource under `folder` to `base_url`/fhir/$de-identify and check each answer."""
    report = Report()
    headers = {"Content-Type": "application/fhir+json", "Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
        for doc in samples(folder):
            resp = client.post("/fhir/$de-identify", content=json.dumps(doc))
            if resp.status_code != 200:
                report.http_errors[str(resp.status_code)] = report.http_errors.get(str(resp.status_code), 0) + 1
                continue
            out = resp.json()
            report.resources += 1
            report.values_checked += len(safe_harbor.identifying_values(doc))
            for kind in safe_harbor.leaks_in(doc, out):
                report.leaks[kind] = report.leaks.get(kind, 0) + 1
            report.broken_references += safe_harbor.broken_references(doc, out)
            try:
                get_fhir_model_class(out["resourceType"]).model_validate(out)
            except Exception:
                report.invalid_outputs += 1
    return report
