"""Passes that bring every quantised-operator form to one QDQ representation (docs/quantized-models.md)."""
