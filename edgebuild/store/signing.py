"""Signed remote entries: an HMAC-SHA256, under a team's secret key, over an entry's canonical
manifest — its key, stage, every file's size and sha256, and the record (``info``) later stages
read. Without a key, anyone who can write the bucket can write your builds; with one, only who
holds the key can.

The key comes from the environment variable ``EDGEBUILD_CACHE_SIGNING_KEY`` (a CI secret; never a
config file, which is often committed). When it is set, a push signs each manifest it uploads and
a pull installs only entries whose signature is valid under it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

ENV_KEY = "EDGEBUILD_CACHE_SIGNING_KEY"
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16


def signing_key() -> bytes | None:
    """The configured key, or None (entries are then neither signed nor checked)."""
    from edgebuild.errors import UsageError

    value = os.environ.get(ENV_KEY)
    if not value:
        return None
    if len(value.encode()) < MIN_KEY_BYTES:
        raise UsageError(f"{ENV_KEY} is {len(value.encode())} bytes long; a signing key needs at least {MIN_KEY_BYTES}",
                         hint="make one with `python -c 'import secrets; print(secrets.token_hex(32))'`")
    return value.encode()


def canonical(key: str, meta: dict) -> bytes:
    """The bytes a signature covers: what a reader of the entry trusts, in one fixed order."""
    files = {rel: {"size": f["size"], "sha256": f["sha256"]} for rel, f in meta["files"].items()}
    body = {"key": key, "stage": meta.get("stage"), "digest": meta["digest"], "files": files,
            "info": meta.get("info", {})}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(secret: bytes) -> str:
    """A short name of the key (not the key), so a mismatch can say "signed with another key"."""
    return hashlib.sha256(b"edgebuild-key-id:" + secret).hexdigest()[:12]


def sign(key: str, meta: dict, secret: bytes) -> dict:
    """``meta`` with its signature."""
    value = hmac.new(secret, canonical(key, meta), hashlib.sha256).hexdigest()
    return {**meta, "signature": {"algorithm": ALGORITHM, "key_id": key_id(secret), "value": value}}


def problem(key: str, meta: dict, secret: bytes) -> str | None:
    """Why ``meta``'s signature is not valid under ``secret`` (None: it is)."""
    signature = meta.get("signature")
    if not isinstance(signature, dict) or not isinstance(signature.get("value"), str):
        return "is not signed"
    if signature.get("algorithm") != ALGORITHM:
        return f"is signed with {str(signature.get('algorithm'))[:40]!r}, not {ALGORITHM}"
    expected = hmac.new(secret, canonical(key, meta), hashlib.sha256).hexdigest()
    if hmac.compare_digest(expected, signature["value"]):
        return None
    if signature.get("key_id") != key_id(secret):
        return "is signed with another key"
    return "has a signature that does not match its manifest"
