"""Which remote cache a run uses: the command line, then ``EDGEBUILD_REMOTE``, then the project's
config file, then the user's.

Config files are TOML with a ``cache`` table::

    # edgebuild.toml (or pyproject.toml under [tool.edgebuild.cache]), or the user's
    # <platformdirs user_config_dir>/edgebuild/config.toml
    [cache]
    remote = "s3://team-builds/edgebuild"
    remote_required = false             # true: a remote error fails the build
    [cache.remote_options]              # handed to fsspec, e.g. an S3 API that is not AWS
    endpoint_url = "https://minio.example.com:9000"

The project file is the first ``edgebuild.toml``, or ``pyproject.toml`` with a
``[tool.edgebuild]`` table, found from the working directory upwards; its keys override the
user file's. Credentials never go in these files (they are often committed): a secret-looking
option or a URL with a password is refused, and fsspec finds credentials where each cloud's own
tools do (environment, profiles, instance roles).

A config file decides where builds (models and all) are sent, so one that someone else could
have written is ignored with a warning, as git ignores a repository another user owns: a
project file must be owned by the user and not writable by others, in a folder the user owns,
below folders that only their owners (the user or root) can change, unless sticky, as /tmp is.
Group-writable counts as writable by others unless the group is the user's own private group.
The user file is trusted when the user owns it and no one else can write it. To trust a project
file anyway, list its folder (or one above it) in ``EDGEBUILD_SAFE_DIRECTORIES`` (separated by
``os.pathsep``) or in the user file's top-level ``safe_directories = [...]``; ``*`` trusts every
folder.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from edgebuild.errors import UsageError

PROJECT_FILE = "edgebuild.toml"
USER_FILE = "config.toml"
ENV_REMOTE = "EDGEBUILD_REMOTE"
ENV_SAFE_DIRECTORIES = "EDGEBUILD_SAFE_DIRECTORIES"
SCHEMES = ("s3", "s3a", "gs", "gcs", "file", "http", "https", "memory")  # memory: one process, for experiments
READ_ONLY_SCHEMES = ("http", "https")
SECRET_OPTIONS = {"key", "secret", "password", "token", "access_key", "secret_key", "session_token",
                  "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "client_secret"}


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    options: dict = field(default_factory=dict)
    required: bool = False
    source: str = ""  # where the URL came from, for messages

    @property
    def scheme(self) -> str:
        return scheme_of(self.url)

    @property
    def read_only(self) -> bool:
        return self.scheme in READ_ONLY_SCHEMES

    @property
    def shown(self) -> str:
        return display_url(self.url)


def scheme_of(url: str) -> str:
    return urlsplit(url).scheme.lower() if "://" in url else "file"


def display_url(url: str) -> str:
    """The URL as messages may show it: no user, password or query (a signed URL's signature)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _read_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read this config file: {exc}",
                         hint="fix its TOML, or remove it") from None


def _cache_table(path: Path, data: dict, *, pyproject: bool) -> dict:
    table = data.get("tool", {}).get("edgebuild", {}) if pyproject else data
    cache = table.get("cache", {}) if isinstance(table, dict) else {}
    where = f"{path} [tool.edgebuild.cache]" if pyproject else f"{path} [cache]"
    if not isinstance(cache, dict):
        raise UsageError(f"{where}: must be a table", hint="e.g. [cache] remote = \"s3://bucket/prefix\"")
    known = {"remote", "remote_options", "remote_required"}
    unknown = sorted(set(cache) - known)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}", hint=f"known keys: {', '.join(sorted(known))}")
    if "remote" in cache and not isinstance(cache["remote"], str):
        raise UsageError(f"{where}: remote must be a URL string", hint="e.g. remote = \"s3://bucket/prefix\"")
    if not isinstance(cache.get("remote_options", {}), dict):
        raise UsageError(f"{where}: remote_options must be a table", hint="e.g. remote_options = {endpoint_url = \"...\"}")
    if not isinstance(cache.get("remote_required", False), bool):
        raise UsageError(f"{where}: remote_required must be true or false")
    _refuse_secrets(where, cache.get("remote_options", {}))
    return {**cache, "_where": where}


