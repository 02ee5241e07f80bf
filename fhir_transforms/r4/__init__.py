"""The FHIR R4 engine: rule walker, narrative, references, record flow."""
