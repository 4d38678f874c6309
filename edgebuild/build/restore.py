"""Put back deleted output directories from what a stamp recorded, without the build machinery.

When a successful run is stamped (:mod:`edgebuild.build.uptodate`), each variant directory it
left is described file by file: a file hard-linked from a store entry by the entry file's path,
stat and digest; any other file (reports, lock file, markers: small, generated) by its bytes,
kept as a blob named by its sha256 in ``stamps/blobs/`` of the store. The comparison page beside
the variants is kept the same way, when every variant report in its folder is this command's.

A repeat of the command that finds everything but such directories as stamped, and those
directories gone, rebuilds them from that description into a temporary directory renamed into
place: the same files, links and modes the stamped run left. Any doubt — a store file changed or
gone, a blob missing or not matching its name, a directory half there, anything else in the
way — and nothing is written: the full run decides.

Standard library only, like the stamp: it runs before anything else is imported.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

BLOBS = "blobs"  # in the stamps folder
BLOB_NAME = re.compile(r"[0-9a-f]{64}")
BLOB_MAX_BYTES = 16 << 20  # generated files are small; a larger unlinked file is a copied artifact
PAGE = "index.html"  # edgebuild.report.write.INDEX_HTML (not imported: it loads pydantic)
WRITTEN_LAST = ".edgebuild-built"  # edgebuild.build.outputs.BUILT_STAMP: Make's target, written last


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while data := handle.read(1 << 20):
            digest.update(data)
    return digest.hexdigest()


def _keep_blob(blobs: Path, data: bytes) -> str:
    """Store ``data`` under its digest (once; a later use refreshes its time for ``cache gc``)."""
    name = hashlib.sha256(data).hexdigest()
    path = blobs / name
    try:
        if path.stat().st_size == len(data):
            os.utime(path)
            return name
    except OSError:
        pass
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / f".{name}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return name


def describe(outputs: list[tuple[Path, dict[str, tuple[Path, str]]]], blobs: Path) -> dict | None:
    """What ``restore`` needs to write ``outputs`` again, or None when they cannot be described.

    ``outputs``: each variant directory with the store files its artifact was linked from
    (``{relative path in the directory: (store file, its sha256 from the entry's manifest)}``).
    Blobs are written to ``blobs``. None (the stamp then restores nothing) for a symlink or
    special file in a directory, an artifact file copied rather than linked, or a comparison page
    folder holding another variant's report."""
    dirs = []
    for out, links in outputs:
        out = Path(out)
        st = os.lstat(out)
        if not stat.S_ISDIR(st.st_mode):
            return None
        record = {"path": str(out), "mode": stat.S_IMODE(st.st_mode), "dirs": [], "files": []}
        for folder, subdirs, names in os.walk(out):
            subdirs.sort()
            for name in sorted(subdirs):
                path = Path(folder, name)
                sub = os.lstat(path)
                if not stat.S_ISDIR(sub.st_mode):
                    return None  # a symlink to a directory
                record["dirs"].append([path.relative_to(out).as_posix(), stat.S_IMODE(sub.st_mode)])
            for name in sorted(names):
                path = Path(folder, name)
                rel = path.relative_to(out).as_posix()
                file = os.lstat(path)
                if not stat.S_ISREG(file.st_mode):
                    return None
                mode = stat.S_IMODE(file.st_mode)
                if rel in links:
                    source, sha256 = links[rel]
                    src = os.lstat(source)
                    if (src.st_ino, src.st_dev) != (file.st_ino, file.st_dev) and (
                            src.st_dev != file.st_dev or _sha256(path) != sha256):
                        # Another file system (the full run copies), or not the entry's bytes. The
                        # same bytes under another inode are what the full run links again: the
                        # directory was made when the entry's file was another name of them.
                        return None
                    record["files"].append([rel, mode, "link", str(source), sha256,
                                            [src.st_ino, src.st_size, src.st_mtime_ns]])
                elif file.st_size <= BLOB_MAX_BYTES:
                    record["files"].append([rel, mode, "blob", _keep_blob(blobs, path.read_bytes())])
                else:
                    return None
        dirs.append(record)
    roots = []
    for root in sorted({str(Path(d["path"]).parent) for d in dirs}):
        ours = sorted(Path(d["path"]).name for d in dirs if str(Path(d["path"]).parent) == root)
        if _other_reports(root, ours):
            return None  # another variant's report is on the page: the full run draws it from that report
        page = Path(root, PAGE)
        entry = {"path": root, "variants": ours, "page": None}
        if os.path.lexists(page):
            st = os.lstat(page)
            if not stat.S_ISREG(st.st_mode) or st.st_size > BLOB_MAX_BYTES:
                return None
            entry["page"] = [stat.S_IMODE(st.st_mode), _keep_blob(blobs, page.read_bytes())]
        roots.append(entry)
    return {"dirs": dirs, "roots": roots}


def blob_names(plan: dict) -> set[str]:
    names = {f[3] for d in plan["dirs"] for f in d["files"] if f[2] == "blob"}
    return names | {r["page"][1] for r in plan["roots"] if r["page"]}


def restore(plan: dict, changed: set[str], blobs: Path, watched: dict) -> list[str] | None:
    """Write again the directories of ``plan`` that are gone, if they are all that ``changed``
    (the stamped paths whose signatures differ; ``watched``: the stamped signatures); the paths
    whose signatures the stamp should take anew, or None when nothing was restored (then the
    full run decides)."""
    gone = [d for d in plan["dirs"] if not os.path.lexists(d["path"])]
    if not gone or not all(_inside(d) for d in gone):
        return None
    ours = set()
    sources = {}
    for d in gone:
        ours.add(d["path"])
        ours.update(os.path.join(d["path"], rel) for rel, _ in d["dirs"])
        for file in d["files"]:
            ours.add(os.path.join(d["path"], file[0]))
            if file[2] == "link":
                sources[file[3]] = file
    # Besides the directories, only the store files they linked may have changed: the ctime of
    # each moved when its link went (the link count is part of the inode), and so did that of
    # every other name of the same file (an upstream entry the package stage linked it from).
    # Anything else that changed is the full run's to judge.
    if not all(map(_source_intact, sources.values())):
        return None
    inodes = {tuple(f[5][:1]) for f in sources.values()}
    others = changed - ours - set(sources)
    if not all(_same_file_but_ctime(path, watched.get(path), inodes) for path in others):
        return None
    data = {}
    for name in blob_names(plan):
        if not BLOB_NAME.fullmatch(name):
            return None
        try:
            data[name] = (blobs / name).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data[name]).hexdigest() != name:
            return None
    parents = {str(Path(d["path"]).parent) for d in gone}
    pages = []
    for root in plan["roots"]:
        if root["path"] not in parents:
            continue
        if not _root_fits(root, data):
            return None
        page = os.path.join(root["path"], PAGE)
        if root["page"] and not os.path.lexists(page):
            pages.append((page, root["page"]))
    for d in gone:
        if not _write_dir(d, data):
            return None
    for page, (mode, name) in pages:
        try:
            _write_file_atomic(Path(page), data[name], mode)
        except OSError:
            return None
    return sorted(ours | set(sources) | others)


def _inside(d: dict) -> bool:
    """Every name the plan writes stays inside its directory (a stamp is data: an edited one must
    not write beside it)."""
    names = [rel for rel, _ in d["dirs"]] + [file[0] for file in d["files"]]
    return all(isinstance(rel, str) and rel and not os.path.isabs(rel)
               and not {"", ".", ".."} & set(rel.split("/")) and "\\" not in rel for rel in names)


def _same_file_but_ctime(path: str, signature, inodes: set) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (isinstance(signature, list) and len(signature) == 4 and (st.st_ino,) in inodes
            and stat.S_ISREG(st.st_mode) and [st.st_ino, st.st_size, st.st_mtime_ns] == signature[:3])


def _source_intact(file: list) -> bool:
    """The store file is the one linked when stamped (inode, size, mtime), read-only, and holds
    the manifest's digest (its ctime is not evidence: unlinking the output moved it)."""
    _, _, _, source, sha256, (inode, size, mtime_ns) = file
    try:
        st = os.lstat(source)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o222:
            return False
        if (st.st_ino, st.st_size, st.st_mtime_ns) != (inode, size, mtime_ns):
            return False
        return _sha256(source) == sha256
    except OSError:
        return False


def _other_reports(root, ours) -> bool:
    """Whether the folder holds what the comparison page would show besides ``ours``: another
    variant directory with a report (the page lists ``*/report.json``), or a hidden name (a
    concurrent run's temporary: a doubt)."""
    for name in os.listdir(root):
        if name.startswith(".") or (name not in ours and os.path.lexists(os.path.join(root, name, "report.json"))):
            return True
    return False


def _root_fits(root: dict, data: dict) -> bool:
    """The folder of the variant directories would give the stamped comparison page (no other
    variant's report in it; a page present must be the stamped page), or is gone (made again, as
    the full run makes it). Other files there (a convert's record, say) are not the page's."""
    path = root["path"]
    if not os.path.lexists(path):
        return True
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    try:
        if _other_reports(path, root["variants"]):
            return False
        if os.path.lexists(os.path.join(path, PAGE)):
            page = os.path.join(path, PAGE)
            return (root["page"] is not None and not os.path.islink(page)
                    and Path(page).read_bytes() == data[root["page"][1]])
    except OSError:
        return False
    return True


def _write_dir(d: dict, data: dict) -> bool:
    """The directory built beside its place and renamed into it: never seen half written."""
    import shutil  # (here: a no-op replay, which reads only blob_names, need not load them)
    import tempfile

    out = Path(d["path"])
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError:
        return False
    try:
        for rel, _ in d["dirs"]:
            (tmp / rel).mkdir()
        for rel, mode, kind, *origin in sorted(d["files"], key=lambda f: (Path(f[0]).name == WRITTEN_LAST, f[0])):
            if kind == "link":
                os.link(origin[0], tmp / rel)
            else:
                _write_file(tmp / rel, data[origin[0]], mode)
        for rel, mode in reversed(d["dirs"]):
            os.chmod(tmp / rel, mode)
        os.chmod(tmp, d["mode"])
        os.rename(tmp, out)  # fails if something took the place meanwhile (a concurrent run)
        return True
    except (OSError, KeyError):
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def _write_file(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
    finally:
        os.close(fd)


def _write_file_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_file(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