def _refuse_secrets(where: str, options: dict) -> None:
    for name, value in options.items():
        if name.lower() in SECRET_OPTIONS:
            raise UsageError(f"{where}: remote_options.{name}: credentials do not belong in a config file",
                             hint="give them as the cloud's own tools take them: environment variables "
                                  "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                                  "GOOGLE_APPLICATION_CREDENTIALS) or a profile")
        if isinstance(value, dict):
            _refuse_secrets(where, value)


@dataclass(frozen=True)
class ConfigFile:
    """A config file discovery found: read, or ignored and why."""

    path: Path
    kind: str  # "user" or "project"
    ignored: str = ""  # why it was not read ("" when it was)


def user_config_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("edgebuild")) / USER_FILE


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """The user's own group (named as the user, no other members): group-writable is then no wider."""
    try:
        import grp
        import pwd

        group, user = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def _others_can_write(info: os.stat_result, uid: int) -> str:
    """Who besides the owner can write (``""``: no one)."""
    if info.st_mode & stat.S_IWOTH:
        return "everyone"
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, uid):
        return f"group {info.st_gid}"
    return ""


def untrusted_reason(path: Path, *, folders: bool = True) -> str:
    """Why ``path`` may have been written by someone else (``""``: it is the user's own). With
    ``folders``, the folders that hold it count too: whoever can rename one can replace the file."""
    if not hasattr(os, "geteuid"):  # no POSIX owners (Windows): the OS's ACLs are the user's business
        return ""
    me = os.geteuid()
    info = path.stat()
    if info.st_uid != me:
        return f"it is owned by {_user_name(info.st_uid)}, not by you ({_user_name(me)})"
    writers = _others_can_write(info, me)
    if writers:
        return f"{writers} can write it"
    if not folders:
        return ""
    folder = path.parent
    for directory in (folder, *folder.parents):
        info = directory.stat()
        allowed = (me,) if directory == folder else (me, 0)
        if info.st_uid not in allowed:
            return f"its folder {directory} is owned by {_user_name(info.st_uid)}"
        writers = _others_can_write(info, me)
        if writers and not info.st_mode & stat.S_ISVTX:  # sticky: others cannot rename what is not theirs
            return f"{writers} can write its folder {directory}, so could replace it"
    return ""


def safe_directories(user: dict | None = None) -> list[str]:
    """Folders whose config files are trusted whoever owns them: ``EDGEBUILD_SAFE_DIRECTORIES``,
    then the (trusted) user file's ``safe_directories``."""
    listed = [p for p in os.environ.get(ENV_SAFE_DIRECTORIES, "").split(os.pathsep) if p.strip()]
    return listed + list((user or {}).get("_safe_directories", []))


def _declared_safe(path: Path, safe: list[str]) -> bool:
    folder = path.parent.resolve()
    for entry in safe:
        if entry.strip() == "*":
            return True
        trusted = Path(entry).expanduser().resolve()
        if folder == trusted or trusted in folder.parents:
            return True
    return False


def _project_file(start: Path | None) -> tuple[Path, bool] | None:
    """The nearest ``edgebuild.toml``, or ``pyproject.toml`` with [tool.edgebuild]: (path, is pyproject)."""
    folder = (start or Path.cwd()).resolve()
    for directory in (folder, *folder.parents):
        own = directory / PROJECT_FILE
        if own.is_file():
            return own, False
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _has_edgebuild_table(pyproject):
            return pyproject, True
    return None


def _has_edgebuild_table(pyproject: Path) -> bool:
    try:
        tool = _read_toml(pyproject).get("tool", {})
        return isinstance(tool, dict) and "edgebuild" in tool
    except UsageError:
        if untrusted_reason(pyproject):
            return False  # someone else's broken file is no reason to fail
        raise


