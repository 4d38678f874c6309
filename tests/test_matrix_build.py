"""Matrix builds through the CLI.

The default run builds the test plugin's copy backend as a 2 x 2 matrix in this process. Under
``-m slow`` (about 30 s): a real matrix build, text-direction classifier (recipes/ppocr_cls.yaml,
its pinned rapidocr wheel) built as precision x chips, 2 x 2 variants, in one ``edgebuild run``.

The four share resolve, import and optimize (one store entry each, built once); each writes its
own artifact and report; the run ends with a table naming every variant and one page linking
every variant's report. A second command over two output folders (every stage cached) writes the
combined page in the folder they share, and ``--report FILE`` where asked."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from edgebuild_testplugin.cli_runner import edgebuild

SHIPPED = Path(__file__).resolve().parents[1] / "recipes" / "ppocr_cls.yaml"
SHARED = ("resolve", "import", "optimize")
NAMES = {"fp16-m1", "fp16-m3", "fp32-m1", "fp32-m3"}


def recipe(folder: Path, name: str, outputs: str, matrix: str) -> Path:
    """The shipped recipe with its own variants replaced by ``matrix``; fp16-friendly limits for
    both precisions, few samples, no fp16 guard (its sampling is what makes a lower slow)."""
    path = folder / name
    path.write_text(
        f"extends: {json.dumps(str(SHIPPED))}\n"
        "variants: null\n"
        "compute: {fp16_guard: false}\n"
        "validate: {samples: 2, thresholds: {cosine_min: 0.999, max_rel_max: null}}\n"
        f"matrix: {matrix}\n"
        f"outputs: {{dir: {outputs}}}\n")
    return path


def test_a_matrix_of_the_copy_backend_builds_each_combination_once(project, cli):
    """precision x chips on the copy backend, whose lower reads only the precision."""
    path = project("matrix: {chips: [m1, m3], precision: [float16, float32]}\nvalidate: {samples: 2}")
    code, out, err = cli("run", path, "--json")
    assert code == 0, err
    variants = {v["variant"]: {s["name"]: s for s in v["stages"]} for v in json.loads(out)["variants"]}
    assert set(variants) == NAMES
    for shared in SHARED:
        assert len({stages[shared]["key"] for stages in variants.values()}) == 1
    assert len({stages["lower"]["key"] for stages in variants.values()}) == 2  # one per precision
    assert sum(stages["lower"]["status"] == "ran" for stages in variants.values()) == 2
    table = [line for line in err.splitlines() if line.startswith("tiny:") and re.search(r" \d+/\d+$", line)]
    assert sorted(line.split()[0] for line in table) == sorted(f"tiny:{n}" for n in NAMES)
    assert all(line.split()[1:4] == ["built,", "not", "validated"] for line in table)
    html = (path.parent / "out" / "index.html").read_text()
    assert all(f'href="./{n}/report.html"' in html for n in NAMES)
    # the same, once more: every stage cached, the table says so
    code, out, err = cli("run", path, "--matrix", "chips=m3")
    assert code == 0, err
    assert [line.split()[-1] for line in err.splitlines() if line.startswith("tiny:fp")][-2:] == ["5/0", "5/0"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The 2 x 2 build: (work folder, cache, run --json, stderr)."""
    work = tmp_path_factory.mktemp("matrix")
    cache = work / "cache"
    path = recipe(work, "ppocr.yaml", "out", "{chips: [m1, m3], precision: [float16, float32]}")
    done = edgebuild("run", path, "--json", "--cache-dir", cache, cwd=work, env={"PYTHONWARNINGS": "ignore"}, check=0)
    return work, cache, json.loads(done.stdout), done.stderr


@pytest.mark.slow
def test_a_two_by_two_matrix_builds_four_variants_sharing_import_and_optimize(built):
    _, _, run, _ = built
    variants = run["variants"]
    assert {v["variant"] for v in variants} == NAMES
    assert all(v["status"] == "built" and v["recipe"] == "ppocr_cls" for v in variants)
    stages = {v["variant"]: {s["name"]: s for s in v["stages"]} for v in variants}
    for shared in SHARED:
        assert len({s[shared]["key"] for s in stages.values()}) == 1, shared
        assert sum(s[shared]["status"] == "ran" for s in stages.values()) <= 1, shared  # built once, then cached
    # lower reads precision and the chip (its compute plan): one entry per variant
    assert len({s["lower"]["key"] for s in stages.values()}) == 4
    sizes = {v["variant"]: next(iter(v["artifact_sizes"].values())) for v in variants}
    assert sizes["fp16-m1"] < sizes["fp32-m1"]  # half the weight bytes, near enough


