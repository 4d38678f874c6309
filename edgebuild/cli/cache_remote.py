"""``edgebuild cache push|pull|status``: the local store against its remote cache, and the
``run`` options that choose the remote (``--remote URL``, ``--no-remote``, ``--remote-required``).

Imported by the CLI at start-up: heavy modules (fsspec, s3fs) only inside the commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

REMOTE_HELP = "remote cache URL (default: EDGEBUILD_REMOTE, else cache.remote in edgebuild.toml or the user config)"


def run_remote(url: str | None, *, no_remote: bool, required: bool):
    """The remote settings of ``edgebuild run`` (None: no remote)."""
    from edgebuild.errors import UsageError
    from edgebuild.store.config import remote_settings

    if no_remote and (url or required):
        raise UsageError("--no-remote contradicts " + ("--remote" if url else "--remote-required"), hint="give one")
    return remote_settings(url, no_remote=no_remote, required=True if required else None)


def checked_keys(command: str, keys: list[str] | None, locks: list[Path] | None = None) -> list[str]:
    """The keys a command was given, each checked to be a stage key before anything is opened
    (a key becomes a path in the store), then those the ``--lock`` files name."""
    from edgebuild.store.lockfile import lock_keys
    from edgebuild.store.local import check_key

    wanted = [check_key(key, f"cache {command}: ") for key in keys or []]
    for lock in locks or []:
        wanted += [key for key in lock_keys(lock) if key not in wanted]
    return wanted


LOCK_HELP = "also the stage keys this edgebuild.lock.json names (repeatable; resolve is left out)"


def _open(url: str | None, cache_dir: Path | None, *, create: bool = False):
    from edgebuild.errors import UsageError
    from edgebuild.store.config import remote_settings
    from edgebuild.store.location import open_store
    from edgebuild.store.remote import RemoteStore

    settings = remote_settings(url)
    if settings is None:
        raise UsageError("no remote cache is configured",
                         hint="give --remote URL, set EDGEBUILD_REMOTE, or cache.remote in edgebuild.toml")
    store = open_store(cache_dir, create=create)
    return store, RemoteStore(settings, store)


def _listed(shared):
    """The remote's listing; names in it that are not stage keys are skipped with a warning."""
    complete, incomplete = shared.listing()
    for name in shared.skipped:
        typer.echo(f"warning: remote {shared.settings.shown}: skipped {name}: not a stage key", err=True)
    return complete, incomplete


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def add_remote_commands(cache_app: typer.Typer) -> None:
    @cache_app.command("status")
    def cache_status(
        remote: Optional[str] = typer.Option(None, "--remote", help=REMOTE_HELP),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """The remote cache against the local store: entries only here (push), only there (pull), and
        uploads that never finished (invisible until the next push completes them)."""
        from edgebuild.store.remote import RemoteError

        store, shared = _open(remote, cache_dir)
        local = {e.key for e in store.entries()}
        try:
            complete, incomplete = _listed(shared)
        except RemoteError as exc:
            if exc.kind != "unsupported":
                raise
            complete, incomplete = {k for k in local if shared.has(k)}, set()  # http: no listing
            listed = False
        else:
            listed = True
        data = {"remote": shared.settings.shown, "read_only": shared.settings.read_only, "listed": listed,
                "local": len(local), "remote_entries": len(complete) if listed else None,
                "both": len(local & complete), "to_push": sorted(local - complete),
                "to_pull": sorted(complete - local), "incomplete": sorted(incomplete)}
        if as_json:
            sys.stdout.write(json.dumps(data) + "\n")
            return
        typer.echo(f"{data['remote']}{' (read-only)' if data['read_only'] else ''}")
        typer.echo(f"{data['local']} local entries; "
                   + (f"{data['remote_entries']} remote entries; " if listed else "")
                   + f"{data['both']} in both")
        typer.echo(f"{len(data['to_push'])} only local (`edgebuild cache push` uploads them)")
        if listed:
            typer.echo(f"{len(data['to_pull'])} only remote (`edgebuild cache pull` fetches them)")
        if incomplete:
            typer.echo(f"{len(incomplete)} unfinished uploads, invisible to readers "
                       "(`edgebuild cache push` from the machine that has them completes them)")

    @cache_app.command("push")
    def cache_push(
        keys: Optional[List[str]] = typer.Argument(None, help="entry keys (default: every local entry)"),
        locks: Optional[List[Path]] = typer.Option(None, "--lock", help=LOCK_HELP),
        remote: Optional[str] = typer.Option(None, "--remote", help=REMOTE_HELP),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """Upload local entries the remote lacks (and complete interrupted uploads); manifests last."""
        given = checked_keys("push", keys, locks)
        store, shared = _open(remote, cache_dir)
        wanted = given if keys or locks else [e.key for e in store.entries()]
        pushed = sum(shared.push(key) for key in wanted)
        data = {"remote": shared.settings.shown, "pushed": pushed, "already": len(wanted) - pushed,
                "files": shared.moved.files, "bytes": shared.moved.bytes}
        if as_json:
            sys.stdout.write(json.dumps(data) + "\n")
            return
        typer.echo(f"pushed {pushed} entries ({_mb(data['bytes'])}) to {data['remote']}; "
                   f"{data['already']} were there already")

    @cache_app.command("pull")
    def cache_pull(
        keys: Optional[List[str]] = typer.Argument(None, help="entry keys (default: every remote entry)"),
        locks: Optional[List[Path]] = typer.Option(None, "--lock", help=LOCK_HELP),
        remote: Optional[str] = typer.Option(None, "--remote", help=REMOTE_HELP),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """Fetch remote entries the local store lacks; each is digest-checked before it is installed."""
        from edgebuild.store.remote import RemoteCorrupt

        given = checked_keys("pull", keys, locks)
        store, shared = _open(remote, cache_dir, create=True)
        local = {e.key for e in store.entries()}
        wanted = given if keys or locks else sorted(_listed(shared)[0] - local)
        pulled, corrupt, missing = 0, [], []
        for key in wanted:
            try:
                if key in local or shared.pull(key):
                    pulled += key not in local
                else:
                    missing.append(key)
            except RemoteCorrupt as exc:
                corrupt.append(key)
                typer.echo(f"warning: {exc}", err=True)
        data = {"remote": shared.settings.shown, "pulled": pulled, "files": shared.moved.files,
                "bytes": shared.moved.bytes, "corrupt": corrupt, "missing": missing}
        if as_json:
            sys.stdout.write(json.dumps(data) + "\n")
        else:
            typer.echo(f"pulled {pulled} entries ({_mb(data['bytes'])}) from {data['remote']}"
                       + (f"; {len(corrupt)} corrupt, not installed" if corrupt else "")
                       + (f"; {len(missing)} not on the remote" if missing else ""))
        if corrupt:
            raise typer.Exit(1)
