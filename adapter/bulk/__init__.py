"""The bulk edge: FHIR Bulk Data exports, locally or on Spark."""
