"""Structured Safe Harbor transforms for FHIR R4: one function per rule method, one pseudonym function."""