@pytest.mark.slow
def test_the_run_ends_with_a_row_per_variant(built):
    stderr = built[3]
    header = next(i for i, line in enumerate(stderr.splitlines()) if line.split()[:2] == ["variant", "status"])
    table = stderr.splitlines()[header + 1:header + 5]
    assert sorted(line.split()[0] for line in table) == sorted(f"ppocr_cls:{n}" for n in NAMES)
    for line in table:
        assert line.split()[1:3] == ["validation", "passed"]
        assert "1 − cosine" in line and "(limit 0.001)" in line
        assert re.search(r"\d+/\d+$", line)


@pytest.mark.slow
def test_one_page_links_every_variant_report(built):
    work, _, run, _ = built
    page = work / "out" / "index.html"
    html = page.read_text()
    for variant in run["variants"]:
        link = Path(variant["report"]).relative_to(page.parent).as_posix()
        assert f'href="./{link}"' in html
        assert Path(variant["comparison"]) == page


@pytest.mark.slow
def test_a_command_over_two_output_folders_writes_one_page_where_they_meet(built, tmp_path):
    work, cache, _, _ = built
    first = recipe(work, "a.yaml", "sets/a", "{precision: [float16, float32]}")
    second = recipe(work, "b.yaml", "sets/b", "{chips: [m1, m3], precision: [float16]}")
    done = edgebuild("run", first, second, "--matrix", "chips=m3", "--json", "--cache-dir", cache, cwd=work,
                     env={"PYTHONWARNINGS": "ignore"}, check=0)
    variants = json.loads(done.stdout)["variants"]
    assert sorted(v["variant"] for v in variants) == ["fp16-m3", "fp16-m3", "fp32-m3"]
    assert all(s["status"] == "cached" for v in variants for s in v["stages"] if s["name"] != "resolve")
    page = work / "sets" / "index.html"
    html = page.read_text()
    for link in ("./a/fp16-m3/report.html", "./a/fp32-m3/report.html", "./b/fp16-m3/report.html"):
        assert f'href="{link}"' in html
    assert "combined report: sets/index.html" in done.stderr
    # --report puts it elsewhere, links relative to it
    elsewhere = tmp_path / "matrix.html"
    edgebuild("run", first, "--matrix", "chips=m3", "--report", elsewhere, "--cache-dir", cache, cwd=work,
              check=0)
    for variant in ("fp16-m3", "fp32-m3"):
        link = os.path.relpath(work / "sets" / "a" / variant / "report.html", elsewhere.parent)
        assert f'href="{Path(link).as_posix()}"' in elsewhere.read_text()  # it climbs: starts with ..


def test_a_repeat_answered_without_building_shows_the_table_again(project, cli):
    path = project("matrix: {precision: [float16, float32]}")
    first = cli("run", path)
    again = cli("run", path)
    assert first[0] == again[0] == 0
    rows = [line for line in again[2].splitlines() if line.startswith("tiny:fp") and line.endswith("/0")]
    assert [row.split()[0] for row in rows] == ["tiny:fp16", "tiny:fp32"]


def test_on_a_terminal_the_table_is_drawn_with_rich():
    import io

    from rich.console import Console

    from edgebuild.build.summary import print_summary
    from edgebuild.report.console import LivePrinter

    out = io.StringIO()
    display = LivePrinter(console=Console(file=out, force_terminal=True, width=140))
    records = [{"recipe": "r", "variant": name, "status": "built", "artifact_sizes": {"a": 1000},
                "stages": [{"status": "ran", "seconds": 1.5}], "validation": {}} for name in ("fp16", "fp32")]
    print_summary(display, records)
    text = out.getvalue()
    assert "r:fp16" in text and "r:fp32" in text and "cached/ran" in text
    assert "┃" in text or "│" in text  # a drawn table, not plain columns
