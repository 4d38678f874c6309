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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from edgebuild.errors import UsageError

PROJECT_FILE = "edgebuild.toml"
USER_FILE = "config.toml"
ENV_REMOTE = "EDGEBUILD_REMOTE"
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


def project_config(start: Path | None = None) -> dict:
    """The nearest project's ``cache`` table (empty if none)."""
    folder = (start or Path.cwd()).resolve()
    for directory in (folder, *folder.parents):
        own = directory / PROJECT_FILE
        if own.is_file():
            return _cache_table(own, _read_toml(own), pyproject=False)
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            data = _read_toml(pyproject)
            if "edgebuild" in data.get("tool", {}):
                return _cache_table(pyproject, data, pyproject=True)
    return {}


def user_config() -> dict:
    import platformdirs

    path = Path(platformdirs.user_config_dir("edgebuild")) / USER_FILE
    return _cache_table(path, _read_toml(path), pyproject=False) if path.is_file() else {}


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
    user, project = user_config(), project_config(start)
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
