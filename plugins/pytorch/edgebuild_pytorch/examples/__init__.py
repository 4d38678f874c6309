"""Module factories for the example recipes."""