def discover(start: Path | None = None) -> tuple[dict, dict, list[ConfigFile]]:
    """(user table, project table, every config file found, read or ignored)."""
    found: list[ConfigFile] = []
    user: dict = {}
    user_path = user_config_path()
    if user_path.is_file():
        reason = untrusted_reason(user_path, folders=False)
        if reason:
            found.append(ConfigFile(user_path, "user", reason))
        else:
            data = _read_toml(user_path)
            user = _cache_table(user_path, data, pyproject=False)
            user["_safe_directories"] = _safe_list(user_path, data)
            found.append(ConfigFile(user_path, "user"))
    project: dict = {}
    nearest = _project_file(start)
    if nearest is not None:
        path, pyproject = nearest
        reason = "" if _declared_safe(path, safe_directories(user)) else untrusted_reason(path)
        if reason:
            found.append(ConfigFile(path, "project", reason))
        else:
            project = _cache_table(path, _read_toml(path), pyproject=pyproject)
            found.append(ConfigFile(path, "project"))
    for entry in found:
        if entry.ignored:
            _warn_once(entry)
    return user, project, found


def _safe_list(path: Path, data: dict) -> list[str]:
    listed = data.get("safe_directories", [])
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise UsageError(f"{path}: safe_directories must be a list of folder paths",
                         hint='e.g. safe_directories = ["/srv/shared/project"]')
    return listed


_warned: set[Path] = set()


def _warn_once(entry: ConfigFile) -> None:
    """A warning on stderr, once per file and process, from whichever command read the config:
    an ignored file changes where builds go, so it is never silent (stdout stays for --json)."""
    if entry.path in _warned:
        return
    _warned.add(entry.path)
    sys.stderr.write(f"warning: {ignored_message(entry)}\n")


def ignored_message(entry: ConfigFile) -> str:
    how = (f"add its folder to {ENV_SAFE_DIRECTORIES} or to safe_directories in {user_config_path()}"
           if entry.kind == "project" else "make it yours and writable only by you (chown, chmod go-w)")
    return f"ignoring {entry.path}: {entry.ignored}; if you trust it, {how}"


def project_config(start: Path | None = None) -> dict:
    """The nearest project's ``cache`` table (empty if none, or if it is not trusted)."""
    return discover(start)[1]


def user_config() -> dict:
    return discover()[0]


def _check_url(url: str, where: str) -> str:
    url = url.strip()
    if not url:
        raise UsageError(f"{where}: the remote URL is empty")
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise UsageError(f"{where}: {display_url(url)}: unsupported remote scheme {scheme!r}",
                         hint="use s3:// (AWS, MinIO, R2, any S3 API), gs://, file:// (a shared mount) "
                              "or http(s):// (read-only)")
    if urlsplit(url).password:
        raise UsageError(f"{where}: {display_url(url)}: the URL holds a password",
                         hint="give credentials through the environment or a profile, not in the URL")
    if "://" not in url:  # a plain path: a shared mount
        url = "file://" + str(Path(url).expanduser().resolve())
    return url


def remote_settings(cli_url: str | None = None, *, no_remote: bool = False, required: bool | None = None,
                    start: Path | None = None) -> RemoteSettings | None:
    """The remote a command uses, or None (none configured, or ``--no-remote``)."""
    if no_remote:
        return None
    user, project, _ = discover(start)
    merged = {**user, **project}
    options = {**user.get("remote_options", {}), **project.get("remote_options", {})}
    if cli_url:
        url, where = cli_url, "--remote"
    elif os.environ.get(ENV_REMOTE):
        url, where = os.environ[ENV_REMOTE], ENV_REMOTE
    elif merged.get("remote"):
        url, where = merged["remote"], (project if "remote" in project else user)["_where"]
    else:
        if required:
            raise UsageError("--remote-required, but no remote cache is configured",
                             hint="give --remote URL, set EDGEBUILD_REMOTE, or cache.remote in edgebuild.toml")
        return None
    url = _check_url(url, where)
    if merged.get("remote") and scheme_of(_check_url(merged["remote"], merged["_where"])) != scheme_of(url):
        options = {}  # the configured options belong to another kind of remote
    return RemoteSettings(url=url, options=options, source=where,
                          required=bool(merged.get("remote_required", False)) if required is None else required)
