"""The audit trail (hash-chained records) and the re-identification vault."""
