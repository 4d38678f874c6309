"""Releasing the resident pages of mapped weight files, so a stage's peak holds one copy."""

from edgebuild.mapped_pages import drop_resident_ranges, file_offsets, libc_function

__all__ = ["drop_resident_ranges", "file_offsets", "libc_function"]
