"""The HTTP edge: the FHIR `$de-identify` service and its token authentication."""
