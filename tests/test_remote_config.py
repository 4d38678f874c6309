"""Where the remote cache's URL and options come from, and what a config file may not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.errors import UsageError
from edgebuild.store.config import display_url, remote_settings


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty project directory and user config directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("EDGEBUILD_REMOTE", raising=False)
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.chdir(project / "sub")
    return tmp_path


def user_file(home: Path, text: str) -> None:
    path = home / "config" / "edgebuild" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_no_remote_configured_is_none(home):
    assert remote_settings() is None


def test_project_file_found_upwards_overrides_user_file(home):
    user_file(home, '[cache]\nremote = "s3://user-bucket/x"\nremote_required = true\n'
                    '[cache.remote_options]\nendpoint_url = "http://user:9000"\n')
    assert remote_settings().url == "s3://user-bucket/x" and remote_settings().required
    (home / "project" / "edgebuild.toml").write_text('[cache]\nremote = "s3://team/cache"\n'
                                                     '[cache.remote_options]\nendpoint_url = "http://minio:9000"\n')
    settings = remote_settings()
    assert (settings.url, settings.options, settings.required) == ("s3://team/cache", {"endpoint_url": "http://minio:9000"}, True)
    assert "edgebuild.toml" in settings.source


def test_pyproject_tool_table(home):
    (home / "project" / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.edgebuild.cache]\nremote = "gs://b/p"\n')
    assert remote_settings().url == "gs://b/p"


def test_command_line_then_environment_then_files(home, monkeypatch):
    (home / "project" / "edgebuild.toml").write_text('[cache]\nremote = "s3://team/cache"\n')
    monkeypatch.setenv("EDGEBUILD_REMOTE", "s3://env/cache")
    assert remote_settings().url == "s3://env/cache"
    assert remote_settings("s3://cli/cache").url == "s3://cli/cache"
    assert remote_settings("s3://cli/cache", no_remote=True) is None
    assert remote_settings(required=True).required


def test_plain_path_is_a_file_remote(home):
    assert remote_settings(str(home / "shared")).url == f"file://{home / 'shared'}"


def test_options_of_another_scheme_are_not_applied(home):
    (home / "project" / "edgebuild.toml").write_text('[cache]\nremote = "s3://team/cache"\n'
                                                     '[cache.remote_options]\nendpoint_url = "http://minio:9000"\n')
    assert remote_settings("gs://other/cache").options == {}


@pytest.mark.parametrize("text, phrase", [
    ('[cache]\nremote = "s3://b"\n[cache.remote_options]\nsecret = "abc"\n', "credentials do not belong"),
    ('[cache]\nremote = "s3://b"\n[cache.remote_options.client_kwargs]\naws_secret_access_key = "abc"\n',
     "credentials do not belong"),
    ('[cache]\nremote = "ftp://host/x"\n', "unsupported remote scheme 'ftp'"),
    ('[cache]\nremote = "https://me:hunter2@host/x"\n', "holds a password"),
    ('[cache]\nremotes = "s3://b"\n', "unknown key 'remotes'"),
    ('[cache]\nremote = 3\n', "remote must be a URL"),
    ('[cache\n', "cannot read this config file"),
])
def test_bad_config_is_a_usage_error_naming_the_file(home, text, phrase):
    (home / "project" / "edgebuild.toml").write_text(text)
    with pytest.raises(UsageError) as raised:
        remote_settings()
    assert phrase in str(raised.value) and "edgebuild.toml" in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_display_url_drops_credentials_and_query():
    assert display_url("https://me:pw@cdn.example.com:8443/cache?X-Amz-Signature=abc") == "https://cdn.example.com:8443/cache"
    assert display_url("s3://bucket/prefix") == "s3://bucket/prefix"


def test_contradicting_flags(cli, home):
    from edgebuild_testplugin.cli_runner import assert_usage_error

    (home / "project" / "r.yaml").write_text("edgebuild: 1\n")
    code, _, err = cli("run", "../r.yaml", "--no-remote", "--remote", "s3://b/x")
    assert_usage_error(code, err, "--no-remote contradicts --remote")
    code, _, err = cli("run", "../r.yaml", "--remote-required")
    assert_usage_error(code, err, "no remote cache is configured")
