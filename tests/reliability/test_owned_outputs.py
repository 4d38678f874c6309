"""Outputs are owned, pages too: ``index.html`` is written only over a page edgebuild wrote, by
``run`` and by ``report``; ``outputs.dir`` is taken as written (``~`` and ``$VARS`` refused);
every link in a page is a relative, quoted path, whatever the folder names."""

from __future__ import annotations

import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from edgebuild_testplugin.cli_runner import assert_usage_error, log_lines

USERS_PAGE = "<html><body>my own index</body></html>\n"


def test_run_never_replaces_a_users_index_html(project, cli, tmp_path):
    project()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "index.html").write_text(USERS_PAGE)
    code, _, err = cli("run", "recipe.yaml")
    assert_usage_error(code, err, "out/index.html", "edgebuild did not write it", "hint:")
    assert (tmp_path / "out" / "index.html").read_text() == USERS_PAGE
    assert log_lines(tmp_path / "log.txt") == []  # refused before any build work


def test_run_replaces_its_own_index_html(project, cli, tmp_path):
    project()
    assert cli("run", "recipe.yaml")[0] == 0
    page = tmp_path / "out" / "index.html"
    first = page.read_text()
    assert cli("run", "recipe.yaml", "--force")[0] == 0
    assert page.read_text() == first and "edgebuild" in first


def test_an_index_html_symlink_is_not_written_through(project, cli, tmp_path):
    project()
    (tmp_path / "victim.html").write_text(USERS_PAGE)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "index.html").symlink_to(tmp_path / "victim.html")
    code, _, err = cli("run", "recipe.yaml")
    assert_usage_error(code, err, "index.html", "symlink")
    assert (tmp_path / "victim.html").read_text() == USERS_PAGE


def test_report_never_replaces_a_users_index_html(project, cli, tmp_path):
    project()
    assert cli("run", "recipe.yaml")[0] == 0
    folder = tmp_path / "site"
    shutil.copytree(tmp_path / "out" / "default", folder / "default")
    (folder / "index.html").write_text(USERS_PAGE)
    code, _, err = cli("report", folder)
    assert_usage_error(code, err, "site/index.html", "edgebuild did not write it")
    assert (folder / "index.html").read_text() == USERS_PAGE


@pytest.mark.parametrize("folder", ["~", "~/models", "~root/x", "$HOME/x", "${HOME}/x", "build/$USER"])
def test_outputs_dir_is_taken_as_written(project, cli, tmp_path, folder):
    recipe = project()
    recipe.write_text(recipe.read_text().replace("outputs: {dir: out}", f"outputs: {{dir: {folder!r}}}"))
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, "recipe.yaml:", "outputs.dir", "does not expand")
    assert cli("run", "recipe.yaml")[0] == 2
    assert log_lines(tmp_path / "log.txt") == []


# -- links ---------------------------------------------------------------------------------

class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        self.hrefs += [value for name, value in attrs if name == "href"]


def hrefs(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.hrefs


HOSTILE_FOLDERS = ["javascript:alert(document.domain)", "data:text,html", "@evil.example:80", "a b#frag",
                   "q?x=1", "%2e%2e", "http:x", "\"><script>x", "über"]


def test_every_link_is_a_quoted_relative_path_to_its_folder(project, cli, tmp_path):
    project()
    assert cli("run", "recipe.yaml")[0] == 0
    site = tmp_path / "site"
    made = [site / name for name in HOSTILE_FOLDERS]
    for folder in made:
        shutil.copytree(tmp_path / "out" / "default", folder)
    code, _, err = cli("report", site)
    assert code == 0, err
    page = site / "index.html"
    links = hrefs(page)
    base = page.as_uri()
    resolved = set()
    for href in links:
        parts = urlsplit(href)
        assert parts.scheme == "" and parts.netloc == "" and not parts.query and not parts.fragment, href
        assert href.startswith(("./", "../")), href
        resolved.add(Path(unquote(urlsplit(urljoin(base, href)).path)))
    assert {folder / "report.html" for folder in made} <= resolved
    variant_page = made[0] / "report.html"
    for href in hrefs(variant_page):
        assert urlsplit(href).scheme == "" and href.startswith(("./", "../")), href
