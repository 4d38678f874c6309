"""A remote copy of the store, reached through fsspec (s3://, gs://, file://, read-only http(s)://).

Layout under the remote URL (the local store's entry layout, so a ``file://`` remote reads
like a store)::

    objects/ab/abcdef.../out/...      the entry's files, uploaded first
    objects/ab/abcdef.../meta.json    its manifest (the local one, verbatim), uploaded last

An entry exists remotely once its ``meta.json`` does: a reader ignores a folder without one,
so an upload killed halfway is never seen as an entry, and the next push of the key completes
it. Each object store publishes an object whole on PUT; on a file system each file is written
under a temporary name and renamed. A pulled file is checked against the manifest's size and
sha256 before the entry is installed, atomically, into the local store (``Store.build``
publishes it whole or not at all); a mismatch raises :class:`RemoteCorrupt` and nothing is
installed.

Digests show an entry is what its manifest says, not that its manifest is honest. So a pulled
entry must also list only files its stage kind produces (``layout``, see
:mod:`edgebuild.store.layout`), and when a signing key is configured
(:mod:`edgebuild.store.signing`) its manifest must carry a valid signature: push signs, pull checks.

Functions of a key (``pull``, ``push``, ``has``) are all an executor needs; messages show the
URL without credentials (:func:`edgebuild.store.config.display_url`) and scrub secrets that a
library's error text might echo.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from edgebuild.errors import BuildError
from edgebuild.store import signing
from edgebuild.store.config import RemoteSettings
from edgebuild.store.layout import outside
from edgebuild.store.local import Store, check_key, is_key, shown_value, valid_meta

META = "meta.json"
_CHUNK = 1 << 20
_SMALL = 16 << 20  # files up to this size are fetched together, in memory
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "GOOGLE_OAUTH_ACCESS_TOKEN")
_SIGNATURE = re.compile(r"(Signature|X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|sig)=[^&\s'\"]+", re.I)


class RemoteError(BuildError):
    """The remote cannot be used now; ``kind`` is unreachable, denied, throttled, missing or failed."""

    def __init__(self, message: str, *, kind: str = "failed", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind


class RemoteCorrupt(BuildError):
    """A remote entry whose files do not match its manifest, that lists files its stage does not
    produce, or (with a signing key) whose signature is missing or wrong: reported, never installed."""


def scrub(text: str) -> str:
    """``text`` with credential values and URL signatures removed."""
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return _SIGNATURE.sub(lambda m: f"{m.group(1)}=***", text)


@dataclass
class Transfer:
    """What one pull or push moved."""

    files: int = 0
    bytes: int = 0


class RemoteStore:
    def __init__(self, settings: RemoteSettings, local: Store):
        self.settings = settings
        self.local = local
        self._fs = None
        self._root = ""
        self.moved = Transfer()  # bytes and files moved, both ways, since this was made
        self.skipped: list[str] = []  # names in the last listing that are not stage keys (shown repr'd)
        self.secret = signing.signing_key()  # None: entries are neither signed nor checked

    # -- the file system --------------------------------------------------------------
    @property
    def fs(self):
        if self._fs is None:
            self._fs, self._root = self._open()
            self._check_bucket()
        return self._fs

    def _open(self):
        try:
            import fsspec  # lazily: a run without a remote never imports it
        except ImportError:
            raise RemoteError("remote caches need fsspec, which is not installed", kind="setup",
                              hint="pip install 'edgebuild[remote]'") from None
        try:
            fs, root = fsspec.core.url_to_fs(self.settings.url, **self.settings.options)
        except ImportError as exc:
            raise RemoteError(f"remote {self.settings.shown}: {scrub(str(exc))}", kind="setup",
                              hint="pip install 'edgebuild[remote]' (s3:// needs s3fs, gs:// needs gcsfs)") from None
        except Exception as exc:
            raise self._error(exc, "open") from None
        return fs, root.rstrip("/")

    def _check_bucket(self) -> None:
        """A missing bucket reads as an empty one to fsspec; say so instead of missing every key."""
        if self.settings.scheme not in ("s3", "s3a", "gs", "gcs"):
            return
        bucket = self._root.split("/", 1)[0]
        try:
            self._fs.ls(bucket, detail=False)
        except FileNotFoundError:
            raise RemoteError(f"remote {self.settings.shown}: the bucket {bucket!r} does not exist", kind="missing",
                              hint=f"create it (e.g. `aws s3 mb {self.settings.scheme}://{bucket}`) "
                                   "or correct cache.remote / --remote") from None
        except Exception as exc:
            raise self._error(exc, "open") from None

    def _path(self, key: str, *parts: str) -> str:
        check_key(key, f"remote {self.settings.shown}: ")  # a key is a path here too: only a valid one
        return "/".join((self._root, "objects", key[:2], key, *parts))

    def _error(self, exc: BaseException, doing: str) -> RemoteError:
        kind = classify(exc)
        hints = {
            "unreachable": "check the network and the endpoint (AWS_ENDPOINT_URL or cache.remote_options.endpoint_url)",
            "denied": "check the credentials (environment, AWS_PROFILE) and that they may read and write the bucket",
            "throttled": "the remote is rate-limiting; retry later",
        }
        text = scrub(f"{type(exc).__name__}: {exc}")
        return RemoteError(f"remote {self.settings.shown}: {doing} failed ({kind}): {text}", kind=kind,
                           hint=hints.get(kind))

    # -- reading ----------------------------------------------------------------------
    def manifest(self, key: str) -> dict | None:
        """The remote entry's manifest, None if there is no complete entry; RemoteCorrupt if invalid."""
        fs = self.fs
        try:
            data = fs.cat_file(self._path(key, META))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._error(exc, f"reading entry {key[:12]}") from None
        try:
            meta = json.loads(data)
        except ValueError:
            meta = None
        if not valid_meta(key, meta):
            raise RemoteCorrupt(f"remote {self.settings.shown}: entry {key[:12]} has an invalid manifest; not installed",
                                hint="`edgebuild cache push` replaces it from a machine that has it")
        if self.secret is not None:
            problem = signing.problem(key, meta, self.secret)
            if problem:
                raise RemoteCorrupt(
                    f"remote {self.settings.shown}: entry {key[:12]} ({str(meta.get('stage', '?'))[:40]}) {problem}; "
                    f"not installed ({signing.ENV_KEY} is set: only entries signed with it are)",
                    hint="building locally instead; the next push from a build that holds the key replaces it")
        return meta

    def has(self, key: str) -> bool:
        try:
            return self.fs.exists(self._path(key, META))
        except Exception as exc:
            raise self._error(exc, f"looking up entry {key[:12]}") from None

    def pull(self, key: str, layout=None) -> bool:
        """Install the remote entry for ``key`` into the local store; False if there is none.
        Raises RemoteCorrupt (nothing installed) when a file does not match the manifest, or the
        manifest lists a file outside ``layout`` (the files the key's stage produces)."""
        if self.local.lookup(key, layout) is not None:
            return True
        meta = self.manifest(key)
        if meta is None:
            return False
        extra = outside(layout, meta["files"])
        if extra:
            raise RemoteCorrupt(
                f"remote {self.settings.shown}: entry {key[:12]} ({str(meta.get('stage', '?'))[:40]}) lists "
                f"out/{shown_value(extra[0])[1:-1]}{f' and {len(extra) - 1} more' if len(extra) > 1 else ''}, "
                "which its stage does not produce; not installed",
                hint="building locally instead; someone who can write the remote wrote this entry "
                     f"(set {signing.ENV_KEY} to accept only entries your builds signed)")
        moved = Transfer()

        def download(out: Path) -> dict:
            for rel in meta["files"]:
                if rel.startswith("/") or ".." in rel.split("/"):
                    raise RemoteCorrupt(f"remote {self.settings.shown}: entry {key[:12]} names a file outside "
                                        f"itself ({rel!r}); not installed")
            fetched = self._fetch_small(key, [rel for rel, f in meta["files"].items() if f["size"] <= _SMALL])
            for rel, expected in sorted(meta["files"].items()):
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if rel in fetched:
                    target.write_bytes(fetched[rel])
                    digest, size = hashlib.sha256(fetched[rel]).hexdigest(), len(fetched[rel])
                else:
                    digest, size = self._download(key, rel, target)
                moved.files += 1
                moved.bytes += size
                if size != expected["size"] or digest != expected["sha256"]:
                    raise RemoteCorrupt(
                        f"remote {self.settings.shown}: entry {key[:12]} ({meta.get('stage', '?')}): out/{rel} "
                        f"does not match its manifest ({size} bytes, sha256 {digest[:12]}; expected "
                        f"{expected['size']} bytes, sha256 {expected['sha256'][:12]}); not installed",
                        hint="building locally instead; the next push from a good build replaces it")
            return meta.get("info", {})

        entry, _ = self.local.build(key, meta.get("stage", "?"), download, layout)
        if entry.digest != meta["digest"]:  # only if the local build raced ahead with other bytes
            return False
        self.moved.files += moved.files
        self.moved.bytes += moved.bytes
        return True

    def _fetch_small(self, key: str, rels: list[str]) -> dict[str, bytes]:
        """Small files of an entry in one concurrent batch (one GET each, no HEAD first)."""
        if not rels:
            return {}
        paths = {self._path(key, "out", rel): rel for rel in rels}
        try:
            blobs = self.fs.cat(list(paths))
        except FileNotFoundError:
            raise RemoteCorrupt(f"remote {self.settings.shown}: entry {key[:12]} lacks a file its manifest lists; "
                                "not installed") from None
        except Exception as exc:
            raise self._error(exc, f"downloading entry {key[:12]}") from None
        return {paths[p]: data for p, data in blobs.items() if p in paths}

    def _download(self, key: str, rel: str, target: Path) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        try:
            with self.fs.open(self._path(key, "out", rel), "rb", **self._stream_options()) as source, \
                    open(target, "wb") as sink:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise RemoteCorrupt(f"remote {self.settings.shown}: entry {key[:12]} lacks out/{rel}, which its "
                                "manifest lists; not installed") from None
        except (RemoteCorrupt, KeyboardInterrupt):
            raise
        except OSError as exc:
            if classify(exc) == "failed" and not _is_remote_error(exc):
                raise  # the local disk (full, read-only): not the remote's fault
            raise self._error(exc, f"downloading entry {key[:12]}") from None
        except Exception as exc:
            raise self._error(exc, f"downloading entry {key[:12]}") from None
        return digest.hexdigest(), size

    def _stream_options(self) -> dict:
        # http: stream the body (http.server and many CDNs ignore Range requests); else 8 MB read-ahead blocks
        return {"block_size": 0} if self.settings.read_only else {"block_size": 8 << 20}

    # -- writing ----------------------------------------------------------------------
    def push(self, key: str, *, replace: bool = False) -> bool:
        """Upload the local entry for ``key`` (files first, manifest last); False if it is not in the
        local store or already complete remotely (``replace``: upload over a bad remote entry)."""
        if self.settings.read_only:
            raise RemoteError(f"remote {self.settings.shown} is read-only (http); nothing is pushed", kind="denied",
                              hint="push to the store behind it (s3://, gs:// or file://)")
        entry = self.local.lookup(key)
        if entry is None:
            return False
        fs = self.fs
        meta_path = self._path(key, META)
        try:
            if fs.exists(meta_path):
                if not replace:
                    return False
                fs.rm_file(meta_path)  # invisible again before any of its files change
            moved = Transfer()
            for rel in sorted(entry.meta["files"]):
                self._upload(entry.out / rel, self._path(key, "out", rel))
                moved.files += 1
                moved.bytes += entry.meta["files"][rel]["size"]
            if self.secret is not None:
                self._upload_bytes(json.dumps(signing.sign(key, entry.meta, self.secret), indent=1).encode(),
                                   meta_path)
            else:
                self._upload(entry.path / META, meta_path)
        except RemoteError:
            raise
        except Exception as exc:
            raise self._error(exc, f"uploading entry {key[:12]}") from None
        self.moved.files += moved.files
        self.moved.bytes += moved.bytes
        return True

    def _upload(self, source: Path, path: str) -> None:
        self._put(path, lambda target: self.fs.put_file(str(source), target))

    def _upload_bytes(self, data: bytes, path: str) -> None:
        self._put(path, lambda target: self.fs.pipe_file(target, data))

    def _put(self, path: str, write) -> None:
        """``write(target)`` at ``path``; on a shared mount (file://) through a temporary name, so no
        partial file is ever under the final one."""
        if self.settings.scheme != "file":
            write(path)
            return
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            write(tmp)
            self.fs.mv(tmp, path)
        except BaseException:
            try:
                self.fs.rm_file(tmp)
            except Exception:
                pass
            raise

    # -- listing ----------------------------------------------------------------------
    def listing(self) -> tuple[set[str], set[str]]:
        """(complete, incomplete) keys on the remote; RemoteError for a remote that cannot list (http)."""
        if self.settings.read_only:
            raise RemoteError(f"remote {self.settings.shown} (http) cannot be listed", kind="unsupported",
                              hint="status over http checks the local store's keys only")
        fs = self.fs
        base = f"{self._root}/objects"
        try:
            if not fs.exists(base):
                return set(), set()
            folders = fs.glob(f"{base}/*/*")
        except Exception as exc:
            raise self._error(exc, "listing") from None
        present, self.skipped = set(), []
        for folder in sorted(folders):
            prefix, name = folder.rstrip("/").rsplit("/", 2)[-2:]
            if is_key(name) and prefix == name[:2]:
                present.add(name)
            elif name != META:  # the listing is another's data: a name that is no key is never used
                self.skipped.append(shown_value(f"objects/{prefix}/{name}"))
        try:
            complete = {p.rstrip("/").split("/")[-2] for p in fs.glob(f"{base}/*/*/{META}")} & present
        except Exception as exc:
            raise self._error(exc, "listing") from None
        return complete, present - complete


def _is_remote_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return any(module.startswith(m) for m in ("aiohttp", "botocore", "aiobotocore", "s3fs", "gcsfs", "fsspec", "google"))


def classify(exc: BaseException) -> str:
    """unreachable, denied, throttled, missing or failed, from an fsspec back end's exception."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    names = " ".join(type(e).__name__ for e in seen)
    text = " ".join(str(e) for e in seen)
    if any(isinstance(e, PermissionError) for e in seen) or re.search(
            r"AccessDenied|Forbidden|InvalidAccessKeyId|SignatureDoesNotMatch|NoCredentials|locate credentials|\b403\b|\b401\b", names + " " + text):
        return "denied"
    if re.search(r"SlowDown|Throttl|TooManyRequests|RequestLimitExceeded|\b429\b|\b503\b", names + " " + text):
        return "throttled"
    if re.search(r"NoSuchBucket|bucket does not exist", text):
        return "missing"
    if any(isinstance(e, (ConnectionError, TimeoutError)) for e in seen) or re.search(
            r"Connect|Timeout|EndpointConnectionError|ServerDisconnected|Name or service not known", names + " " + text):
        return "unreachable"
    return "failed"
