"""``edgebuild config``: which config files were read and which ignored (and why), and where the
remote cache and the local store a command would use come from (option, environment, file,
default). Read-only: it creates nothing, not even the store's directory.

Imported by the CLI at start-up: keep it light.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer


def remote_origin(cli_url: str | None = None, start: Path | None = None) -> dict:
    """The remote a command would use, and where it came from: ``{"url": None}`` when none is set."""
    from edgebuild.store.config import remote_settings

    settings = remote_settings(cli_url, start=start)
    if settings is None:
        return {"url": None, "from": "none configured", "required": False}
    return {"url": settings.shown, "from": settings.source, "required": settings.required}


def remote_line(remote: dict) -> str:
    if remote["url"] is None:
        return "remote: none configured"
    return f"remote: {remote['url']} (from {remote['from']}{', required' if remote['required'] else ''})"


def cache_origin(cache_dir: Path | None) -> dict:
    from edgebuild.store.location import cache_root

    source = "--cache-dir" if cache_dir else "EDGEBUILD_CACHE_DIR" if os.environ.get("EDGEBUILD_CACHE_DIR") else "default"
    root = cache_root(cache_dir)
    return {"path": str(root), "from": source, "exists": root.is_dir()}


def describe(cli_url: str | None = None, cache_dir: Path | None = None, start: Path | None = None) -> dict:
    from edgebuild.store.config import ENV_SAFE_DIRECTORIES, discover, safe_directories, user_config_path

    user, _, found = discover(start)
    return {
        "files": [{"path": str(f.path), "kind": f.kind, "read": not f.ignored, "ignored_because": f.ignored or None}
                  for f in found],
        "user_config": str(user_config_path()),
        "safe_directories": safe_directories(user),
        "safe_directories_env": ENV_SAFE_DIRECTORIES,
        "remote": remote_origin(cli_url, start),
        "cache_dir": cache_origin(cache_dir),
    }


def _print(data: dict) -> None:
    lines = ["config files:"]
    for entry in data["files"]:
        state = "read" if entry["read"] else f"ignored: {entry['ignored_because']}"
        lines.append(f"  {entry['kind']:<8} {entry['path']} ({state})")
    if not data["files"]:
        lines.append(f"  none (user file: {data['user_config']}; project file: edgebuild.toml, or pyproject.toml "
                     "with [tool.edgebuild], from here upwards)")
    if data["safe_directories"]:
        lines.append(f"safe directories: {os.pathsep.join(data['safe_directories'])}")
    remote = data["remote"]
    lines.append(remote_line(remote))
    cache = data["cache_dir"]
    lines.append(f"cache dir: {cache['path']} (from {cache['from']}"
                 + ("" if cache["exists"] else "; not created yet") + ")")
    sys.stdout.write("\n".join(lines) + "\n")


def add_config_command(app: typer.Typer) -> None:
    @app.command("config")
    def config_cmd(
        remote: Optional[str] = typer.Option(None, "--remote", help="as `run --remote` would take it"),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """Which config files are read or ignored (and why); the remote cache and store in use, and where each comes from."""
        data = describe(remote, cache_dir)
        if as_json:
            sys.stdout.write(json.dumps(data) + "\n")
        else:
            _print(data)
