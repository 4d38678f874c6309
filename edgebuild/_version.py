"""The release of edgebuild, in one place: the package, its metadata and cache keys read it here."""

__version__ = "0.1.0"
