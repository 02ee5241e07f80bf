"""What detectors return: positions and categories, never the covered text."""
from __future__ import annotations

from dataclasses import dataclass

# HIPAA Safe Harbor categories, spelled as ASQ-PHI spells them (../shared/DESIGN.md).
CATEGORIES = (
    "NAME",
    "GEOGRAPHIC_LOCATION",
    "DATE",
    "PHONE_NUMBER",
    "FAX_NUMBER",
    "EMAIL_ADDRESS",
    "SOCIAL_SECURITY_NUMBER",
    "MEDICAL_RECORD_NUMBER",
    "HEALTH_PLAN_BENEFICIARY_NUMBER",
    "ACCOUNT_NUMBER",
    "CERTIFICATE_LICENSE_NUMBER",
    "VEHICLE_IDENTIFIER",
    "DEVICE_IDENTIFIER",
    "URL",
    "IP_ADDRESS",
    "BIOMETRIC_IDENTIFIER",
    "FULL_FACE_PHOTO",
    "UNIQUE_IDENTIFIER",
    "AGE_OVER_89",
)


@dataclass(frozen=True, order=True)
class Span:
    """A suspected PHI span: `text[start:end]`, end exclusive, in Python str indices."""

    start: int
    end: int
    category: str
    detector: str
    confidence: float = 1.0

    def to_json(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "category": self.category,
            "detector": self.detector,
            "confidence": round(self.confidence, 4),
        }


@dataclass(frozen=True, order=True)
class KnownIdentifier:
    """A value taken from the structured record (a name, a date, an MRN) that must not survive in text."""

    value: str
    category: str


class DetectorError(RuntimeError):
    """A detector failed, timed out or answered garbage: the record must fail closed.

    Messages name the detector and the reason only, never text from the record.
    """
