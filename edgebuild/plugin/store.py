"""Store files for stage bodies: hashes remembered by stat, links to read-only files, what a stage writes."""

from edgebuild.store.hashstate import file_sha256, hashed_once, link_vouched
from edgebuild.store.layout import MLPACKAGE, VALIDATION
from edgebuild.store.links import refer
from edgebuild.store.local import Store
from edgebuild.store.location import cache_root

__all__ = ["file_sha256", "hashed_once", "link_vouched", "MLPACKAGE", "VALIDATION", "refer", "Store", "cache_root"]
