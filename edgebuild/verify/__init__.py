"""Numeric validation: sample inputs, metrics, thresholds and the build report."""
