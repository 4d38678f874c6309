"""Config discovery trusts only files the user could have written alone (git's safe.directory):
a project file owned by someone else, or that others can write or replace, is ignored with a
warning naming it, why, and how to trust it; `edgebuild config` says what was read and ignored
and where the remote and the store come from.

Ownership is made real: the tests run as root, which can chown a file to another uid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgebuild.store import config

OTHER_UID = 4242  # no such user: a file "someone else" wrote
OTHER_GID = 54321
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="giving a file to another user needs root")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user config folder, and a project folder ``project/`` (0755, ours) to work in."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("EDGEBUILD_REMOTE", config.ENV_SAFE_DIRECTORIES, "EDGEBUILD_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "_warned", set())
    os.chmod(tmp_path, 0o755)
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.chdir(project / "sub")
    return tmp_path


def planted(folder: Path, remote: str = "file:///srv/elsewhere", name: str = "edgebuild.toml") -> Path:
    path = folder / name
    table = "[tool.edgebuild.cache]" if name == "pyproject.toml" else "[cache]"
    path.write_text(f'{table}\nremote = "{remote}"\n')
    os.chmod(path, 0o644)
    return path


def user_file(home: Path, text: str) -> Path:
    path = home / "config" / "edgebuild" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


def test_own_project_file_is_read(home):
    path = planted(home / "project")
    settings = config.remote_settings()
    assert settings.url == "file:///srv/elsewhere" and str(path) in settings.source


@needs_root
def test_a_file_owned_by_another_user_is_ignored_with_a_warning(home, capsys):
    path = planted(home / "project")
    os.chown(path, OTHER_UID, -1)
    assert config.remote_settings() is None
    err = capsys.readouterr().err
    assert f"warning: ignoring {path}: it is owned by uid {OTHER_UID}" in err, err
    assert config.ENV_SAFE_DIRECTORIES in err and "safe_directories" in err


@needs_root
def test_a_planted_file_in_a_sticky_shared_folder_is_ignored(home, monkeypatch, capsys):
    """/tmp's case: world-writable and sticky; another user's edgebuild.toml there redirects nothing."""
    shared = home / "shared"
    (shared / "work").mkdir(parents=True)
    os.chmod(shared, 0o1777)
    path = planted(shared)
    os.chown(path, OTHER_UID, -1)
    monkeypatch.chdir(shared / "work")
    assert config.remote_settings() is None
    assert f"ignoring {path}" in capsys.readouterr().err


def test_own_file_in_a_sticky_folder_of_ours_is_read(home, monkeypatch):
    """Sticky: others can add files beside it but not replace or rename ours."""
    shared = home / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    planted(shared)
    monkeypatch.chdir(shared)
    assert config.remote_settings().url == "file:///srv/elsewhere"


@needs_root
def test_own_file_in_a_folder_another_user_owns_is_ignored(home, monkeypatch, capsys):
    """As git: a folder someone else owns is their project, whoever owns the file."""
    theirs = home / "theirs"
    theirs.mkdir()
    path = planted(theirs)
    os.chown(theirs, OTHER_UID, -1)
    monkeypatch.chdir(theirs)
    assert config.remote_settings() is None
    assert f"its folder {theirs} is owned by uid {OTHER_UID}" in capsys.readouterr().err


def test_a_world_writable_file_is_ignored(home, capsys):
    path = planted(home / "project")
    os.chmod(path, 0o666)
    assert config.remote_settings() is None
    assert f"ignoring {path}: everyone can write it" in capsys.readouterr().err


@needs_root
def test_a_group_writable_folder_in_the_path_is_ignored(home, capsys):
    """The folder above the project: whoever can write it can swap the project folder for theirs."""
    path = planted(home / "project")
    os.chown(home, -1, OTHER_GID)
    os.chmod(home, 0o775)
    assert config.remote_settings() is None
    assert f"group {OTHER_GID} can write its folder {home}, so could replace it" in capsys.readouterr().err


def test_a_world_writable_folder_that_is_not_sticky_is_ignored(home, capsys):
    path = planted(home / "project")
    os.chmod(home / "project", 0o777)
    assert config.remote_settings() is None
    err = capsys.readouterr().err
    assert f"ignoring {path}: everyone can write its folder {home / 'project'}" in err, err


@needs_root
def test_safe_directories_from_the_environment_are_honoured(home, monkeypatch, capsys):
    path = planted(home / "project")
    os.chown(path, OTHER_UID, -1)
    monkeypatch.setenv(config.ENV_SAFE_DIRECTORIES, os.pathsep.join(["/nowhere", str(home)]))
    assert config.remote_settings().url == "file:///srv/elsewhere"
    assert "warning" not in capsys.readouterr().err


@needs_root
def test_safe_directories_from_the_user_file_are_honoured(home):
    path = planted(home / "project", name="pyproject.toml")
    os.chown(path, OTHER_UID, -1)
    user_file(home, f'safe_directories = ["{home / "project"}"]\n')
    assert config.remote_settings().url == "file:///srv/elsewhere"


@needs_root
def test_star_trusts_every_folder(home, monkeypatch):
    os.chown(planted(home / "project"), OTHER_UID, -1)
    monkeypatch.setenv(config.ENV_SAFE_DIRECTORIES, "*")
    assert config.remote_settings() is not None


@needs_root
def test_a_project_file_cannot_vouch_for_itself(home):
    path = home / "project" / "edgebuild.toml"
    path.write_text(f'safe_directories = ["{home}"]\n[cache]\nremote = "file:///srv/elsewhere"\n')
    os.chown(path, OTHER_UID, -1)
    assert config.remote_settings() is None


@needs_root
def test_a_user_file_owned_by_another_is_ignored_and_its_safe_list_too(home, capsys):
    os.chown(planted(home / "project"), OTHER_UID, -1)
    path = user_file(home, f'safe_directories = ["{home}"]\n[cache]\nremote = "file:///srv/user"\n')
    os.chown(path, OTHER_UID, -1)
    assert config.remote_settings() is None
    err = capsys.readouterr().err
    assert f"ignoring {path}: it is owned by uid {OTHER_UID}" in err and "chmod go-w" in err


@needs_root
def test_someone_elses_broken_pyproject_does_not_fail_the_command(home):
    path = home / "project" / "pyproject.toml"
    path.write_text("[tool.edgebuild\nnot toml")
    os.chown(path, OTHER_UID, -1)
    assert config.remote_settings() is None


def test_own_broken_pyproject_is_still_an_error(home):
    from edgebuild.errors import UsageError

    (home / "project" / "pyproject.toml").write_text("[tool.edgebuild\nnot toml")
    with pytest.raises(UsageError, match="cannot read this config file"):
        config.remote_settings()


@needs_root
def test_config_command_lists_read_and_ignored_files_and_where_values_come_from(home, cli):
    user = user_file(home, '[cache]\nremote = "file:///srv/user"\n')
    project = planted(home / "project")
    os.chown(project, OTHER_UID, -1)
    code, out, err = cli("config")
    assert code == 0, err
    assert f"user     {user} (read)" in out, out
    assert f"project  {project} (ignored: it is owned by uid {OTHER_UID}" in out, out
    assert f"remote: file:///srv/user (from {user} [cache])" in out, out
    assert "cache dir:" in out and "(from default" in out, out
    assert f"ignoring {project}" in err  # the warning every command prints


def test_config_json_names_the_sources_and_creates_nothing(home, cli, monkeypatch):
    planted(home / "project")
    store = home / "missing" / "store"
    monkeypatch.setenv("EDGEBUILD_REMOTE", "file:///srv/from-env")
    code, out, err = cli("config", "--json", "--cache-dir", store)
    assert code == 0, err
    data = json.loads(out)
    assert data["files"] == [{"path": str(home / "project" / "edgebuild.toml"), "kind": "project", "read": True,
                              "ignored_because": None}]
    assert data["remote"] == {"url": "file:///srv/from-env", "from": "EDGEBUILD_REMOTE", "required": False}
    assert data["cache_dir"] == {"path": str(store), "from": "--cache-dir", "exists": False}
    assert not (home / "missing").exists()


def test_config_with_no_files(home, cli):
    code, out, err = cli("config")
    assert code == 0, err
    assert "config files:\n  none" in out and "remote: none configured" in out


def test_cache_info_names_the_remote_in_use(home, cli):
    project = planted(home / "project")
    code, out, err = cli("cache", "info", "--cache-dir", home / "store")
    assert code == 0, err
    assert f"remote: file:///srv/elsewhere (from {project} [cache])" in out, out
    code, out, err = cli("cache", "info", "--json", "--cache-dir", home / "store")
    assert json.loads(out)["remote"]["url"] == "file:///srv/elsewhere"
    assert not (home / "store").exists()
