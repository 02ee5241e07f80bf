"""Layered detection and replacement of PHI in free text."""
