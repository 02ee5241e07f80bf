"""Re-identification risk measures of a release, and their report."""
